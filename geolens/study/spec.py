"""A study declared as data: models (and their checkpoints), metadata, texts, analyses, per-cell resources.

The dataclasses of a study and their checks: :class:`Study` and :class:`ModelSpec`. A
:class:`Study` expands into *cells*, one per ``(model, checkpoint)``
(:mod:`geolens.study.plan`: each cell carries everything a worker needs to compute it and
the hashes that tell a finished cell from a changed one); a study file is read by
:mod:`geolens.study.toml`.

Model entries (``Study.models``, label -> entry):

* ``"path/or/hub-name"`` — a local Hugging Face folder or a hub name (booted with
  :func:`geolens.model.boot_bridge`), one checkpoint labelled ``"main"``;
* ``(path, revision)`` — with a hub revision (``None``: ``"main"``), or a list of revisions
  (one cell each: Pythia's ``["step1000", "step143000"]``);
* a callable ``load(checkpoint) -> model`` (``load()`` for one checkpoint), or
  ``(load, [checkpoint labels])``;
* a :class:`ModelSpec` (all of the above plus per-model metadata, per-checkpoint metadata,
  per-analysis parameter overrides and resources); :func:`geolens.zoo.zoo_member` makes one
  for a member of the width zoo;
* in a TOML file, a table: ``path =`` (a local folder, relative to the file's; one that does not exist
  fails its cell naming the folder) or ``hub =`` (a hub name) (with ``revisions = [...]``), ``zoo = "folder"``
  with ``width =`` (and ``steps =``; any key registered with
  :func:`~geolens.study.factories.register_model_factory` works so), or ``factory = "module:function"``
  with ``args = {...}`` (a function returning a :class:`ModelSpec`); plus ``metadata``, ``params`` and
  ``resources`` tables.

Example:
    >>> spec = Study(models={"small": "path/to/a", "big": ("path/to/b", ["step1", "step2"])},
    ...              texts=["the cat sat", "a dog ran"], analyses={"pga": {"k": 8}, "spectrum": {}},
    ...              metadata={"small": {"width": 32}, "big": {"width": 64}})
    >>> [(c.model, c.checkpoint) for c in spec.cells()]
    [('small', 'main'), ('big', 'step1'), ('big', 'step2')]
    >>> spec.cells()[0].metadata
    {'width': 32}
"""


from __future__ import annotations

import functools
import numbers
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from geolens._validation import DEFAULT_N_TOKENS, check_float
from geolens.analyses import registry
from geolens.analyses.grid import SHARED_OPTIONS, check_shared_options
from geolens.study.factories import model_factories
from geolens.study.plan import Cell, PlannedModel, plan_cells
from geolens.study.toml import check_table, local_path, read_study_file, texts_from

__all__ = ["RESERVED_COLUMNS", "ModelSpec", "Study"]

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")  # resources: Ray custom ones, {name: amount}
# Columns of the long table and of metadata.parquet (``order``); metadata keys may not take these names.
RESERVED_COLUMNS = ("model", "checkpoint", "step", "n_layers", "d_model", "analysis", "site", "ccr", "layer",
                    "relative_depth", "metric", "value", "order")
MAIN = "main"  # the label of a model's default checkpoint (revision None)
# study.json says it is a geolens study with this (other tools write files of that name too).
STUDY_KIND = "geolens.study"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def check_label(label: object, what: str) -> str:
    """Labels name folders of the Parquet dataset: letters, digits and ``. _ + -``, not starting with a symbol."""
    text = str(label)
    if not _LABEL.match(text) or len(text) > 200:
        raise ValueError(f"{what} {label!r} must be letters, digits and '._+-' (it names a folder of the results), "
                         "starting with a letter or digit")
    return text


def _scalar_metadata(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for key, value in check_table(values, f"{where}: metadata").items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{where}: metadata keys must be non-empty strings (they name columns), got {key!r}")
        if key in RESERVED_COLUMNS:
            raise ValueError(f"{where}: metadata key {key!r} is a column of the results (reserved: "
                             f"{', '.join(RESERVED_COLUMNS)}); rename it")
        if hasattr(value, "item"):
            value = value.item()
        if not (isinstance(value, (str, int, float, bool)) or value is None):
            raise TypeError(f"{where}: metadata {key!r} must be a number, string, bool or None, got "
                            f"{type(value).__name__}")
        out[str(key)] = value
    return out


def _parse_memory(value: Any) -> int:
    """Bytes from an int or a string such as ``"16GiB"``, ``"500MB"``."""
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return int(check_float(value, "memory", low=0, low_open=True))
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]i?B|B)?\s*", str(value), flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"memory must be bytes or a size such as '16GiB' or '500MB', got {value!r}")
    unit = (match.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(match.group(1)) * scale)


