"""A study's plan: its cells, one per ``(model, checkpoint)``, and the hash of each.

A cell carries everything a worker needs to compute it (:class:`Cell`). Its hashes say what it
computes: each analysis's hash covers the cell format, the model's label and source (a path, or a
loader by module and name), the checkpoint, the dtype of a booted model, the texts and that
analysis's complete options; the cell's ``spec_hash`` covers all of them. A rerun finds an
analysis finished when its file for that hash is on disk, so a hash that changes recomputes.

:class:`~geolens.study.Study` checks a spec and hands its parts to :func:`plan_cells`, which
expands them step by step: the options of each analysis for one model
(:func:`model_analyses`), a checkpoint's identity (:func:`cell_identity`), its hashes
(:func:`cell_hashes`).

Example:
    >>> identity = cell_identity("small", "main", source={"path": "path/to/a"}, dtype="float32",
    ...                          texts_hash=texts_hash(["the cat sat"]))
    >>> spec_hash, hashes = cell_hashes(identity, {"pga": {"k": 8}})
    >>> len(spec_hash), list(hashes)
    (16, ['pga'])
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from geolens._json import callable_id, jsonable
from geolens._renames import hashed_options
from geolens.analyses import registry
from geolens.analyses.grid import resolve_jobs, route_options

__all__ = ["CELL_FORMAT", "Cell", "PlannedModel", "cell_hashes", "cell_identity", "model_analyses",
           "parse_checkpoint_step", "plan_cells", "texts_hash"]

# Bump when a cell's rows change meaning: every cell is then recomputed.
# 2: one file per (cell, analysis); sample sizes that are upper bounds hash apart from explicit ones.
CELL_FORMAT = 2


def parse_checkpoint_step(checkpoint: Any) -> int | None:
    """The training step a checkpoint names: an int, ``"1000"`` or ``"step1000"``; else ``None``.

    Example:
        >>> parse_checkpoint_step(16), parse_checkpoint_step("step143000"), parse_checkpoint_step("main")
        (16, 143000, None)
    """
    if isinstance(checkpoint, numbers.Integral) and not isinstance(checkpoint, bool):
        return int(checkpoint)
    match = re.fullmatch(r"(?:step)?(\d+)", str(checkpoint))
    return int(match.group(1)) if match else None


def _sha(value: Any, length: int = 16) -> str:
    """The sha256 of ``value``'s hash form (:func:`~geolens._json.jsonable` with ``for_hash``), ``length`` hex digits."""
    return hashlib.sha256(json.dumps(jsonable(value, for_hash=True), sort_keys=True).encode()).hexdigest()[:length]


def texts_hash(texts: list[str] | tuple[str, ...]) -> str:
    """The hash of a study's texts, part of every cell's identity."""
    return _sha(list(texts), 32)


@dataclass(frozen=True)
class PlannedModel:
    """One model of a checked study, as :func:`plan_cells` expands it.

    Attributes:
        label: the model's label.
        spec: its :class:`~geolens.study.ModelSpec`.
        metadata: the columns of its rows (checked: scalars, no reserved names).
        resources: per cell (checked; the study's, with the model's over them).
        checkpoints: ``(value, label, metadata)`` of each checkpoint, in order: the value its loader or
            the hub is given, the label naming its folder, the columns of its own rows.
    """

    label: str
    spec: Any
    metadata: Mapping[str, Any]
    resources: Mapping[str, Any]
    checkpoints: tuple[tuple[Any, str, Mapping[str, Any]], ...]


@dataclass(frozen=True)
class Cell:
    """One ``(model, checkpoint)`` of a study: how to load it, what to compute, where its rows go.

    ``analyses`` holds each analysis's complete options (the study's, the model's overrides, the
    shared ``n_tokens``/``seed``/``batch_size``/``max_length``); ``analysis_hashes`` hashes each
    analysis's options with the model's source, the checkpoint and the texts (an analysis is finished
    when its file for that hash is on disk), ``spec_hash`` all of them.
    """

    model: str
    checkpoint: str
    checkpoint_value: Any
    step: int | None
    path: str | None
    loader: Callable[..., Any] | None
    texts: tuple[str, ...]
    analyses: Mapping[str, Mapping[str, Any]]
    metadata: Mapping[str, Any]
    resources: Mapping[str, Any]
    dtype: str
    device: str | None
    spec_hash: str
    order: int
    analysis_hashes: Mapping[str, str] = field(default_factory=dict)
    local: bool = False

    def load(self) -> Any:
        """Boot this cell's model (a path: :func:`geolens.model.boot_bridge`; else its loader)."""
        if self.loader is not None:
            return self.loader() if self.checkpoint_value is None else self.loader(self.checkpoint_value)
        if self.local and not Path(self.path).is_dir():
            raise FileNotFoundError(f"model {self.model!r}: path = {self.path!r} is not a folder "
                                    f"({'not a directory' if Path(self.path).exists() else 'it does not exist'}); "
                                    "path = names a local folder, hub = a Hugging Face hub name")
        import torch

        from geolens.data.models import refused_weights_named
        from geolens.model import boot_bridge

        revision = None if self.checkpoint_value is None else str(self.checkpoint_value)
        with refused_weights_named(self.path):
            return boot_bridge(self.path, revision=revision, device=self.device, dtype=getattr(torch, self.dtype))


