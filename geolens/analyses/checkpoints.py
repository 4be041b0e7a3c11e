"""``geolens.over_checkpoints``: the same analyses on a sequence of training checkpoints, one model in memory at a time.

See docs/methods.md §B.8. It runs on the grid engine a study's cells run on (:mod:`geolens.analyses.grid`),
in memory: the rows come back as one table instead of a Parquet dataset.

Example (Pythia's training revisions need the Hugging Face hub):
    >>> loader = geolens.pythia_checkpoint_loader("EleutherAI/pythia-70m")   # needs the hub  # doctest: +SKIP
    >>> res = geolens.over_checkpoints(["step1000", "step10000", "step143000"], texts, loader=loader,
    ...                                pga=dict(ccr=[0, 1]), n_tokens=1024)   # needs the hub  # doctest: +SKIP

    Models already in memory go in as ``(label, model)`` pairs (here two tiny models):

    >>> res = geolens.over_checkpoints([("a", model), ("b", other_model)], texts, pga=dict(ccr=[0, 1], k=8, n_null=5),
    ...                                spectrum=dict(alpha_fit_range=(1, 10)), n_tokens=16, progress=False)
    >>> res.to_pandas().columns.tolist()
    ['checkpoint', 'order', 'analysis', 'site', 'layer', 'ccr', 'metric', 'value']
    >>> z = res.to_pandas().query("metric == 'pga.z' and ccr == 0 and site == 'resid_post'")
    >>> z.pivot(index="layer", columns="checkpoint", values="value").round(2).values.tolist()
    [[-1.54, -0.59], [4.6, -1.6], [-1.38, -0.84]]
    >>> fig = res.plot()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens._renames import renamed_attributes, renamed_keywords
from geolens.analyses import registry
from geolens.analyses.grid import free_memory, resolve_jobs, route_options, run_jobs
from geolens.model import boot_bridge
from geolens import plotting
from geolens._renames import renamed_keywords
from geolens.results import Result

__all__ = ["OverCheckpointsResult", "over_checkpoints", "pythia_checkpoint_loader"]


@dataclass(repr=False)
class OverCheckpointsResult(Result):
    """Long table, one row per (checkpoint, analysis, site, layer, ccr, metric):
    ``checkpoint, order, analysis, site, layer, ccr, metric, value``.

    ``metric`` is ``"<analysis>.<column>"`` (``"pga.z"``, ``"spectrum.effective_rank"``,
    ``"weights.condition_number"``); ``ccr`` is set for PGA rows only; weight rows
    have ``layer = None`` and the matrix name as ``site``.
    """

    title: ClassVar[str] = "OverCheckpointsResult"

    def _summary(self) -> str:
        keys = ("checkpoints", "analyses")
        return ", ".join(f"{k}={self.params[k]}" for k in keys if k in self.params)

    def wide(self) -> pd.DataFrame:
        """One row per (checkpoint, site, layer), one column per metric (PGA metrics as ``"pga.z (ccr=1)"``)."""
        table = self.to_pandas()
        table = table.assign(key=table.apply(plotting.metric_key, axis=1))
        index = ["order", "checkpoint", "site", "layer"]
        wide = table.set_index([*index, "key"])["value"].unstack("key").reset_index()
        wide.columns.name = None
        return wide

    @renamed_keywords(metrics="kind")
    def plot(self, *, kind: str | Sequence[str] | None = None):
        """Plotly figure of each metric ``kind`` (default: all) against the checkpoint, one line per layer; a dropdown
        picks the metric."""
        return plotting.checkpoint_figure(self.to_pandas(), kind=kind, title=self._summary())


def _long_rows(label: Any, order: int, analysis: str, result: Result) -> list[dict[str, Any]]:
    return [{"checkpoint": label, "order": order, **row} for row in result.long_rows(analysis)]


@renamed_keywords(load="loader")
def over_checkpoints(
    checkpoints: Iterable[Any],
    tokens,
    *,
    analyses: Sequence[str | Callable[..., Result]] = ("pga", "spectrum"),
    loader: Callable[[Any], Any] | None = None,
    progress: bool = True,
    **kwargs: Any,
) -> OverCheckpointsResult:
    """Run ``analyses`` on each checkpoint in turn and gather every number into one long table.

    Args:
        checkpoints: labels, each loaded with ``loader(label)``; or, without ``loader``,
            ``(label, model)`` pairs. With ``loader``, exactly one model is alive at a
            time: each is deleted (and ``gc.collect()`` run, plus
            ``torch.cuda.empty_cache()`` on CUDA) before the next is loaded. With
            pairs, pass a generator so the pairs can be freed too: a list keeps
            every model alive.
        tokens: the same text / token ids for every checkpoint.
        analyses: names of analyses a study runs (``geolens.available_analyses()``: ``"pga"``,
            ``"spectrum"``, ``"weights"`` (:func:`~geolens.analyses.spectrum.weight_geometry`, no tokens),
            ``"updates"``, ``"phases"`` and registered ones), or callables ``f(model, tokens, **kw) -> Result``.
        loader: ``label -> model`` (e.g. :func:`pythia_checkpoint_loader`).
        progress: progress bars (the checkpoint bar and each analysis').
        **kwargs: keywords for the analyses: ``pga=dict(ccr=[0, 1])`` goes to one
            analysis; any other keyword (``n_tokens=512``, ``seed=1``) to every
            analysis that takes it; a keyword that none takes raises ``TypeError``.
            The options are routed, and ``n_tokens``, ``seed``, ``batch_size`` and
            ``max_length`` checked, before any checkpoint loads, as a study's are
            (:func:`geolens.analyses.grid.route_options`).

    Returns:
        :class:`OverCheckpointsResult`: ``checkpoint, order, analysis, site, layer, ccr, metric, value``;
        ``.wide()`` pivots it, ``.plot()`` draws metric vs checkpoint per layer.

    Example:
        >>> res = geolens.over_checkpoints([("a", model), ("b", other_model)], texts, analyses=("spectrum",),
        ...                                n_tokens=16, alpha_fit_range=(1, 10), progress=False)
        >>> res.params["checkpoints"], res.params["analyses"]
        (['a', 'b'], ['spectrum'])
        >>> erank = res.to_pandas().query("metric == 'spectrum.effective_rank'")
        >>> erank[["checkpoint", "layer"]].values.tolist()
        [['a', 0], ['a', 1], ['a', 2], ['b', 0], ['b', 1], ['b', 2]]
    """
    jobs = resolve_jobs(analyses, registry.jobs_table("study"))
    names = {job.name for job in jobs}
    routed = route_options(jobs, own={k: v for k, v in kwargs.items() if k in names},
                           shared={k: v for k, v in kwargs.items() if k not in names})
    rows: list[dict[str, Any]] = []
    labels: list[Any] = []
    analysis_params: dict[str, dict[str, Any]] = {}
    bar = tqdm(desc="checkpoints", disable=not progress, leave=False)
    for order, item in enumerate(checkpoints):
        if loader is None:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"without loader=, checkpoints must be (label, model) pairs; got {type(item).__name__}")
            label, model = item
        else:
            label, model = item, loader(item)
        item = None  # drop the pair's reference too, so the model can be freed below
        labels.append(label)
        bar.set_postfix_str(str(label))
        for outcome in run_jobs(model, tokens, jobs, routed, progress=progress):
            err = outcome.error
            if err is not None:
                if type(err) in (ValueError, TypeError):
                    raise type(err)(f"checkpoint {label!r}, {outcome.name}: {err}") from err
                raise err
            rows.extend(_long_rows(label, order, outcome.name, outcome.result))
            analysis_params.setdefault(outcome.name, outcome.params)
            del outcome  # one result alive at a time
        del model
        free_memory()
        bar.update()
    bar.close()
    if not labels:
        raise ValueError("checkpoints is empty")
    params = {"checkpoints": [str(label) for label in labels], "analyses": [job.name for job in jobs],
              "analysis_params": analysis_params}
    return OverCheckpointsResult(rows=rows, params=params)


def pythia_checkpoint_loader(
    name: str = "EleutherAI/pythia-70m",
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Callable[[str | int], Any]:
    """A ``loader(label)`` for :func:`over_checkpoints` over Pythia's training revisions (needs the Hugging Face hub).

    ``label`` is a hub revision such as ``"step143000"`` (an int ``n`` means
    ``"step{n}"``); each call boots :func:`geolens.model.boot_bridge` (``name,
    revision=label``) with unprocessed weights. Pythia publishes steps 0, 1, 2,
    4, ..., 512 and every 1000 up to 143000.

    Example:
        >>> load = pythia_checkpoint_loader("EleutherAI/pythia-160m", device="cuda")
        >>> load.__name__
        'load_pythia-160m'
        >>> model = load("step64000")   # downloads from the hub; device="cuda" needs a GPU  # doctest: +SKIP
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a model name such as 'EleutherAI/pythia-70m', got {name!r}")

    def load(label: str | int) -> Any:
        revision = f"step{label}" if isinstance(label, int) and not isinstance(label, bool) else str(label)
        return boot_bridge(name, revision=revision, device=device, dtype=dtype)

    load.__name__ = f"load_{name.rsplit('/', 1)[-1]}"
    return load


# the 0.3.0 name answers with the new one
__getattr__ = renamed_attributes(__name__, {"CheckpointResult": "OverCheckpointsResult"})
