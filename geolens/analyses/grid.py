"""The grid engine: analyses as jobs on one model after another, each given the options meant for it.

:func:`~geolens.over_checkpoints` (in memory) and the cells of a study (:mod:`geolens.study.cells`,
written to disk, in this process or on Ray) both run on it:

* :func:`resolve_jobs` turns analysis names (looked up in a table ``name -> (function, takes_tokens)``)
  and callables into :class:`Job` records;
* :func:`route_options` gives each job the options meant for it: its own table, and the shared
  options (``n_tokens``, ``seed``, ... checked once here) its signature takes;
* :func:`run_jobs` runs the jobs on one model, catching each job's failure so the others still run;
* :func:`free_memory` runs between models, so one model is alive at a time.

Example:
    >>> from geolens.analyses.spectrum import spectrum, weight_geometry
    >>> table = {"spectrum": (spectrum, True), "weights": (weight_geometry, False)}   # name -> (function, reads tokens)
    >>> jobs = resolve_jobs(["spectrum", "weights"], table)
    >>> own = {"spectrum": {"alpha_fit_range": (1, 10)}, "weights": {"alpha_fit_range": (1, 10)}}
    >>> options = route_options(jobs, own, {"n_tokens": 16, "seed": 1})
    >>> options["spectrum"]
    {'n_tokens': 16, 'seed': 1, 'alpha_fit_range': (1, 10)}
    >>> options["weights"]                     # weight_geometry reads no tokens: no sample options
    {'alpha_fit_range': (1, 10)}
    >>> [(o.name, o.error, type(o.result).__name__) for o in run_jobs(model, texts, jobs, options, progress=False)]
    [('spectrum', None, 'SpectrumResult'), ('weights', None, 'WeightGeometryResult')]
"""

from __future__ import annotations

import gc
import inspect
import re
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import torch

from geolens._renames import RENAMED_IN
from geolens._validation import UpperBound, check_int

__all__ = ["SHARED_OPTIONS", "Job", "JobOutcome", "UnknownOptionError", "check_option_types", "check_shared_options",
           "free_memory", "resolve_jobs", "route_options", "run_jobs"]

# The sample options every analysis of the calling convention takes; a grid offers them to each job whose
# signature takes them. A default that is an upper bound (geolens._validation.UpperBound) stays one: with
# less text, the analysis uses what there is and records it.
SHARED_OPTIONS = ("n_tokens", "seed", "batch_size", "max_length")


class Job(NamedTuple):
    """One analysis of a grid: its name (the prefix of its metrics), its function, whether it reads tokens."""

    name: str
    function: Callable[..., Any]
    takes_tokens: bool = True


class JobOutcome(NamedTuple):
    """What one job gave on one model: its result, or the exception it raised (``result`` is then ``None``)."""

    name: str
    result: Any
    error: Exception | None
    seconds: float

    @property
    def params(self) -> dict[str, Any]:
        """The parameters the result reports, without its processing log."""
        return {k: v for k, v in self.result.params.items() if k != "processing"}


class UnknownOptionError(TypeError, ValueError):
    """An option that the analysis it was given to does not take (or that no analysis takes).

    A ``TypeError``, as Python's own call with an unexpected keyword raises, and a ``ValueError``,
    as a study file that misspells an option holds a bad value.
    """


def resolve_jobs(analyses: Iterable[str | Callable[..., Any]] | str | Callable[..., Any],
                 table: Mapping[str, tuple[Callable[..., Any], bool]]) -> list[Job]:
    """Names looked up in ``table`` (``name -> (function, takes_tokens)``) and callables (named by their
    ``__name__``, reading tokens), as jobs; a name not in the table, no analyses or a repeated name raise.

    Example:
        >>> [job.name for job in resolve_jobs(["pga", len], {"pga": (geolens.pga, True)})]
        ['pga', 'len']
    """
    if isinstance(analyses, str) or callable(analyses):
        analyses = (analyses,)
    jobs = []
    for entry in analyses:
        if callable(entry):
            jobs.append(Job(getattr(entry, "__name__", "analysis"), entry, True))
        elif entry in table:
            function, takes_tokens = table[entry]
            jobs.append(Job(entry, function, takes_tokens))
        else:
            raise ValueError(f"unknown analysis {entry!r}; choose from {sorted(table)} or pass a callable")
    if not jobs:
        raise ValueError("no analyses given")
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"analyses repeat a name: {names}")
    return jobs


