"""The readout of a model: what its unembedding reads, and what the model does with its output.

Readout and weight processing
-----------------------------
The logits are ``out(head(ln_final(x)) @ W_U + b_U)``, where ``head`` (the
modules between the final norm and the unembedding, :meth:`~geolens.model.ModelAdapter.readout_head`)
and ``out`` (a logit soft-cap, scale or multiplier, :meth:`~geolens.model.ModelAdapter.output_logits`)
are identities for most models. With a LayerNorm/RMSNorm
``ln_final(x) = n(x) * w + b`` (``n`` normalises, ``w``/``b`` are the learned
weight and bias), so the matrix that reads the *normalised* state is
``diag(w) @ W_U`` — the ``"folded"`` readout of :meth:`~geolens.model.ModelAdapter.unembed_matrix`;
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

:class:`Readout` holds these methods; :class:`~geolens.model.ModelAdapter` is one (it sets the
attributes they read).

Example:
    >>> adapter.unembed_matrix("raw").shape, adapter.unembed_bias().shape
    (torch.Size([64, 200]), torch.Size([200]))
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["READOUTS", "Readout"]

READOUTS: tuple[str, ...] = ("raw", "folded")

# Bridge components between ln_final and the unembedding, in the order the model runs them.
_READOUT_HEADS: tuple[str, ...] = ("prediction_head", "mlm_head", "project_out")
_PROCESSING_KEYS: tuple[str, ...] = (
    "fold_ln",
    "center_unembed",
    "center_writing_weights",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
)


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


class Readout:
    """The readout methods of :class:`~geolens.model.ModelAdapter` (``W_U`` raw or folded, ``ln_final``,
    the readout head, the output transform, ``W_E``, ``b_U``, the weight processing recorded).

    A base class, not used alone: its methods read the attributes the adapter sets, ``model``,
    ``kind``, ``name``, ``d_model``, ``d_vocab`` and ``dtype``.
    """

    model: Any
    kind: str
    name: str
    d_model: int
    d_vocab: int
    dtype: torch.dtype
    _processing_cache: tuple[tuple[Any, ...], dict[str, Any]] | None

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
        for w_u in _matrices(candidates):
            return self._orient(w_u)
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
        for w_e in _matrices(candidates):
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


def _matrices(candidates: list[Callable[[], Any]]) -> Iterator[Tensor]:
    """Each detached 2-D tensor the candidates give, in order; a candidate this kind of model lacks is skipped.

    >>> [tuple(m.shape) for m in _matrices([lambda: torch.zeros(2, 3), lambda: None.weight, lambda: torch.zeros(4)])]
    [(2, 3)]
    """
    for get in candidates:
        try:
            value = get()
        except (AttributeError, RuntimeError, TypeError, NotImplementedError):
            continue
        if isinstance(value, Tensor) and value.ndim == 2:
            yield value.detach()
