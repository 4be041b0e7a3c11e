"""Booting a model, and what geolens knows of the installed TransformerLens (TL).

The only module that asks which TL version is installed: TL 3.9 has ``HookedTransformer``
at its top level and ``TransformerBridge`` under ``transformer_lens.model_bridge``; in
TL 4.x importing ``HookedTransformer`` raises ``ImportError``. :func:`supported_kinds`
lists what there is, :func:`kind_of` tells the adapter which kind a model is.

:func:`boot_bridge` boots a Hugging Face model as a ``TransformerBridge`` with its
weights unprocessed. While it boots, two TransformerLens classes are patched for the
duration of the call: the joint-QKV attention bridge, so that a fused query-key-value
weight (GPT-NeoX / Pythia) is shared by the bridge's q, k, v instead of copied
(:class:`_FusedQKVPart`), and TL 4.3's torchvision installer, which is kept from
installing anything.

Example:
    >>> kind_of(model), kind_of(boot_bridge(model_path))
    ('bridge', 'bridge')
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from geolens._validation import refused_weights_named

__all__ = ["boot_bridge", "kind_of", "supported_kinds"]


@functools.lru_cache(maxsize=1)
def _tl_classes() -> tuple[type | None, type | None]:
    """Return ``(HookedTransformer, TransformerBridge)``, ``None`` for any that is missing.

    Imported lazily so ``import geolens`` stays light and works without TL.
    """
    try:
        from transformer_lens import HookedTransformer  # TL 4.x raises ImportError here
    except ImportError:
        HookedTransformer = None  # type: ignore[assignment,misc]
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        TransformerBridge = None  # type: ignore[assignment,misc]
    return HookedTransformer, TransformerBridge


def supported_kinds() -> dict[str, str]:
    """Map each kind the installed TL supports to its class path.

    >>> supported_kinds()["bridge"]   # "hooked_transformer" too, on TransformerLens <= 3.x
    'transformer_lens.model_bridge.TransformerBridge'
    """
    hooked, bridge = _tl_classes()
    kinds = {}
    if hooked is not None:
        kinds["hooked_transformer"] = "transformer_lens.HookedTransformer"
    if bridge is not None:
        kinds["bridge"] = "transformer_lens.model_bridge.TransformerBridge"
    return kinds


def kind_of(model: Any) -> str:
    """The kind of ``model`` (a key of :func:`supported_kinds`), or a ``TypeError`` naming the supported kinds.

    >>> kind_of(model)
    'bridge'
    """
    hooked, bridge = _tl_classes()
    if hooked is not None and isinstance(model, hooked):
        return "hooked_transformer"
    if bridge is not None and isinstance(model, bridge):
        return "bridge"
    kinds = supported_kinds()
    listed = ", ".join(f"{k} ({v})" for k, v in kinds.items()) or "none (transformer_lens is not importable)"
    note = "" if "hooked_transformer" in kinds else "; HookedTransformer is not available in this TransformerLens version"
    raise TypeError(
        f"ModelAdapter supports TransformerLens models only: {listed}{note}. "
        f"Got {type(model).__module__}.{type(model).__qualname__}."
    )


class _FusedQKVPart(torch.nn.Module):
    """Q, K or V of a fused query-key-value ``nn.Linear``, read from the fused weight when used.

    TransformerLens's bridge splits a fused projection (GPT-NeoX's
    ``query_key_value``) into three ``nn.Linear`` copies and keeps the fused one
    in the Hugging Face module: a second copy of a quarter of every block's
    weights. This module stands in for one of the copies: its ``weight``/``bias``
    are gathered from the fused tensors on use (a transient ``[d, d]`` block), so
    the forward is the same ``F.linear`` on the same numbers. Assigning a
    ``weight``/``bias`` (TransformerLens's weight processing does) stores it here,
    as in an ``nn.Linear``.
    """

    def __init__(self, fused: torch.nn.Linear, index: Tensor, out_features: int) -> None:
        super().__init__()
        object.__setattr__(self, "_fused", fused)  # not a submodule: the Hugging Face model owns it
        self.register_buffer("_rows", index, persistent=False)
        self.in_features = int(fused.in_features)
        self.out_features = int(out_features)

    def _gather(self, name: str) -> Tensor | None:
        value = getattr(self._fused, name, None)
        if value is None:
            return None
        return value.index_select(0, self._rows.to(value.device))

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("weight", "bias"):
                value = self._gather(name)
                return None if value is None else torch.nn.Parameter(value.detach(), requires_grad=False)
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("weight", "bias") and (value is None or isinstance(value, Tensor)):
            # An assigned tensor is this module's own from now on (as nn.Linear holds it).
            self._parameters[name] = value if value is None or isinstance(value, torch.nn.Parameter) \
                else torch.nn.Parameter(value, requires_grad=value.requires_grad)
            return
        super().__setattr__(name, value)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        # The state dict holds q, k, v as TransformerLens's copies would (its weight processing reads them).
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("weight", "bias"):
            if name not in self._parameters:
                value = self._gather(name)
                if value is not None:
                    destination[prefix + name] = value.detach()

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        for name in ("weight", "bias"):
            key = prefix + name
            if key in state_dict and name not in self._parameters:
                self._parameters[name] = torch.nn.Parameter(state_dict[key].detach().clone(), requires_grad=False)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x: Tensor) -> Tensor:
        weight = self._parameters.get("weight")
        weight = self._gather("weight") if weight is None else weight
        bias = self._parameters["bias"] if "bias" in self._parameters else self._gather("bias")
        return torch.nn.functional.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, shares the fused weight"


def _fused_row_sets(n_rows: int, n_heads: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Candidate (q, k, v) row indices of a fused ``[3 * n_heads * d_head, d]`` weight, most common first.

    GPT-NeoX interleaves per head (``[q_h0, k_h0, v_h0, q_h1, ...]``); others stack ``[Q; K; V]``.
    """
    d_head = n_rows // (3 * max(n_heads, 1))
    rows = torch.arange(n_rows)
    layouts = []
    if n_heads > 0 and n_rows == 3 * n_heads * d_head:
        per_head = rows.view(n_heads, 3, d_head)
        layouts.append(tuple(per_head[:, j].reshape(-1) for j in range(3)))
    if n_rows % 3 == 0:
        layouts.append(tuple(rows.view(3, -1)[j] for j in range(3)))
    return layouts


def _share_fused_qkv(attention: Any) -> bool:
    """Replace a joint-QKV attention bridge's q/k/v copies by views of its fused weight; True when shared.

    Only done when the copies equal the fused weight's rows exactly (checked), so any layout
    other than the known ones keeps TransformerLens's copies.
    """
    fused = getattr(attention, "original_component", None)
    fused = getattr(fused, "query_key_value", None)
    parts = [getattr(attention, name, None) for name in ("q", "k", "v")]
    if not isinstance(fused, torch.nn.Linear) or any(p is None for p in parts):
        return False
    linears = [getattr(p, "original_component", None) for p in parts]
    if not all(isinstance(lin, torch.nn.Linear) for lin in linears):
        return False
    weight, bias = fused.weight, fused.bias
    n_heads = int(getattr(getattr(attention, "config", None), "n_heads", 0) or 0)
    with torch.no_grad():
        for layout in _fused_row_sets(weight.shape[0], n_heads):
            same = all(
                lin.weight.shape == (idx.numel(), weight.shape[1])
                and torch.equal(lin.weight, weight.index_select(0, idx.to(weight.device)))
                and ((lin.bias is None) == (bias is None))
                and (bias is None or torch.equal(lin.bias, bias.index_select(0, idx.to(bias.device))))
                for lin, idx in zip(linears, layout)
            )
            if same:
                for part, idx in zip(parts, layout):
                    part.set_original_component(_FusedQKVPart(fused, idx.to(weight.device), idx.numel()))
                return True
    return False


@contextmanager
def _shared_qkv_while_booting() -> Iterator[list[bool]]:
    """While booting, replace each joint-QKV bridge's q/k/v copies as soon as they are made.

    One block's copies exist at a time, so the boot never holds a second copy of the
    attention weights. Yields the list of per-block outcomes (True: shared).
    """
    outcomes: list[bool] = []
    try:
        from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
            JointQKVAttentionBridge,
        )
    except ImportError:  # a TransformerLens without the component: nothing to share
        yield outcomes
        return
    original = JointQKVAttentionBridge.set_original_component

    def set_and_share(self: Any, original_component: torch.nn.Module) -> None:
        original(self, original_component)
        outcomes.append(_share_fused_qkv(self))

    JointQKVAttentionBridge.set_original_component = set_and_share
    try:
        yield outcomes
    finally:
        JointQKVAttentionBridge.set_original_component = original


