"""Small utilities shared by tests (not fixtures)."""

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str):
    """Import a script of the repository (``examples/x.py``, ``bench/x.py``, ``docs/x.py``) as module ``name``;
    its ``__main__`` block does not run. Registered in ``sys.modules`` (dataclasses and pickling look it up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def hook_count(model: torch.nn.Module) -> int:
    """Every forward/backward hook registered on any submodule."""
    total = 0
    for module in model.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
        total += len(module._backward_hooks) + len(getattr(module, "_backward_pre_hooks", {}))
    return total


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def same_weights(before: dict[str, torch.Tensor], model: torch.nn.Module) -> bool:
    after = model.state_dict()
    return before.keys() == after.keys() and all(_identical(before[k], after[k]) for k in before)


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN included (a NaN weight that stayed NaN is unchanged)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def padded_tokens(d_vocab: int, lengths=(12, 9, 12, 5), seed: int = 0):
    """Right-padded random token ids and their mask."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    tokens = torch.randint(1, d_vocab, (len(lengths), t), generator=g)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        tokens[row, length:] = 0
    return tokens, mask