def _check_resources(resources: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = [k for k in resources if k not in RESOURCE_KEYS]
    if unknown:
        raise ValueError(f"{where}: unknown resources {unknown}; use {list(RESOURCE_KEYS)}")
    out: dict[str, Any] = {}
    for key, value in resources.items():
        if key == "memory":
            out[key] = _parse_memory(value)
        elif key == "resources":
            if not isinstance(value, Mapping) or not all(isinstance(v, numbers.Number) and not isinstance(v, bool)
                                                         and v >= 0 for v in value.values()) \
                    or {"CPU", "GPU", "memory"} & set(value):  # Ray's own: num_cpus, num_gpus, memory
                raise ValueError(f"{where}: resources must map custom resource names to amounts >= 0 (CPUs, GPUs "
                                 f"and memory are num_cpus, num_gpus, memory), got {value!r}")
            out[key] = {str(name): amount for name, amount in value.items()}
        else:
            check_float(value, f"{where}: {key}", low=0)
            out[key] = value
    return out


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study and its checkpoints.

    Attributes:
        path: a local Hugging Face folder or a hub name (booted with :func:`geolens.model.boot_bridge`).
        local: ``path`` is a local folder, never a hub name (a TOML ``path =``): loading a folder that
            does not exist fails naming it, instead of asking the hub.
        checkpoints: hub revisions of ``path`` (``None``: the default one), or labels passed to ``loader``.
        loader: ``loader(checkpoint) -> model`` (``loader()`` for the checkpoint ``None``); instead of ``path``.
            With Ray it must pickle (module-level functions and ``functools.partial`` of them do).
            The cell hash identifies it by module, name and a partial's arguments.
        metadata: free-form columns of every row of this model (width, depth, batch size, loss, ...).
        checkpoint_metadata: ``{checkpoint: {column: value}}``, columns of one checkpoint's rows (tokens seen,
            the loss logged at that step, ...).
        params: ``{analysis: {option: value}}``, overrides of the study's analysis options for this model
            (e.g. ``k`` scaled with the width).
        resources: overrides of the study's per-cell resources for this model (a bigger model, more memory).
    """

    path: str | None = None
    checkpoints: tuple[Any, ...] = (None,)
    loader: Callable[..., Any] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_metadata: Mapping[Any, Mapping[str, Any]] = field(default_factory=dict)
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    resources: Mapping[str, Any] = field(default_factory=dict)
    local: bool = False

    def __post_init__(self) -> None:
        if (self.path is None) == (self.loader is None):
            raise ValueError("a model needs exactly one of path= (folder or hub name) and loader= (a callable)")
        if self.path is not None and not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"path must be a folder or hub name, got {type(self.path).__name__}")
        if self.loader is not None and not callable(self.loader):
            raise TypeError(f"loader must be callable, got {type(self.loader).__name__}")
        for name in ("metadata", "checkpoint_metadata", "params", "resources"):
            check_table(getattr(self, name), name)
        for checkpoint, values in self.checkpoint_metadata.items():
            check_table(values, f"checkpoint_metadata[{checkpoint!r}]")
        for analysis, options in self.params.items():  # the names are checked against the study's analyses
            check_table(options, f"params[{analysis!r}]")
        checkpoints = self.checkpoints
        if isinstance(checkpoints, (str, numbers.Integral)) or checkpoints is None:
            checkpoints = (checkpoints,)
        checkpoints = tuple(checkpoints)
        if not checkpoints:
            raise ValueError("checkpoints is empty: give at least one (None for the default revision)")
        object.__setattr__(self, "checkpoints", checkpoints)
        if self.path is not None:
            object.__setattr__(self, "path", os.fspath(self.path))


def as_model_spec(entry: Any, label: str, base_dir: Path | None = None) -> ModelSpec:
    """Normalise one entry of ``Study.models`` (see the module docstring) to a :class:`ModelSpec`."""
    where = f"model {label!r}"
    if isinstance(entry, ModelSpec):
        return entry
    if isinstance(entry, (str, os.PathLike)):
        return ModelSpec(path=os.fspath(entry))
    if isinstance(entry, tuple) and len(entry) == 2:
        first, second = entry
        checkpoints = tuple(second) if isinstance(second, (list, tuple)) else (second,)
        if callable(first):
            return ModelSpec(loader=first, checkpoints=checkpoints)
        return ModelSpec(path=first, checkpoints=checkpoints)
    if callable(entry):
        return ModelSpec(loader=entry)
    if isinstance(entry, Mapping):
        return _model_from_table(dict(entry), label, base_dir)
    raise TypeError(f"{where}: expected a path or hub name, (path, revision), a loader callable, a ModelSpec or "
                    f"a table; got {type(entry).__name__}")


def _model_from_table(table: dict[str, Any], label: str, base_dir: Path | None) -> ModelSpec:
    """A model table (``path =``, ``hub =``, ``loader =``, ``factory =`` or a registered key, with its revisions,
    ``metadata``, ``params`` and ``resources``) as a :class:`ModelSpec`; ``table`` is consumed."""
    where = f"model {label!r}"
    extra = {key: check_table(table.pop(key), f"{where}: {key}") for key in ("metadata", "params", "resources")
             if key in table}
    factories = model_factories()  # registered by the packages that build models (geolens.zoo: zoo =)
    sources = [key for key in ("path", "hub", "loader", "factory", *factories) if key in table]
    if len(sources) != 1:
        choices = ", ".join(f"{key}=" for key in ("path", "hub", "loader", "factory", *factories))
        raise ValueError(f"{where}: give exactly one of {choices}; got {sources or 'none'}")
    source = sources[0]
    revisions = [key for key in ("revision", "revisions", "checkpoints", "steps") if key in table]
    if len(revisions) > 1:
        raise ValueError(f"{where}: give one of {revisions}")
    if source in ("path", "hub"):
        checkpoints = table.pop(revisions[0]) if revisions else None
        name = table.pop(source)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: {source} must be a non-empty string")
        spec = ModelSpec(path=local_path(name, base_dir) if source == "path" else name, local=source == "path",
                         checkpoints=tuple(checkpoints) if isinstance(checkpoints, list) else (checkpoints,))
    elif source == "loader":
        fn = registry.resolve_function(table.pop("loader"), where, key="loader")
        kwargs = check_table(table.pop("kwargs", {}), f"{where}: kwargs")
        checkpoints = table.pop(revisions[0]) if revisions else None
        spec = ModelSpec(loader=functools.partial(fn, **kwargs) if kwargs else fn,
                         checkpoints=tuple(checkpoints) if isinstance(checkpoints, list) else (checkpoints,))
    else:
        spec = _model_from_factory(table, source, where, base_dir)
    if table:
        raise ValueError(f"{where}: unknown keys {sorted(table)}")
    if extra:
        spec = replace(spec, metadata={**spec.metadata, **extra.get("metadata", {})},
                       params={**spec.params, **extra.get("params", {})},
                       resources={**spec.resources, **extra.get("resources", {})})
    return spec


def _model_from_factory(table: dict[str, Any], source: str, where: str, base_dir: Path | None) -> ModelSpec:
    """The ModelSpec a factory returns: ``factory = "module:function"`` with ``args``, or a registered key
    (``zoo = "folder"``) with the table's other keys as arguments; ``table`` is consumed."""
    if source == "factory":
        factory = registry.resolve_function(table.pop("factory"), where, key="factory")
        args = dict(check_table(table.pop("args", {}), f"{where}: args"))
    else:
        factory = model_factories()[source]
        args = {source: local_path(table.pop(source), base_dir)}
        args.update({key: table.pop(key) for key in list(table)})
    try:
        spec = factory(**args)
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"{where}: the factory returned {type(spec).__name__}, not a ModelSpec")
    return spec