def check_shared_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with those among :data:`SHARED_OPTIONS` checked: ``n_tokens`` ``None`` or an int >= 3 (an
    :class:`~geolens._validation.UpperBound` stays one), ``seed`` an int >= 0, ``batch_size`` an int >= 1,
    ``max_length`` ``None`` or an int >= 1. Other options pass unchanged.

    Example:
        >>> check_shared_options({"n_tokens": 2})
        Traceback (most recent call last):
        ...
        ValueError: n_tokens must be >= 3, got 2
    """
    out = dict(options)
    if out.get("n_tokens") is not None:
        bound = isinstance(out["n_tokens"], UpperBound)
        n_tokens = check_int(out["n_tokens"], "n_tokens", low=3)
        out["n_tokens"] = UpperBound(n_tokens) if bound else n_tokens
    if "seed" in out:
        out["seed"] = check_int(out["seed"], "seed", low=0)
    if "batch_size" in out:
        out["batch_size"] = check_int(out["batch_size"], "batch_size", low=1)
    if out.get("max_length") is not None:
        out["max_length"] = check_int(out["max_length"], "max_length", low=1)
    return out


def _inputs(job: Job) -> list[str]:
    """The names of the parameters a runner passes by position: the model, and the tokens if the job reads them."""
    positional = [p.name for p in inspect.signature(job.function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional[:2 if job.takes_tokens else 1]


def route_options(
    jobs: Sequence[Job],
    own: Mapping[str, Mapping[str, Any]] | None = None,
    shared: Mapping[str, Any] | None = None,
    *,
    strict: bool = True,
    reserved: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """The options each job gets: the ``shared`` ones its function takes, then its ``own`` ones (which win).

    Args:
        jobs: the grid's jobs (:func:`resolve_jobs`).
        own: ``{job name: {option: value}}``; each option must be a keyword of that job's function
            (or the function takes ``**kwargs``).
        shared: options offered to every job whose function takes them; those among
            :data:`SHARED_OPTIONS` are checked first (:func:`check_shared_options`).
        strict: a shared option that no job takes raises (a misspelt keyword of
            :func:`~geolens.over_checkpoints`); else it is left out (a study's sample sizes
            mean nothing to ``weights``).
        reserved: options the runner sets itself (a study's ``progress``), refused in ``own``,
            as are the inputs passed by position (the model, the tokens).

    Returns:
        ``{job name: {option: value}}``, one entry per job.

    Raises:
        TypeError: an ``own`` entry that is not a dict.
        UnknownOptionError: an option that its job does not take (or, with ``strict``, a shared one
            that no job takes); a ``TypeError`` and a ``ValueError``.

    Example:
        >>> jobs = resolve_jobs(["pga"], {"pga": (geolens.pga, True)})
        >>> route_options(jobs, {"pga": {"kk": 3}})
        Traceback (most recent call last):
        ...
        geolens.analyses.grid.UnknownOptionError: analysis 'pga' takes no options ['kk']; pga() takes no keyword ...
    """
    own = {} if own is None else own
    shared = check_shared_options({} if shared is None else shared)
    names = [job.name for job in jobs]
    stray = [name for name in own if name not in names]
    if stray:
        raise ValueError(f"options for analyses {stray} that do not run (running: {names})")
    routed: dict[str, dict[str, Any]] = {}
    for job in jobs:
        parameters = inspect.signature(job.function).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        options = own.get(job.name, {})
        if not isinstance(options, Mapping):
            raise TypeError(f"{job.name}= (the options of analysis {job.name!r}) must be a dict of keyword "
                            f"arguments, got {type(options).__name__}")
        inputs = _inputs(job)
        refused = [k for k in options if k in inputs or k in reserved]
        if refused:
            raise UnknownOptionError(f"analysis {job.name!r} takes no options {refused}: the runner passes "
                                     f"{', '.join(inputs + [r for r in reserved if r not in inputs])} itself")
        unknown = [k for k in options if k not in parameters and not takes_any]
        renamed = getattr(job.function, "__renamed_keywords__", {})
        if any(k in renamed for k in unknown):  # a study file written before a rename: name the new option
            old = next(k for k in unknown if k in renamed)
            raise UnknownOptionError(f"analysis {job.name!r}: option {old!r} was renamed to {renamed[old]!r} in "
                                     f"geolens {RENAMED_IN}")
        if unknown:
            accepted = [p.name for p in parameters.values() if p.name not in inputs and p.name not in reserved
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            raise UnknownOptionError(f"analysis {job.name!r} takes no options {unknown}; "
                                     f"{getattr(job.function, '__name__', job.name)}() takes no keyword arguments "
                                     f"by those names (its options: {', '.join(accepted) or 'none'})")
        check_option_types(job, options)
        routed[job.name] = {**{k: v for k, v in shared.items() if (takes_any or k in parameters) and k not in inputs},
                            **options}
    unused = [k for k in shared if not any(k in routed[name] for name in names)]
    if strict and unused:
        raise UnknownOptionError(f"no analysis among {sorted(names)} takes the keyword arguments {unused}")
    return routed


# Words of a parameter's annotation that admit no text: an option annotated with these alone takes no string.
_NUMERIC_WORDS = {"int", "float", "bool", "None", "Sequence", "tuple", "list", "Iterable", "Optional", "Union",
                  "typing", "collections", "abc"}


def _takes_no_text(parameter: inspect.Parameter) -> bool:
    """Whether ``parameter`` surely takes no string: annotated with numbers (and ``None``, sequences of
    numbers) alone, or, without an annotation, a number or a bool by default."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return isinstance(parameter.default, (int, float)) and parameter.default is not None
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return set(re.findall(r"[A-Za-z_]\w*", text)) <= _NUMERIC_WORDS


def check_option_types(job: Job, options: Mapping[str, Any]) -> None:
    """A string given to an option of ``job`` that takes numbers (or flags) raises ``TypeError`` naming
    both, before anything runs (a study file's ``n_resamples = "x"``); other checks stay with the analysis.

    Example:
        >>> check_option_types(Job("pga", geolens.pga), {"n_resamples": "x"})
        Traceback (most recent call last):
        ...
        TypeError: analysis 'pga': option n_resamples must be int (its default: 0), got str 'x'
    """
    parameters = inspect.signature(job.function).parameters
    for key, value in options.items():
        parameter = parameters.get(key)
        if isinstance(value, str) and parameter is not None and _takes_no_text(parameter):
            expected = parameter.annotation if parameter.annotation is not inspect.Parameter.empty \
                else type(parameter.default).__name__
            raise TypeError(f"analysis {job.name!r}: option {key} must be {expected} (its default: "
                            f"{parameter.default!r}), got str {value!r}")


def run_jobs(
    model: Any,
    tokens: Any,
    jobs: Sequence[Job],
    options: Mapping[str, Mapping[str, Any]],
    *,
    inputs: Callable[[Job, dict[str, Any]], Any] | None = None,
    progress: bool | None = None,
) -> Iterator[JobOutcome]:
    """Run each job on ``model`` in turn, handing over each outcome as it finishes.

    A job that raises (an ``Exception``) gives an outcome with that ``error``, and the next job
    still runs; the caller raises it or records it.

    Args:
        model: the model every job reads.
        tokens: what the jobs that read tokens get (texts or token ids).
        jobs: the jobs, in order.
        options: ``{job name: {option: value}}`` (:func:`route_options`).
        inputs: ``inputs(job, options) -> tokens``, what a job that reads tokens gets instead of
            ``tokens`` (a study's states captured once for several analyses); an exception there
            is the job's.
        progress: passed to each function that takes ``progress`` and has none in its options.
    """
    for job in jobs:
        kwargs = dict(options.get(job.name, {}))
        if progress is not None and "progress" not in kwargs \
                and "progress" in inspect.signature(job.function).parameters:
            kwargs["progress"] = progress
        started = time.perf_counter()
        result, error = None, None
        try:
            if job.takes_tokens:
                result = job.function(model, tokens if inputs is None else inputs(job, kwargs), **kwargs)
            else:
                result = job.function(model, **kwargs)
        except Exception as err:  # this job fails alone; the caller decides whether that stops the grid
            error = err
        yield JobOutcome(job.name, result, error, time.perf_counter() - started)
        result = error = None  # one result alive at a time: the caller holds the one it keeps


def free_memory() -> None:
    """Collect garbage (a freed model's reference cycles) and empty CUDA's cache: run between two models."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
