"""A user's analysis runs guarded: hooks it leaves on the model and weights it changes are undone, and it fails.

The report runs its sections, and a study cell its analyses, one after another on one model. A
registered analysis (:func:`geolens.register_analysis`) that left a forward hook behind would change
every later section's numbers; one that scaled a weight in place would change the PGA of the same
cell. :func:`guarded` wraps each call of a user's analysis:

* **hooks**: every forward, pre-forward and backward hook on the model's modules (plain torch
  hooks, and TransformerLens hook points' hooks) is listed before the call; a hook that is new after
  it is removed. Hooks the model's own library wires on its first forward (a TransformerLens bridge
  wires capture hooks lazily; their functions come from the model's own package) are the model's,
  not the analysis's; a hook added through a hook point's ``add_hook`` is the analysis's wherever
  its wrapper comes from.
* **weights**: every parameter is copied to the CPU before the call, and a fingerprint (storage,
  shape, dtype, the sum in float64) compared after it; a parameter that changed (in place, through
  ``.data``, or replaced) gets its values back.

Then the analysis fails with :class:`ModelSideEffectError`, naming what was undone, and the others
run on the model as it was. Failing (rather than warning and keeping the result) is the choice: the
result was computed by code that edits the model, so it may itself be wrong, and a failed section
is visible on the page and in ``meta.json``, where a warning scrolls away. An analysis that raised
and also left something behind keeps its own error, with a note saying what was undone.

The copy costs host memory the size of the model's parameters while a user's analysis runs; the
built-in analyses are not guarded (their own tests check that they leave the model as it was).

Example:
    >>> import torch
    >>> net = torch.nn.Linear(2, 2)
    >>> before = net.weight.detach().clone()
    >>> with guarded("scales", net):  # doctest: +ELLIPSIS
    ...     _ = net.weight.data.mul_(2.0)
    Traceback (most recent call last):
    ...
    geolens.analyses.guard.ModelSideEffectError: analysis 'scales' changed the model's weights (weight); they were restored. ...
    >>> torch.equal(net.weight, before)
    True
    >>> with guarded("hooks", net):  # doctest: +ELLIPSIS
    ...     _ = net.register_forward_hook(lambda module, args, out: out * 0)
    Traceback (most recent call last):
    ...
    geolens.analyses.guard.ModelSideEffectError: analysis 'hooks' left 1 hook on the model (forward hook on the model itself); they were removed. ...
    >>> len(net._forward_hooks)
    0
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, NamedTuple

import torch

__all__ = ["ModelSideEffectError", "guarded"]

_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
# Side tables torch keeps by hook id (the flags of a hook registered with_kwargs or always_call).
_HOOK_SIDE_TABLES = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
_HOOK_KINDS = {"_forward_hooks": "forward hook", "_forward_pre_hooks": "forward pre-hook",
               "_backward_hooks": "backward hook", "_backward_pre_hooks": "backward pre-hook"}


class ModelSideEffectError(ValueError):
    """A user's analysis left a hook on the model or changed its weights (undone before this is raised)."""


class _Weight(NamedTuple):
    owner: torch.nn.Module
    attr: str
    parameter: torch.nn.Parameter
    storage: torch.Tensor  # the parameter's data as it was (an alias, no copy): back in place if .data was replaced
    saved: torch.Tensor  # a CPU copy of its values


def model_module(model: Any) -> torch.nn.Module | None:
    """The torch module an analysis reads: ``model`` itself, or a geolens adapter's ``.model``."""
    if isinstance(model, torch.nn.Module):
        return model
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, torch.nn.Module) else None


def _hook_keys(module: torch.nn.Module) -> set[tuple[int, str, int]]:
    return {(id(sub), table, key) for sub in module.modules() for table in _HOOK_TABLES
            for key in getattr(sub, table, {})}


def _is_the_models_own(module: torch.nn.Module, sub: torch.nn.Module, table: str, key: int) -> bool:
    """A hook the model's library wired itself (its function comes from the model's package and no hook
    point lists it as a user's hook)."""
    listed = {getattr(getattr(h, "hook", None), "id", None) for h in (*getattr(sub, "fwd_hooks", ()),
                                                                      *getattr(sub, "bwd_hooks", ()))}
    if key in listed:
        return False
    function = getattr(sub, table)[key]
    home = str(getattr(function, "__module__", "") or "").split(".")[0]
    return home != "" and home == type(module).__module__.split(".")[0]


