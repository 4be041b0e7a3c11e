"""Logit lens: read every layer's residual stream with the model's own final norm and unembedding.

See docs/methods.md §C.2.

``logits_l = out(head(ln_final(h_l)) @ W_U + b_U)`` (Nostalgebraist 2020), with ``h_l``
the residual stream at layer ``l`` (``0`` = embeddings, ``L`` = the last block's
output, where the lens gives exactly the model's logits). ``ln_final`` is the
model's own module (LayerNorm or RMSNorm, with its learned weight), ``W_U`` the
raw unembedding, so processed weights (``fold_ln``) are read as the model reads them.
``head`` is whatever the model runs between its final norm and its unembedding
(ModernBERT-decoder's prediction head; most models have none) and ``out`` what it
does to its logits afterwards (a logit soft-cap, scale or multiplier; most models:
nothing): :meth:`~geolens.model.ModelAdapter.readout_head` and
:meth:`~geolens.model.ModelAdapter.output_logits`.

Example:
    >>> lens = LogitLens(model)
    >>> h = torch.randn(4, 5, model.cfg.d_model)   # h: [..., d_model]
    >>> lens(h, layer=1).shape                     # [..., d_vocab]
    torch.Size([4, 5, 200])

    At the last layer the lens gives the model's own logits:

    >>> resid, logits = residual_stream(model, tokens)   # [L + 1, B, T, d], [B, T, V]
    >>> torch.allclose(lens(resid[-1], layer=2), logits, atol=1e-5)
    True
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from geolens.capture import check_hooks_fired, prepare_tokens
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.sites import RESIDUAL_SITE, check_layer, check_layers

__all__ = ["LogitLens", "unembed", "residual_stream", "layer_logits"]


def unembed(
    adapter: ModelAdapter,
    h: Float[Tensor, "... d"],
    *,
    w_u: Tensor | None = None,
    b_u: Tensor | None = None,
    matmul_dtype: torch.dtype | None = None,
) -> Float[Tensor, "... V"]:
    """``out(head(ln_final(h)) @ W_U + b_U)`` in float32 (differentiable in ``h``; the model gets no gradients).

    ``head`` and ``out`` are the model's own readout head and output transform
    (identities for most models; see the module docstring), so at the last layer
    these are the model's logits.

    ``w_u``/``b_u`` default to the adapter's raw unembedding and bias (pass cached
    copies to save the look-up). The logits are on ``w_u``'s device (the last one of a
    model split over devices). ``matmul_dtype=torch.bfloat16`` runs the
    ``[.., d] @ [d, V]`` product in bfloat16 (faster on CPUs with bf16 units;
    used for training, never for evaluation).
    """
    shape = h.shape
    w_u = adapter.unembed_matrix("raw") if w_u is None else w_u
    x = adapter.readout_head(adapter.final_norm(h))
    x = x.to(device=w_u.device, dtype=torch.float32).reshape(-1, x.shape[-1])
    if matmul_dtype is not None and matmul_dtype != torch.float32:
        logits = (x.to(matmul_dtype) @ w_u.to(matmul_dtype)).to(torch.float32)
    else:
        logits = x @ w_u.to(torch.float32)
    b_u = adapter.unembed_bias() if b_u is None else b_u
    if b_u is not None:
        logits = logits + b_u.to(device=logits.device, dtype=torch.float32)
    logits = adapter.output_logits(logits)
    return logits.reshape(*shape[:-1], logits.shape[-1])


class LogitLens(nn.Module):
    """The logit lens as a module: ``forward(h, layer) = unembed(ln_final(h))`` for any layer ``0..L``.

    Holds no parameters; the model is referenced, not registered (its weights stay
    out of ``state_dict`` and ``parameters()``).

    Example:
        >>> LogitLens(model)(torch.randn(5, model.cfg.d_model), layer=0).shape
        torch.Size([5, 200])
        >>> list(LogitLens(model).parameters())   # the model's weights are not registered
        []
    """

    kind = "logit"

    def __init__(self, model: Model) -> None:
        super().__init__()
        adapter = as_adapter(model)
        object.__setattr__(self, "_adapter", adapter)  # plain attribute: not a submodule
        self.n_layers = adapter.n_layers
        self.d_model = adapter.d_model
        self.d_vocab = adapter.d_vocab
        self.model_name = adapter.name

    @property
    def adapter(self) -> ModelAdapter:
        return self._adapter

    def transform(self, h: Float[Tensor, "... d"], layer: int) -> Float[Tensor, "... d"]:
        """The state handed to ``ln_final``: ``h`` itself for the logit lens."""
        check_layer(RESIDUAL_SITE, layer, n_layers=self.n_layers)
        return h

    def forward(
        self, h: Float[Tensor, "... d"], layer: int, *, matmul_dtype: torch.dtype | None = None,
        w_u: Tensor | None = None, b_u: Tensor | None = None,
    ) -> Float[Tensor, "... V"]:
        """Logits ``[..., d_vocab]`` of the residual states ``h`` ``[..., d_model]`` taken at ``layer``."""
        if h.shape[-1] != self.d_model:
            raise ValueError(f"h must end in d_model = {self.d_model}, got shape {tuple(h.shape)}")
        return unembed(self.adapter, self.transform(h, layer), w_u=w_u, b_u=b_u, matmul_dtype=matmul_dtype)


def residual_stream(
    model: Model,
    tokens,
    *,
    attention_mask: Tensor | None = None,
) -> tuple[Float[Tensor, "Lp1 B T d"], Float[Tensor, "B T V"]]:
    """The full residual stream ``h_0..h_L`` ``[L + 1, B, T, d]`` of one batch and the model's logits.

    One forward pass under ``no_grad``; the hooks are removed afterwards. For
    small inputs (memory grows with ``B * T * L``).
    """
    adapter = as_adapter(model)
    batch = prepare_tokens(adapter, tokens, attention_mask)
    names = [adapter.block_hook_name("resid_pre", 0)]
    names += [adapter.block_hook_name("resid_post", b) for b in range(adapter.n_layers)]
    store: list[Tensor | None] = [None] * len(names)
    device = adapter.device

    def keeper(slot: int):
        def keep(activation, hook=None):  # bridges report the canonical hook name, so key by slot
            store[slot] = activation.detach().to(device)  # one device, also for a model split over several

        return keep

    logits = adapter.run_with_hooks(batch.tokens, batch.attention_mask,
                                    fwd_hooks=[(n, keeper(i)) for i, n in enumerate(names)])
    check_hooks_fired(adapter, names, [n for n, s in zip(names, store) if s is not None], "these tokens")
    return torch.stack(store), logits.detach()


@torch.no_grad()
def layer_logits(
    model: Model,
    tokens,
    *,
    lens: nn.Module | None = None,
    layers: Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
) -> Float[Tensor, "layers B T V"]:
    """Lens logits of every position of a (small) batch at each layer (default ``0..L``).

    ``lens=None`` is the logit lens. For large inputs use
    :func:`geolens.lens.evaluate`, which samples positions.

    Example:
        >>> layer_logits(model, ["the cat sat"]).shape   # [layers 0..2, B, T, d_vocab]
        torch.Size([3, 1, 3, 200])
    """
    adapter = as_adapter(model)
    lens = LogitLens(adapter) if lens is None else lens
    layers = list(range(adapter.n_layers + 1)) if layers is None else check_layers(RESIDUAL_SITE, layers, n_layers=adapter.n_layers)
    resid, _ = residual_stream(adapter, tokens, attention_mask=attention_mask)
    return torch.stack([lens(resid[l].to(torch.float32), l) for l in layers])
