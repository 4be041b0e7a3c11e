"""One adapter over the TransformerLens model kinds geolens can measure: shape facts, hooks, tokens.

Everything else in geolens talks to a :class:`ModelAdapter`; it knows how each model kind
names its hooks (:mod:`geolens.model.boot` knows which kinds the installed TransformerLens
has, :mod:`geolens.model.readout` how the model reads its output).

The kinds are ``"hooked_transformer"`` (``transformer_lens.HookedTransformer``, TL <= 3.x) and
``"bridge"`` (``transformer_lens.model_bridge.TransformerBridge``, TL 3.x and 4.x, booted with
``boot_transformers`` from a Hugging Face model or ``boot_native``); :func:`~geolens.model.supported_kinds`
lists those of the installed TransformerLens.

Bridges register the HookedTransformer hook names (``blocks.{i}.hook_resid_pre``,
``..hook_resid_mid``, ``..hook_resid_post``, ``..hook_attn_out``,
``..hook_mlp_out``) as aliases when they are built, in TL 3.9 and 4.x alike, so
no call is needed to get them. The adapter never calls
``enable_compatibility_mode()``: with its defaults it rewrites the weights
(fold_ln, centering), which would change the very geometry being measured.

Example:
    >>> adapter = ModelAdapter(model)
    >>> adapter.block_hook_name("resid_post", 1)
    'blocks.1.hook_resid_post'
    >>> tokens, mask = adapter.tokenize(["a cat", "a dog ran"])
    >>> seen = []
    >>> def fn(activation, hook):
    ...     seen.append(tuple(activation.shape))
    >>> logits = adapter.run_with_hooks(tokens, mask, fwd_hooks=[(adapter.final_hook_name, fn)])
    >>> logits.shape, seen
    (torch.Size([2, 3, 200]), [(2, 3, 64)])
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import torch
from torch import Tensor

from geolens.model.boot import kind_of
from geolens.model.readout import Readout

__all__ = ["Model", "ModelAdapter", "as_adapter"]

Model: TypeAlias = Any
"""The type of every ``model`` argument: a TransformerLens ``HookedTransformer`` (TL <= 3.x) or
``TransformerBridge`` (or a :class:`ModelAdapter` of one).