@contextmanager
def _no_package_installs() -> Iterator[None]:
    """While booting, keep TransformerLens from pip-installing torchvision into the user's environment.

    TransformerLens 4.3 installs torchvision on the fly when a multimodal model's processor
    cannot load without it, which can replace a pinned CPU torch with a CUDA build. Here the
    processor is left out instead (geolens reads text only); the model boots the same.
    """
    try:
        from transformer_lens.model_bridge.sources.transformers import helpers
    except ImportError:  # another TransformerLens layout: nothing to guard
        yield
        return
    original = getattr(helpers, "_ensure_torchvision", None)
    if original is None:
        yield
        return

    def importable_only() -> bool:
        import importlib.util

        return importlib.util.find_spec("torchvision") is not None

    helpers._ensure_torchvision = importable_only
    try:
        yield
    finally:
        helpers._ensure_torchvision = original


def _is_hf_model(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "config") and hasattr(obj, "get_output_embeddings")


def boot_bridge(
    name_or_path: Any,
    *,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    tokenizer: Any = None,
    share_qkv: bool = True,
) -> Any:
    """Boot a Hugging Face model as a ``TransformerBridge``: a local folder, a hub name (where the hub is reachable), or a loaded model.

    The weights are left unprocessed (no ``enable_compatibility_mode``), so the
    raw ``W_U`` is the model's own unembedding. ``revision`` picks a hub
    revision (e.g. Pythia's ``"step64000"``).

    A loaded ``transformers`` model (e.g. built on the meta device and initialised
    in bf16) is wrapped as it is: no copy of its weights, no move, no cast
    (``dtype``, default its own, must match it; ``device`` too). From a folder or
    the hub ``dtype`` defaults to float32.

    With ``share_qkv`` (default) a fused query-key-value projection (GPT-NeoX /
    Pythia) is not copied into separate q, k, v weights as TransformerLens
    otherwise does: the bridge's q, k, v read the fused weight's rows (same
    values, same forward), so the model's memory stays that of its weights.

    TransformerLens 4.3 pip-installs torchvision when a multimodal model's processor needs it;
    here it never installs anything (the processor, which geolens does not use, is left out).

    Example:
        >>> model = boot_bridge("EleutherAI/pythia-410m", revision="step64000")   # needs the hub  # doctest: +SKIP
        >>> model = boot_bridge(model_path)   # a local Hugging Face folder (here the tiny example model)
        >>> type(model).__name__, model.cfg.d_model, geolens.as_adapter(model).processing["fold_ln"]
        ('TransformerBridge', 64, False)
    """
    _, bridge = _tl_classes()
    if bridge is None:
        raise ImportError("TransformerBridge is not importable: install transformer-lens >= 3.0")
    if not isinstance(share_qkv, bool):
        raise TypeError(f"share_qkv must be a bool, got {type(share_qkv).__name__}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")
    if _is_hf_model(name_or_path):
        name, kwargs = _loaded_model_options(name_or_path, revision=revision, device=device, dtype=dtype)
    elif isinstance(name_or_path, (str, bytes)) or hasattr(name_or_path, "__fspath__"):
        name, kwargs = _named_model_options(name_or_path, revision=revision, device=device, dtype=dtype)
    else:
        raise TypeError("name_or_path must be a folder, a hub name or a loaded transformers model, "
                        f"got {type(name_or_path).__name__}")
    if tokenizer is not None:
        if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        kwargs["tokenizer"] = tokenizer
    # A local folder whose pickled weights torch's weights-only loader refuses: an error naming its files.
    with _no_package_installs(), refused_weights_named(name):
        if not share_qkv:
            return bridge.boot_transformers(name, **kwargs)
        with _shared_qkv_while_booting():
            return bridge.boot_transformers(name, **kwargs)


