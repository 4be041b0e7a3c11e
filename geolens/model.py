"""One adapter over the TransformerLens model kinds geolens can measure.

Everything else in geolens talks to a :class:`ModelAdapter`; this module is the
only place that knows which TransformerLens (TL) version is installed and how
each model kind names its hooks and stores its unembedding.

Supported kinds
---------------
* ``"hooked_transformer"`` — ``transformer_lens.HookedTransformer`` (TL <= 3.x;
  TL 4.x removed it, and ``from transformer_lens import HookedTransformer``
  raises ``ImportError`` there).
* ``"bridge"`` — ``transformer_lens.model_bridge.TransformerBridge`` (TL 3.x and
  4.x), booted with ``boot_transformers`` (a Hugging Face model) or
  ``boot_native`` (a TL-native model).

Bridges register the HookedTransformer hook names (``blocks.{i}.hook_resid_pre``,
``..hook_resid_mid``, ``..hook_resid_post``, ``..hook_attn_out``,
``..hook_mlp_out``) as aliases when they are built, in TL 3.9 and 4.x alike, so
no call is needed to get them. The adapter never calls
``enable_compatibility_mode()``: with its defaults it rewrites the weights
(fold_ln, centering), which would change the very geometry being measured.

Readout and weight processing
-----------------------------
The logits are ``out(head(ln_final(x)) @ W_U + b_U)``, where ``head`` (the
modules between the final norm and the unembedding, :meth:`ModelAdapter.readout_head`)
and ``out`` (a logit soft-cap, scale or multiplier, :meth:`ModelAdapter.output_logits`)
are identities for most models. With a LayerNorm/RMSNorm
``ln_final(x) = n(x) * w + b`` (``n`` normalises, ``w``/``b`` are the learned
weight and bias), so the matrix that reads the *normalised* state is
``diag(w) @ W_U`` — the ``"folded"`` readout of :meth:`ModelAdapter.unembed_matrix`;
``"raw"`` is ``W_U`` itself.

TL can process the weights at load time, and that changes what ``W_U`` is:

* ``fold_ln`` multiplies ``ln_final``'s weight into ``W_U`` (``W_U <- diag(w) @ W_U``,
  ``b_U <- b_U + b @ W_U``) and removes it: HookedTransformer swaps ``ln_final`` for
  ``LayerNormPre``/``RMSNormPre`` (no weight) and sets
  ``cfg.normalization_type`` to ``"LNPre"``/``"RMSPre"``; a bridge keeps the module
  and sets its weight to ones (bias to zeros). After folding, the raw ``W_U``
  already *is* the folded readout, so ``unembed_matrix("folded")`` returns ``W_U``
  unchanged (it does not raise) — check ``processing["fold_ln"]`` to tell.
* ``center_unembed`` subtracts from ``W_U`` its mean over the vocabulary
  (``W_U <- W_U - W_U.mean(-1, keepdim=True)``). Softmax is shift invariant, so
  probabilities do not change, but the readout subspace does: the column space
  loses the direction ``W_U @ 1``. Geometry measured against the readout
  subspace (e.g. principal angles) therefore differs between centred and
  uncentred weights.
* ``center_writing_weights`` / ``fold_value_biases`` move the residual stream by
  per-token constants / move biases between components; they do not touch ``W_U``.

Neither TL version records these options in ``model.cfg`` except through
``normalization_type`` (HookedTransformer's fold_ln). Bridges only record that
*some* processing happened (``model._weights_processed``). ``processing`` reports
what is recorded and, where a value is only read off the weights, lists the key
under ``processing["inferred"]``.

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

import functools
import inspect
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import torch
from torch import Tensor

from geolens._validation import refused_weights_named

__all__ = ["READOUTS", "Model", "ModelAdapter", "as_adapter", "boot_bridge", "supported_kinds"]

READOUTS: tuple[str, ...] = ("raw", "folded")

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
# Bridge components between ln_final and the unembedding, in the order the model runs them.
_READOUT_HEADS: tuple[str, ...] = ("prediction_head", "mlm_head", "project_out")
_PROCESSING_KEYS: tuple[str, ...] = (
    "fold_ln",
    "center_unembed",
    "center_writing_weights",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
)


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


def _kind_of(model: Any) -> str:
    """Return the kind of ``model`` or raise ``TypeError`` naming the supported kinds."""
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


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


class ModelAdapter:
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
        self.kind: str = _kind_of(model)
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

    # ------------------------------------------------------------------ readout
    def _ln_final_weight(self) -> Tensor | None:
        """Effective affine weight of ``ln_final`` (``1 + w`` for offset RMSNorms), or ``None``."""
        ln_final = getattr(self.model, "ln_final", None)
        if ln_final is None:
            return None
        weight = None
        for attr in ("w", "weight"):  # HookedTransformer: .w; bridge: .weight (and a .w alias)
            try:
                weight = getattr(ln_final, attr)
            except AttributeError:
                continue
            if isinstance(weight, Tensor):
                break
            weight = None
        if weight is None:
            return None
        weight = weight.detach()
        if self._ln_final_uses_offset(ln_final):
            weight = 1.0 + weight  # Gemma-style RMSNorm stores w - 1 and multiplies by 1 + w
        return weight

    def _ln_final_uses_offset(self, ln_final: Any) -> bool:
        # HookedTransformer adds the 1 into the stored weight when it converts
        # such models; bridges keep HF's storage and apply 1 + w in forward:
        # TL 4.x exposes that as `uses_weight_offset`, TL 3.9 reads the cfg flag.
        if self.kind != "bridge":
            return False
        if hasattr(type(ln_final), "uses_weight_offset"):
            return bool(ln_final.uses_weight_offset)
        return bool(getattr(self.model.cfg, "rmsnorm_uses_offset", False))

    def _ln_final_bias(self) -> Tensor | None:
        ln_final = getattr(self.model, "ln_final", None)
        for attr in ("b", "bias"):
            value = getattr(ln_final, attr, None) if ln_final is not None else None
            if isinstance(value, Tensor):
                return value.detach()
        return None

    def _raw_unembed(self) -> Tensor:
        """``W_U`` as [d_model, d_vocab], from wherever this kind keeps it."""
        candidates: list[Callable[[], Any]] = [
            lambda: self.model.W_U,  # both kinds (bridges: property over unembed.W_U)
            lambda: self.model.unembed.W_U,
            lambda: self.model.unembed.weight.T,  # bridge UnembeddingBridge over an nn.Linear
            lambda: self.model.original_model.get_output_embeddings().weight.T,  # the HF module
        ]
        for get in candidates:
            try:
                w_u = get()
            except (AttributeError, RuntimeError, TypeError, NotImplementedError):
                continue
            if isinstance(w_u, Tensor) and w_u.ndim == 2:
                return self._orient(w_u.detach())
        raise ValueError(f"cannot find the unembedding matrix of {self.name!r}")

    def _orient(self, w_u: Tensor) -> Tensor:
        if tuple(w_u.shape) == (self.d_model, self.d_vocab):
            return w_u
        if tuple(w_u.shape) == (self.d_vocab, self.d_model):
            return w_u.T
        raise ValueError(f"unembedding has shape {tuple(w_u.shape)}, expected ({self.d_model}, {self.d_vocab})")

    def unembed_matrix(self, readout: str = "raw") -> Tensor:
        """The unembedding as a detached [d_model, d_vocab] tensor.

        ``"raw"``: ``W_U`` as stored (reads ``final_hook_name``'s activation).
        ``"folded"``: ``diag(w) @ W_U`` with ``w`` ``ln_final``'s weight (reads the
        normalised state before the weight). If ``ln_final`` has no weight (fold_ln
        already applied, LNPre, or no final norm), ``W_U`` already is the folded
        readout and is returned as is; ``processing["fold_ln"]`` says which.
        The raw matrix is a view of the weights: clone it before editing in place.

        >>> adapter.unembed_matrix("folded").shape
        torch.Size([64, 200])
        >>> torch.equal(adapter.unembed_matrix("folded"), adapter.unembed_matrix("raw"))   # ln_final has a weight
        False
        """
        if readout not in READOUTS:
            raise ValueError(f"unknown readout {readout!r}; choose from {READOUTS}")
        w_u = self._raw_unembed()
        if readout == "raw":
            return w_u
        weight = self._ln_final_weight()
        if weight is None:
            return w_u
        return weight.to(w_u.dtype).unsqueeze(-1) * w_u  # == diag(weight) @ W_U without the d x d matrix

    def embedding_matrix(self) -> Tensor:
        """The token embedding ``W_E`` as a detached ``[d_vocab_in, d_model]`` tensor (one row per token).

        HookedTransformer and TransformerBridge (TransformerLens 3.9 and 4.x) expose
        ``model.W_E``; ``model.embed.W_E`` and the HF input embeddings are fallbacks.

        >>> adapter.embedding_matrix().shape
        torch.Size([200, 64])
        """
        m = self.model
        candidates: list[Callable[[], Any]] = [
            lambda: m.W_E,
            lambda: m.embed.W_E,
            lambda: m.embed.weight,
            lambda: m.original_model.get_input_embeddings().weight,
        ]
        for get in candidates:
            try:
                w_e = get()
            except (AttributeError, RuntimeError, TypeError, NotImplementedError):
                continue
            if isinstance(w_e, Tensor) and w_e.ndim == 2:
                w_e = w_e.detach()
                if w_e.shape[-1] != self.d_model and w_e.shape[0] == self.d_model:
                    w_e = w_e.T
                if w_e.shape[-1] == self.d_model:
                    return w_e
        raise ValueError(f"cannot find the embedding matrix W_E of {self.name!r}")

    def final_norm(self, h: Tensor) -> Tensor:
        """``ln_final(h)`` for states ``[..., d_model]`` in the model's dtype (``h`` itself without a final norm).

        The model's own module runs (no copy of its weights), so gradients flow to
        ``h`` and the result is exactly what the unembedding reads.
        """
        ln_final = getattr(self.model, "ln_final", None)
        if ln_final is None:
            return h
        shape = h.shape
        param = next(iter(ln_final.parameters()), None)  # its device: the last one of a split model
        x = h.reshape(1, -1, shape[-1]).to(dtype=self.dtype, device=param.device if param is not None else h.device)
        return ln_final(x).reshape(shape)  # [1, N, d]: every norm module accepts [batch, pos, d]

    def readout_head(self, x: Tensor) -> Tensor:
        """The modules a bridge runs between ``ln_final`` and the unembedding, applied to ``x`` ``[..., d_model]``.

        ModernBERT-decoder's prediction head (dense, activation, norm), OPT-350m's
        ``project_out``: the model's own modules run (gradients flow to ``x``). Most
        models have none, and ``x`` comes back as it is.

        >>> h = torch.randn(3, adapter.d_model)
        >>> torch.equal(adapter.readout_head(h), h)   # GPT-NeoX: ln_final feeds the unembedding directly
        True
        """
        for module in self._readout_heads():
            shape = x.shape
            x = module(x.reshape(1, -1, shape[-1])).reshape(*shape[:-1], -1)
        return x

    def _readout_heads(self) -> list[torch.nn.Module]:
        if self.kind != "bridge":
            return []
        modules = getattr(self.model, "_modules", {})
        return [modules[name] for name in _READOUT_HEADS if isinstance(modules.get(name), torch.nn.Module)]

    def output_logits(self, logits: Tensor) -> Tensor:
        """The model's own transform of its unembedding's output ``logits`` ``[..., d_vocab]``.

        What the model does to ``h @ W_U + b_U`` before it returns its logits: a final
        logit soft-cap ``c * tanh(z / c)`` (Gemma 2, RecurrentGemma, Gemma 4, NanoChat), a
        logit scale (Cohere), a logit divisor or multiplier (Granite, Falcon-H1). A bridge
        applies what its TransformerLens architecture adapter declares
        (``apply_output_logits_transform``); a HookedTransformer its
        ``cfg.output_logits_soft_cap``. The identity for most models.

        >>> z = torch.randn(2, adapter.d_vocab)
        >>> torch.equal(adapter.output_logits(z), z)   # GPT-NeoX returns its unembedding's output as it is
        True
        """
        transform = getattr(getattr(self.model, "adapter", None), "apply_output_logits_transform", None)
        if self.kind == "bridge" and callable(transform):
            return transform(logits)
        cap = getattr(self.model.cfg, "output_logits_soft_cap", None)
        if isinstance(cap, numbers.Real) and cap > 0:
            return float(cap) * torch.tanh(logits / float(cap))
        return logits

    def unembed_bias(self) -> Tensor | None:
        """``b_U`` as a detached [d_vocab] tensor, or ``None`` if the model has none."""
        for get in (lambda: self.model.b_U, lambda: self.model.unembed.b_U):
            try:
                b_u = get()
            except (AttributeError, RuntimeError, TypeError, NotImplementedError):
                continue
            if isinstance(b_u, Tensor):
                return b_u.detach()
        return None

    # ------------------------------------------------------------------ processing
    @property
    def processing(self) -> dict[str, Any]:
        """Weight processing recorded for the model (a fresh copy; see the module docstring).

        Keys: ``fold_ln``, ``center_unembed``, ``center_writing_weights``,
        ``fold_value_biases``, ``refactor_factored_attn_matrices`` (True / False /
        None = unknown); ``normalization_type``; ``weights_processed`` and
        ``compatibility_mode`` (bridges; None for HookedTransformer);
        ``unembed_centered`` (measured: every row of W_U has zero mean over the
        vocabulary); ``inferred`` (keys read off the weights, not a record).
        Recomputed when the model's processing state changes.

        >>> adapter.processing["fold_ln"], adapter.processing["weights_processed"]   # raw Hugging Face weights
        (False, False)
        """
        key = self._processing_state()
        if self._processing_cache is None or self._processing_cache[0] != key:
            self._processing_cache = (key, self._read_processing())
        return dict(self._processing_cache[1])

    def _processing_state(self) -> tuple[Any, ...]:
        # What TL changes when it processes weights; a change invalidates the cache.
        cfg = self.model.cfg
        return (
            getattr(cfg, "normalization_type", None),
            getattr(cfg, "layer_norm_folding", None),
            getattr(self.model, "_weights_processed", None),
            getattr(self.model, "compatibility_mode", None),
            id(getattr(self.model, "ln_final", None)),
        )

    def _read_processing(self) -> dict[str, Any]:
        """Collect the recorded (or, failing that, weight-inferred) processing flags."""
        cfg = self.model.cfg
        norm = getattr(cfg, "normalization_type", None)
        out: dict[str, Any] = {key: _as_bool(getattr(cfg, key, None)) for key in _PROCESSING_KEYS}
        out["normalization_type"] = norm
        out["weights_processed"] = None
        out["compatibility_mode"] = None
        inferred: list[str] = []
        if getattr(cfg, "layer_norm_folding", False) is True:
            out["fold_ln"] = True
        if self.kind == "hooked_transformer":
            self._hooked_processing(out, norm)
        else:
            self._bridge_processing(out, inferred)
        out["unembed_centered"] = self._unembed_is_centered()
        if out["center_unembed"] is None and out["weights_processed"] is not False:
            out["center_unembed"] = out["unembed_centered"]
            inferred.append("center_unembed")
        out["inferred"] = tuple(inferred)
        return out

    @staticmethod
    def _hooked_processing(out: dict[str, Any], norm: Any) -> None:
        # HookedTransformer records fold_ln only by swapping LN -> LNPre (RMS -> RMSPre).
        if out["fold_ln"] is None:
            if norm in ("LNPre", "RMSPre"):
                out["fold_ln"] = True
            elif norm in ("LN", "RMS", None):
                out["fold_ln"] = False

    def _bridge_processing(self, out: dict[str, Any], inferred: list[str]) -> None:
        processed = _as_bool(getattr(self.model, "_weights_processed", None))
        out["weights_processed"] = processed
        out["compatibility_mode"] = _as_bool(getattr(self.model, "compatibility_mode", None))
        if processed is False:
            # Raw Hugging Face / native weights: nothing was folded or centred.
            for key in _PROCESSING_KEYS:
                if out[key] is None:
                    out[key] = False
        elif out["fold_ln"] is None:
            # Processing happened but its options are not recorded: a folded
            # bridge keeps ln_final with weight 1 and bias 0.
            out["fold_ln"] = self._ln_final_is_identity()
            inferred.append("fold_ln")

    def _ln_final_is_identity(self) -> bool | None:
        weight, bias = self._ln_final_weight(), self._ln_final_bias()
        if weight is None:
            return None
        ones = bool(torch.all(weight == 1))
        return ones and (bias is None or bool(torch.all(bias == 0)))

    def _unembed_is_centered(self, rtol: float = 1e-4) -> bool | None:
        """Whether every row of ``W_U`` has (numerically) zero mean over the vocabulary."""
        try:
            w_u = self._raw_unembed()
        except ValueError:
            return None
        # Chunked over d_model so a bf16 [d_model, 100k+] W_U is never copied whole to float32.
        means, scales = [], []
        for chunk in torch.split(w_u, 256, dim=0):
            chunk = chunk.float()
            means.append(chunk.mean(dim=-1).abs())
            scales.append(chunk.abs().mean(dim=-1))
        row_mean, row_scale = torch.cat(means), torch.cat(scales)
        scale = row_scale.mean().clamp_min(torch.finfo(torch.float32).tiny)
        return bool(torch.all(row_mean <= rtol * scale))

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
        >>> type(model).__name__, model.cfg.d_model, ModelAdapter(model).processing["fold_ln"]
        ('TransformerBridge', 64, False)
    """
    _, bridge = _tl_classes()
    if bridge is None:
        raise ImportError("TransformerBridge is not importable: install transformer-lens >= 3.0")
    if not isinstance(share_qkv, bool):
        raise TypeError(f"share_qkv must be a bool, got {type(share_qkv).__name__}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")
    kwargs: dict[str, Any] = {}
    if _is_hf_model(name_or_path):
        hf_model = name_or_path
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
        kwargs.update(hf_model=hf_model, dtype=own_dtype, device=str(own_device))
    elif isinstance(name_or_path, (str, bytes)) or hasattr(name_or_path, "__fspath__"):
        name = str(name_or_path)
        kwargs["dtype"] = torch.float32 if dtype is None else dtype
        if revision is not None:
            kwargs["revision"] = str(revision)
        if device is not None:
            kwargs["device"] = str(device)
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