def model_analyses(params: Mapping[str, Mapping[str, Any]], *, jobs: Any, options: Mapping[str, Mapping[str, Any]],
                   shared: Mapping[str, Any], records: Mapping[str, registry.Analysis]) -> dict[str, dict[str, Any]]:
    """Each analysis's complete options for one model: the study's ``options``, the model's ``params`` over
    them, the ``shared`` sample sizes where the analysis takes them, and a user's own function."""
    own = {name: {**options[name], **params.get(name, {})} for name in options}
    # the study's sample sizes mean nothing to some analyses (weights): not strict
    analyses = route_options(jobs, own, dict(shared), strict=False, reserved=("progress",))
    for name, record in records.items():  # a user's function travels with the cell (to Ray workers too),
        if not record.builtin:                # as written (a module-level function pickles by reference)
            analyses[name]["function"] = getattr(record.function, "__wrapped__", record.function)
    return analyses


def cell_identity(model: str, checkpoint: str, *, source: Mapping[str, Any], dtype: str | None,
                  texts_hash: str) -> dict[str, Any]:
    """What every hash of one cell covers: the format, the model's label and ``source`` (``{"path": ...}`` or
    ``{"loader": callable_id}``), the checkpoint, the ``dtype`` of a booted model (``None`` for a loader),
    the texts' hash."""
    return {"format": CELL_FORMAT, "model": model, "checkpoint": checkpoint, "source": dict(source),
            "dtype": dtype, "texts": texts_hash}


def cell_hashes(identity: Mapping[str, Any], analyses: Mapping[str, Mapping[str, Any]], *,
                renamed: Mapping[str, Mapping[str, str]] | None = None) -> tuple[str, dict[str, str]]:
    """``(spec_hash, {analysis: hash})`` of a cell: each analysis's hash covers the identity and its options,
    the spec hash the identity and every analysis's hash. ``renamed``: each analysis's renamed keywords (old ->
    new); their options are hashed under the old names, so a study written before a rename keeps its cells."""
    renamed = renamed or {}
    hashes = {name: _sha({**identity, "analysis": name, "options": hashed_options(options, renamed.get(name, {}))})
              for name, options in analyses.items()}
    return _sha({**identity, "analyses": hashes}), hashes


def plan_cells(models: list[PlannedModel], *, records: Mapping[str, registry.Analysis],
               options: Mapping[str, Mapping[str, Any]], shared: Mapping[str, Any], texts: tuple[str, ...],
               dtype: str, device: str | None) -> list[Cell]:
    """The cells of a checked study in order (model by model, checkpoints in the given order).

    ``options``: each analysis's options at the study level (its record's defaults, the study's over them);
    ``shared``: the sample sizes offered to every analysis that takes them.
    """
    jobs = resolve_jobs(list(options), {name: (r.function, r.takes_tokens) for name, r in records.items()})
    shared_texts = texts_hash(texts)
    renamed = {name: getattr(record.function, "__renamed_keywords__", {}) for name, record in records.items()}
    cells = []
    for model in models:
        spec = model.spec
        analyses = model_analyses(spec.params, jobs=jobs, options=options, shared=shared, records=records)
        source = {"path": spec.path} if spec.path is not None else {"loader": callable_id(spec.loader)}
        for value, checkpoint, metadata in model.checkpoints:
            identity = cell_identity(model.label, checkpoint, source=source, texts_hash=shared_texts,
                                     dtype=dtype if spec.path is not None else None)
            spec_hash, hashes = cell_hashes(identity, analyses, renamed=renamed)
            cells.append(Cell(
                model=model.label, checkpoint=checkpoint, checkpoint_value=value,
                step=parse_checkpoint_step(value) if value is not None else None, path=spec.path,
                loader=spec.loader, texts=texts, analyses=analyses, metadata={**model.metadata, **metadata},
                resources=model.resources, dtype=dtype, device=device, spec_hash=spec_hash, order=len(cells),
                analysis_hashes=hashes, local=spec.local))
    return cells