def _study_analyses(analyses: Mapping[str, Any]) -> dict[str, registry.Analysis]:
    """The record of each analysis of a study: a registered one by name, or one given as ``function =
    "module:function"`` (or a callable) in its options; unknown names raise, all of them at once."""
    unknown = [name for name, options in analyses.items()
               if name not in registry.names("study") and not (isinstance(options, Mapping) and "function" in options)]
    if unknown:
        raise ValueError(f"unknown analyses {unknown}; choose from {registry.names('study')}, register one "
                         "(geolens.register_analysis) or give its function = 'module:function'")
    records = {}
    for name, options in analyses.items():
        check_table(options, f"analyses[{name!r}] (the options of {name}; {{}} for its defaults)")
        if "function" in options:
            function = registry.resolve_function(options["function"], f"analyses.{name}")
            records[name] = registry.user_analysis(name, function)
        else:
            records[name] = registry.get(name)
    return records


@dataclass
class Study:
    """Models x checkpoints x analyses, declared as data; run it with :func:`geolens.study.run_study`.

    Attributes:
        models: ``label -> entry`` (a path or hub name, ``(path, revision or [revisions])``, a loader callable,
            ``(loader, [checkpoints])``, a :class:`ModelSpec` or a TOML-style table; see the module docstring).
            Labels name folders: letters, digits, ``._+-``.
        texts: the texts every cell reads (a list; in TOML also ``{default = n}``, ``{files = [...]}``,
            ``{lines = "file"}``).
        analyses: ``{name: {option: value}}`` among the analyses studies run (``geolens.available_analyses()``:
            ``pga``, ``spectrum``, ``weights``, ``updates``, ``phases`` and those added with
            :func:`geolens.register_analysis`); the options are the analysis's own keyword arguments. An
            analysis of your own can also come as ``{"function": "module:function", option: value}`` (in
            TOML, ``[analyses.<name>]`` with ``function = "module:function"``); its numeric columns become
            metrics ``<name>.<column>`` by layer.
        metadata: ``{label: {column: value}}``, free-form per model (width, depth, batch size,
            weight decay, learning-rate schedule, held-out loss, ...); merged over the model's own.
        resources: per cell, for Ray: ``num_cpus``, ``num_gpus``, ``memory`` (bytes or ``"16GiB"``),
            ``resources`` (Ray custom resources, ``{name: amount}``).
        n_tokens: token positions sampled, shared by every analysis that takes them. The default
            (1024) is an upper bound, as each analysis's own default is: with fewer token
            positions in the texts, an analysis uses all there are (with a warning) and records the number
            used in its ``params`` (:func:`~geolens.study.load_provenance`); an ``n_tokens`` given here or in
            the TOML file is exact (a cell with too little text fails, saying so).
        seed: seed of every analysis that takes one.
        batch_size: texts per forward pass, for every analysis that takes it.
        max_length: truncation of each text in tokens, for every analysis that takes it.
        dtype: weights of models booted from a path (``"float32"``, ``"bfloat16"``, ...).
        device: where models booted from a path go (``None``: TransformerLens's choice).
        name: a name for the study's pages.
    """

    models: Mapping[str, Any]
    texts: Any = ()
    analyses: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"pga": {}, "spectrum": {}})
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    resources: Mapping[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    n_tokens: int | None = DEFAULT_N_TOKENS
    seed: int = 0
    batch_size: int = 8
    max_length: int | None = None
    dtype: str = "float32"
    device: str | None = None
    name: str = "study"
    base_dir: Path | None = field(default=None, repr=False)  # relative paths of a TOML file resolve from here

    @classmethod
    def from_toml(cls, path: str | os.PathLike, **overrides: Any) -> "Study":
        """Read a study file (``tomllib``); ``overrides`` replace fields after reading (e.g. ``models=`` with
        local stand-ins, smaller ``texts``). Relative paths in the file resolve from its folder.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     _ = Path(tmp, "s.toml").write_text('texts = ["a b c"]\\n[analyses.pga]\\nk = 4\\n'
            ...                                       '[models.tiny]\\npath = "m"\\nmetadata = {width = 32}\\n')
            ...     study = Study.from_toml(Path(tmp, "s.toml"))
            >>> study.analyses, study.metadata, Path(study.models["tiny"]["path"]).name
            ({'pga': {'k': 4}}, {'tiny': {'width': 32}}, 'm')
        """
        path = Path(path).expanduser()
        data = read_study_file(path, {f.name for f in fields(cls)} - {"base_dir"})
        study = cls(**data, base_dir=path.parent)
        return replace(study, **overrides) if overrides else study

    def _shared_options(self) -> dict[str, Any]:
        """``n_tokens, seed, batch_size, max_length``, offered to every analysis that takes them (its own table
        overrides them); checked, ``n_tokens`` stays an upper bound if it is one (the default): with less text,
        an analysis uses what there is and records it."""
        return check_shared_options({name: getattr(self, name) for name in SHARED_OPTIONS})

    def model_specs(self) -> dict[str, ModelSpec]:
        """Every model entry as a :class:`ModelSpec`, labels checked."""
        if not isinstance(self.models, Mapping) or not self.models:
            raise ValueError("models must be a non-empty mapping label -> model")
        specs = {check_label(label, "model label"): as_model_spec(entry, str(label), self.base_dir)
                 for label, entry in self.models.items()}
        for label, values in check_table(self.metadata, "metadata").items():
            check_table(values, f"metadata[{label!r}] (the columns of model {label!r})")
        unknown = [label for label in self.metadata if label not in specs]
        if unknown:
            raise ValueError(f"metadata for models {unknown} that the study does not have ({list(specs)})")
        return specs

    def cells(self) -> list[Cell]:
        """The study's cells in order (model by model, checkpoints in the given order); checks the whole spec."""
        check_table(self.analyses, "analyses")
        if not self.analyses:
            raise ValueError("analyses is empty: give at least one, e.g. {'pga': {}, 'spectrum': {}}")
        records = _study_analyses(self.analyses)
        texts = tuple(texts_from(self.texts, self.base_dir))
        shared = self._shared_options()
        if self.dtype not in ("float32", "float16", "bfloat16", "float64"):
            raise ValueError(f"dtype must be float32, float16, bfloat16 or float64, got {self.dtype!r}")
        resources = _check_resources(self.resources, "resources")
        options = self._analysis_options(records)
        models = [self._planned_model(label, spec, records, resources) for label, spec in self.model_specs().items()]
        return plan_cells(models, records=records, options=options, shared=shared, texts=texts, dtype=self.dtype,
                          device=self.device)

    def _analysis_options(self, records: Mapping[str, registry.Analysis]) -> dict[str, dict[str, Any]]:
        """Each analysis's options at the study level: its record's defaults, the study's over them; lens texts
        given as texts are (``{default = 200}``) read."""
        options = {name: {**records[name].options, **{k: v for k, v in given.items() if k != "function"}}
                   for name, given in self.analyses.items()}
        for name, own in options.items():
            if isinstance(own.get("lens_tokens"), Mapping):
                own["lens_tokens"] = texts_from(own["lens_tokens"], self.base_dir, f"analyses[{name!r}].lens_tokens")
        return options

    def _planned_model(self, label: str, spec: ModelSpec, records: Mapping[str, registry.Analysis],
                       resources: Mapping[str, Any]) -> PlannedModel:
        """One model checked for its cells: params of known analyses, scalar metadata, resources, checkpoints."""
        unknown = [name for name in spec.params if name not in records and name not in registry.names("study")]
        if unknown:  # an analysis of the study file (function = ...) takes per-model params too
            raise ValueError(f"model {label!r}: params: unknown analysis {unknown[0]!r}; choose from "
                             f"{list(dict.fromkeys([*records, *registry.names('study')]))}")
        metadata = _scalar_metadata({**spec.metadata, **self.metadata.get(label, {})}, f"model {label!r}")
        own_resources = {**resources, **_check_resources(spec.resources, f"model {label!r} resources")}
        labels = [MAIN if c is None else check_label(c, f"model {label!r} checkpoint") for c in spec.checkpoints]
        if len(set(labels)) != len(labels):
            raise ValueError(f"model {label!r}: checkpoints repeat: {labels}")
        checkpoints = tuple(
            (value, checkpoint, _scalar_metadata(spec.checkpoint_metadata.get(value, spec.checkpoint_metadata.get(
                checkpoint, {})), f"model {label!r} checkpoint {checkpoint}"))
            for value, checkpoint in zip(spec.checkpoints, labels))
        return PlannedModel(label=label, spec=spec, metadata=metadata, resources=own_resources,
                            checkpoints=checkpoints)
