"""Zoo members as study models: a width of a trained family, its checkpoints, their logged losses.

:func:`zoo_member` turns one member into a :class:`~geolens.study.ModelSpec` whose cells are
its checkpoints; a study TOML names one with ``zoo = "folder"`` and ``width =`` (and
optionally ``steps =``). The loader is a module-level function bound with
``functools.partial``, so it pickles for Ray workers (which must see the same folder).

Example:
    >>> spec = zoo_member(zoo, 16)          # ``zoo``: the tiny trained family of the zoo examples
    >>> spec.checkpoints, spec.metadata["width"], spec.checkpoint_metadata[4]["tokens"]
    ((0, 4), 16, 64)
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Sequence

from geolens.analyses import registry
from geolens.study.factories import register_model_factory
from geolens.study.spec import ModelSpec
from geolens.zoo.train import Zoo

__all__ = ["load_zoo_checkpoint", "zoo_member"]


def load_zoo_checkpoint(root: str, width: int, step: int):
    """Member ``width`` of the family at ``root`` at checkpoint ``step``, as a ``TransformerBridge``."""
    return Zoo.open(root, widths=[width]).load(width, step)


def zoo_member(zoo: Zoo | str | os.PathLike, width: int, steps: str | Sequence[int] = "all", *,
               params: dict[str, Any] | None = None) -> ModelSpec:
    """One member of a trained zoo family as a study model, one cell per checkpoint.

    Args:
        zoo: a :class:`~geolens.zoo.Zoo` or its folder.
        width: the member's ``d_model``.
        steps: ``"all"`` saved checkpoints, ``"final"``, or a list of saved steps.
        params: per-analysis option overrides (``{"pga": {"k": 13}}``).

    Returns:
        A :class:`~geolens.study.ModelSpec`: metadata ``width``, ``d_head``, ``train_steps``,
        ``batch_size``, ``lr``, ``weight_decay``; per checkpoint ``tokens`` (seen in training),
        ``eval_loss`` and ``train_loss`` (from the training log); the phases analysis caches its tuned
        lenses in the member's folder.
    """
    zoo = zoo if isinstance(zoo, Zoo) else Zoo.open(zoo)
    if width not in zoo.config.widths:
        raise ValueError(f"width {width} is not in the zoo at {zoo.root}; widths: {list(zoo.config.widths)}")
    saved = zoo.steps(width)
    if steps == "all":
        chosen = saved
    elif steps == "final":
        chosen = [zoo.config.steps]
    elif isinstance(steps, str):
        raise ValueError(f"steps must be 'all', 'final' or a list of steps, got {steps!r}")
    else:
        chosen = sorted(set(int(s) for s in steps))
    missing = [s for s in chosen if s not in saved]
    if missing or not chosen:
        raise ValueError(f"width {width}: steps {missing or chosen} are not saved checkpoints in {zoo.root}; "
                         f"saved: {saved} (train with `geolens zoo train`)")
    logged = {c["step"]: c for c in zoo.log(width)["checkpoints"]}
    per_step = {step: {"tokens": step * zoo.config.batch_size * zoo.config.seq_len,
                       "eval_loss": logged.get(step, {}).get("eval_loss"),
                       "train_loss": logged.get(step, {}).get("train_loss")} for step in chosen}
    config = zoo.config
    metadata = {"width": width, "d_head": config.d_head,
                "train_steps": config.steps, "batch_size": config.batch_size, "lr": config.lr,
                "weight_decay": config.weight_decay}
    member_dir = Path(zoo.member_dir(width))
    own = {record.name: dict(record.member_options(member_dir)) for record in map(registry.get, registry.names("zoo"))
           if record.member_options is not None}
    for name, options in (params or {}).items():
        own[name] = {**own.get(name, {}), **options}
    return ModelSpec(loader=functools.partial(load_zoo_checkpoint, str(zoo.root), int(width)),
                     checkpoints=tuple(chosen), metadata=metadata, checkpoint_metadata=per_step, params=own)


# A study file's ``zoo = "folder"`` (with ``width =``, ``steps =``) names a member: the study engine sits below
# the zoo, so the zoo hands it the factory.
register_model_factory("zoo", zoo_member)