def _loaded_model_options(hf_model: Any, *, revision: Any, device: Any, dtype: torch.dtype | None,
                          ) -> tuple[str, dict[str, Any]]:
    """The name and ``boot_transformers`` options of a loaded model, wrapped as it is (checked: not moved, not cast)."""
    param = next(iter(hf_model.parameters()), None)
    own_dtype = param.dtype if param is not None else torch.float32
    own_device = param.device if param is not None else torch.device("cpu")
    if own_device.type == "meta":
        raise ValueError("name_or_path: the model's weights are on the meta device; initialise them first")
    if dtype is not None and dtype != own_dtype:
        raise ValueError(f"dtype={dtype} but the model's weights are {own_dtype}: cast the model first (it is "
                         "not copied here)")
    if device is not None and torch.device(device) != own_device:
        raise ValueError(f"device={device} but the model's weights are on {own_device}: move the model first")
    if revision is not None:
        raise ValueError("revision applies to a hub name, not to a loaded model")
    name = str(getattr(hf_model.config, "_name_or_path", "") or type(hf_model).__name__)
    return name, {"hf_model": hf_model, "dtype": own_dtype, "device": str(own_device)}


def _named_model_options(name_or_path: Any, *, revision: Any, device: Any, dtype: torch.dtype | None,
                         ) -> tuple[str, dict[str, Any]]:
    """The name and ``boot_transformers`` options of a folder or hub name (float32 unless ``dtype`` says)."""
    kwargs: dict[str, Any] = {"dtype": torch.float32 if dtype is None else dtype}
    if revision is not None:
        kwargs["revision"] = str(revision)
    if device is not None:
        kwargs["device"] = str(device)
    return str(name_or_path), kwargs