An alias of ``typing.Any``, for reading only: which classes exist depends on the installed
TransformerLens, and the adapter checks the model when it wraps it.
"""

HookFn = Callable[..., Any]
FwdHooks = Iterable[tuple[Any, HookFn]]

# Standard (HookedTransformer) hook name per site; bridges alias these names.
_SITE_HOOKS: dict[str, str] = {
    "resid_pre": "blocks.{i}.hook_resid_pre",
    "resid_mid": "blocks.{i}.hook_resid_mid",
    "resid_post": "blocks.{i}.hook_resid_post",
    "attn_out": "blocks.{i}.hook_attn_out",
    "mlp_out": "blocks.{i}.hook_mlp_out",
}
# Canonical bridge names, used only if an alias is missing. Only the residual
# sites have an unambiguous canonical twin (block input/output); attn_out and
# mlp_out aliases are retargeted by some architectures (post-norms, scaled
# residuals), so falling back to attn/mlp.hook_out could silently mislead.
_SITE_FALLBACKS: dict[str, str] = {
    "resid_pre": "blocks.{i}.hook_in",
    "resid_post": "blocks.{i}.hook_out",
}
# Hooks that see exactly the tensor the unembedding multiplies, best first.
# HookedTransformer's ln_final.hook_normalized fires *before* the weight
# multiply (LayerNorm / RMSNorm), and so does the bridge's, so it is only
# usable when ln_final has no affine weight (LNPre / RMSPre).
_FINAL_HOOKS: tuple[str, ...] = ("unembed.hook_in", "ln_final.hook_out")


class ModelAdapter(Readout):
    """A uniform, read-only view of a HookedTransformer or a TransformerBridge.

    The adapter never changes the model's weights; hooks it adds are removed
    when the call or ``with`` block that added them ends.

    Attributes:
        model: the wrapped model.
        kind: ``"hooked_transformer"`` or ``"bridge"``.
        name: the model's ``cfg.model_name`` (or its class name).
        n_layers: number of blocks.
        d_model: residual width.
        d_vocab: output vocabulary size.
        device: of the model's parameters (a property, read live).
        dtype: of the model's parameters (a property, read live).
        tokenizer: the model's tokenizer, or ``None``.
        parallel_attn_mlp: attention and MLP both read ``resid_pre`` (GPT-NeoX/Pythia, GPT-J).
        has_resid_mid: every block exposes ``hook_resid_mid`` (False for parallel blocks).
        processing: what weight processing is recorded (property; see the module docstring).

    Example:
        >>> adapter = ModelAdapter(model)
        >>> adapter.kind, adapter.n_layers, adapter.d_model, adapter.d_vocab
        ('bridge', 2, 64, 200)
        >>> adapter.parallel_attn_mlp, adapter.has_resid_mid   # GPT-NeoX blocks
        (True, False)
    """

    def __init__(self, model: Any) -> None:
        self.kind: str = kind_of(model)
        self.model = model
        cfg = model.cfg
        self.name: str = str(getattr(cfg, "model_name", None) or type(model).__name__)
        self.n_layers: int = int(cfg.n_layers)
        self.d_model: int = int(cfg.d_model)
        self.d_vocab: int = self._read_d_vocab(cfg)
        self.tokenizer = getattr(model, "tokenizer", None)
        self.parallel_attn_mlp: bool = bool(getattr(cfg, "parallel_attn_mlp", False))
        self._hook_name_cache: set[str] | None = None
        hook_names = self._hook_names()
        self.has_resid_mid: bool = all(
            _SITE_HOOKS["resid_mid"].format(i=i) in hook_names for i in range(self.n_layers)
        )
        self._final_hook_name = self._find_final_hook(hook_names)
        self._forward_takes_mask = self._accepts_kwarg(model.forward, "attention_mask")
        self._processing_cache: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return (
            f"ModelAdapter(kind={self.kind!r}, name={self.name!r}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, d_vocab={self.d_vocab})"
        )

    # ------------------------------------------------------------------ shape facts
    def _read_d_vocab(self, cfg: Any) -> int:
        # d_vocab_out is the unembedding width; it equals d_vocab for language models
        # but differs for some algorithmic-task models.
        out = int(getattr(cfg, "d_vocab_out", -1) or -1)
        return out if out > 0 else int(cfg.d_vocab)

    @property
    def device(self) -> torch.device:
        """Device of the model's first parameter (read live, so ``model.to(...)`` is seen)."""
        param = next(iter(self.model.parameters()), None)
        if param is not None:
            return param.device
        return torch.device(getattr(self.model.cfg, "device", None) or "cpu")

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the model's first parameter."""
        param = next(iter(self.model.parameters()), None)
        return param.dtype if param is not None else getattr(self.model.cfg, "dtype", torch.float32)

    def _hook_names(self, refresh: bool = False) -> set[str]:
        # Cached: a bridge rebuilds its hook_dict (registry + aliases) on every access.
        if refresh or self._hook_name_cache is None:
            self._hook_name_cache = set(self.model.hook_dict.keys())
        return self._hook_name_cache

    @staticmethod
    def _accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    # ------------------------------------------------------------------ hooks
    def block_hook_name(self, site: str, block: int) -> str:
        """Name of the hook for ``site`` in block ``block`` (0-based).

        Raises ``ValueError`` for an unknown site, a block outside ``[0, n_layers)``,
        or a site this model lacks (``resid_mid`` in parallel blocks, ``mlp_out``
        in attention-only models).

        >>> adapter.block_hook_name("resid_post", 1)
        'blocks.1.hook_resid_post'
        >>> adapter.block_hook_name("resid_mid", 0)
        Traceback (most recent call last):
        ...
        ValueError: site 'resid_mid' is not available for '...': its blocks are parallel (...), so there is no resid_mid
        """
        if site not in _SITE_HOOKS:
            raise ValueError(f"unknown site {site!r}; choose from {tuple(_SITE_HOOKS)}")
        if isinstance(block, bool) or not isinstance(block, numbers.Integral) or not 0 <= block < self.n_layers:
            raise ValueError(f"block must be an int in [0, {self.n_layers}), got {block!r}")
        block = int(block)  # numpy / torch integer scalars format like ints from here on
        for refresh in (False, True):  # re-read once in case the model's hooks were rebuilt
            hook_names = self._hook_names(refresh=refresh)
            for template in (_SITE_HOOKS[site], _SITE_FALLBACKS.get(site)):
                if template is not None and template.format(i=block) in hook_names:
                    return template.format(i=block)
        if site == "resid_mid" and self.parallel_attn_mlp:
            reason = "its blocks are parallel (attention and MLP both read resid_pre), so there is no resid_mid"
        else:
            reason = f"the model has no hook {_SITE_HOOKS[site].format(i=block)!r}"
        raise ValueError(f"site {site!r} is not available for {self.name!r}: {reason}")

    @property
    def final_hook_name(self) -> str:
        """Hook whose output is exactly the tensor the unembedding multiplies (ln_final's output).

        ``logits == act @ unembed_matrix("raw") + b_U`` for this hook's activation ``act``.
        Raises ``ValueError`` when the model exposes no such hook.
        """
        if self._final_hook_name is None:
            raise ValueError(
                f"{self.name!r} exposes no hook on the input of its unembedding "
                f"(looked for {_FINAL_HOOKS}, and ln_final.hook_normalized on a weightless ln_final)"
            )
        return self._final_hook_name

    def _find_final_hook(self, hook_names: set[str]) -> str | None:
        for name in _FINAL_HOOKS:
            if name in hook_names:
                return name
        ln_final = getattr(self.model, "ln_final", None)
        if ln_final is not None:
            # LNPre / RMSPre: hook_normalized is the module's output.
            if "ln_final.hook_normalized" in hook_names and self._ln_final_weight() is None:
                return "ln_final.hook_normalized"
            return None
        # No final norm at all: the unembedding reads the last residual stream.
        last = f"blocks.{self.n_layers - 1}.hook_resid_post"
        return last if last in hook_names else None

    @contextmanager
    def hooks(self, fwd_hooks: FwdHooks) -> Iterator[ModelAdapter]:
        """Add forward hooks ``(name, fn)`` for the duration of a ``with`` block.

        Uses the model's own ``hooks`` context manager, which removes exactly the
        hooks it added on exit, also on an exception; hooks attached before are kept.

        >>> seen = []
        >>> def fn(activation, hook):
        ...     seen.append(tuple(activation.shape))
        >>> with adapter.hooks([(adapter.final_hook_name, fn)]):
        ...     _ = adapter.model(tokens)
        >>> _ = adapter.model(tokens)   # the hook is gone
        >>> seen
        [(1, 6, 64)]
        """
        with self.model.hooks(fwd_hooks=list(fwd_hooks)):
            yield self

    def run_with_hooks(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        fwd_hooks: FwdHooks = (),
        *,
        grad: bool = False,
    ) -> Tensor:
        """Run a forward pass on ``tokens`` [B, T] with temporary hooks; return the logits [B, T, d_vocab].

        The mask is passed to the model when its forward accepts one (both TL kinds
        do); otherwise a warning is raised and it is dropped, which only changes the
        padded positions of right-padded causal inputs. Runs under
        ``torch.no_grad()`` unless ``grad=True``. All hooks added here are removed
        afterwards, also when the forward or a hook raises.

        >>> tokens, mask = adapter.tokenize(["the cat sat", "a dog"])
        >>> kept = {}
        >>> def fn(activation, hook):
        ...     kept["resid"] = activation
        >>> logits = adapter.run_with_hooks(tokens, mask, [("blocks.0.hook_resid_post", fn)])
        >>> logits.shape, kept["resid"].shape, logits.requires_grad
        (torch.Size([2, 3, 200]), torch.Size([2, 3, 64]), False)
        """
        kwargs: dict[str, Any] = {"return_type": "logits"}
        if attention_mask is not None:
            if self._forward_takes_mask:
                kwargs["attention_mask"] = attention_mask.to(self.device)
            else:
                warnings.warn(f"{type(self.model).__name__}.forward takes no attention_mask; ignoring it", stacklevel=2)
        grad_ctx = torch.enable_grad() if grad else torch.no_grad()
        with grad_ctx, self.hooks(fwd_hooks):
            return self.model(tokens.to(self.device), **kwargs)

    # ------------------------------------------------------------------ tokens
    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can take (``n_ctx`` of a learned positional table), or ``None``.

        Rotary and ALiBi models have no fixed table, so no hard limit is known.
        """
        if getattr(self.model.cfg, "positional_embedding_type", None) == "standard":
            return int(self.model.cfg.n_ctx)
        return None

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's BOS id, or ``None`` (no tokenizer or no BOS token)."""
        value = getattr(self.tokenizer, "bos_token_id", None) if self.tokenizer is not None else None
        return int(value) if value is not None else None

    @property
    def prepends_bos(self) -> bool:
        """Whether the model's ``to_tokens`` prepends BOS by default (False for GPT-NeoX/Pythia)."""
        return bool(getattr(self.model.cfg, "default_prepend_bos", True))

    @property
    def pad_token_id(self) -> int:
        """Id written into padded positions: the tokenizer's pad, else EOS, else 0."""
        for attr in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, attr, None) if self.tokenizer is not None else None
            if value is not None:
                return int(value)
        return 0

    def tokenize(self, texts: Sequence[str], max_length: int | None = None) -> tuple[Tensor, Tensor]:
        """Tokenise ``texts`` exactly as the model's ``to_tokens`` does, right-padded.

        Returns ``(tokens, attention_mask)``, both ``long`` [B, T] on ``device``; the
        mask is 1 on real tokens. Each text is tokenised on its own so a pad id that
        equals BOS/EOS (as in GPT-2) cannot be mistaken for a real token.
        ``max_length`` truncates each sequence (after BOS); without it the model's
        own limit (``n_ctx``) applies. Raises ``ValueError`` without a tokenizer.

        >>> tokens, mask = adapter.tokenize(["the cat", "a dog ran"])   # GPT-NeoX: no BOS prepended
        >>> mask.sum(-1)
        tensor([2, 3])
        >>> tokens[0, -1].item() == adapter.pad_token_id
        True
        """
        if self.tokenizer is None:
            raise ValueError(f"{self.name!r} has no tokenizer; pass token ids instead of text")
        if isinstance(texts, str):
            raise TypeError("texts must be a list of str, not a single str")
        texts = list(texts)
        if not texts:
            raise ValueError("texts is empty")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        rows = [self._to_token_row(text)[:max_length] for text in texts]
        width = max(1, max(row.numel() for row in rows))
        tokens = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : row.numel()] = row
            mask[i, : row.numel()] = 1
        return tokens.to(self.device), mask.to(self.device)

    def _to_token_row(self, text: str) -> Tensor:
        ids = self.model.to_tokens(text, move_to_device=False)
        return ids.reshape(-1).long().cpu()


def as_adapter(model_or_adapter: Any) -> ModelAdapter:
    """Return ``model_or_adapter`` if it is already a :class:`ModelAdapter`, else wrap it.

    >>> adapter = as_adapter(model); as_adapter(adapter) is adapter
    True
    """
    if isinstance(model_or_adapter, ModelAdapter):
        return model_or_adapter
    return ModelAdapter(model_or_adapter)