def _remove_new_hooks(module: torch.nn.Module, before: set[tuple[int, str, int]]) -> list[str]:
    """Remove the hooks registered since ``before`` that are not the model's own; their descriptions."""
    names = {id(sub): name for name, sub in module.named_modules()}
    subs = {id(sub): sub for sub in module.modules()}
    removed = []
    for sub_id, table, key in sorted(_hook_keys(module) - before, key=lambda k: (names.get(k[0], ""), k[1], k[2])):
        sub = subs[sub_id]
        if _is_the_models_own(module, sub, table, key):
            continue
        getattr(sub, table).pop(key, None)
        for side in _HOOK_SIDE_TABLES:
            getattr(sub, side, {}).pop(key, None)
        for handles in ("fwd_hooks", "bwd_hooks"):  # a hook point's own list of its hooks
            if isinstance(getattr(sub, handles, None), list):
                setattr(sub, handles, [h for h in getattr(sub, handles)
                                       if getattr(getattr(h, "hook", None), "id", None) != key])
        removed.append(f"{_HOOK_KINDS[table]} on {names.get(sub_id) or 'the model itself'}")
    return removed


def _weights(module: torch.nn.Module) -> dict[str, _Weight]:
    weights = {}
    for owner_name, owner in module.named_modules():
        for attr, parameter in owner._parameters.items():
            if parameter is not None and not parameter.is_meta:
                name = f"{owner_name}.{attr}" if owner_name else attr
                weights[name] = _Weight(owner, attr, parameter, parameter.data,
                                        parameter.detach().to("cpu", copy=True))
    return weights


def _fingerprint(weight: _Weight) -> tuple[Any, ...]:
    current = weight.owner._parameters.get(weight.attr)
    if current is None:
        return ("removed",)
    values = torch.view_as_real(current.detach()) if current.is_complex() else current.detach()
    return (current is weight.parameter, current.data_ptr(), tuple(current.shape), current.dtype,
            values.sum(dtype=torch.float64).item())


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Equal fingerprints (a NaN sum that stayed NaN is unchanged)."""
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                                               and math.isnan(y)) for x, y in zip(a, b))


@torch.no_grad()
def _restore_changed(weights: dict[str, _Weight], fingerprints: dict[str, tuple[Any, ...]]) -> list[str]:
    """Put back every parameter whose fingerprint changed; their names."""
    changed = [name for name, weight in weights.items() if not _same(_fingerprint(weight), fingerprints[name])]
    for name in changed:
        owner, attr, parameter, storage, saved = weights[name]
        owner._parameters[attr] = parameter
        if parameter.data_ptr() != storage.data_ptr() or parameter.shape != storage.shape \
                or parameter.dtype != storage.dtype:
            parameter.data = storage
        storage.copy_(saved)
    return changed


def _message(name: str, hooks: list[str], changed: list[str]) -> str:
    parts = []
    if hooks:
        shown = ", ".join(hooks[:4]) + (f", and {len(hooks) - 4} more" if len(hooks) > 4 else "")
        parts.append(f"left {len(hooks)} hook{'s' if len(hooks) > 1 else ''} on the model ({shown}); "
                     "they were removed")
    if changed:
        shown = ", ".join(changed[:4]) + (f", and {len(changed) - 4} more" if len(changed) > 4 else "")
        parts.append(f"changed the model's weights ({shown}); they were restored")
    return (f"analysis {name!r} " + "; it ".join(parts) + ". Its result is discarded: an analysis must leave "
            "the model as it found it (remove its hooks before returning, e.g. with model.hooks(...) as a "
            "context manager; edit copies of weights, not the weights)")


@contextlib.contextmanager
def guarded(name: str, model: Any) -> Iterator[None]:
    """Run the block (a call of the user's analysis ``name`` on ``model``), then undo what it left on the
    model: new hooks removed, changed parameters restored; if anything was, raise
    :class:`ModelSideEffectError` (or add a note to the block's own error). A ``model`` that is not a
    torch module (nor an adapter of one) runs unguarded."""
    module = model_module(model)
    if module is None:
        yield
        return
    hooks_before = _hook_keys(module)
    weights = _weights(module)
    fingerprints = {key: _fingerprint(weight) for key, weight in weights.items()}
    try:
        yield
    except Exception as error:
        undone = _undo(module, name, hooks_before, weights, fingerprints)
        if undone:
            error.add_note(undone)
        raise
    undone = _undo(module, name, hooks_before, weights, fingerprints)
    if undone:
        raise ModelSideEffectError(undone)


def _undo(module: torch.nn.Module, name: str, hooks_before: set[tuple[int, str, int]],
          weights: dict[str, _Weight], fingerprints: dict[str, tuple[Any, ...]]) -> str | None:
    """Remove the hooks and restore the weights the block left; the message saying so, or ``None``."""
    hooks = _remove_new_hooks(module, hooks_before)
    changed = _restore_changed(weights, fingerprints)
    return _message(name, hooks, changed) if hooks or changed else None
