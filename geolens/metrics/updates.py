"""Update geometry: how each block changes the residual stream (pure tensor functions).

With ``h_l`` the residual stream after block ``l`` (``h_0`` = embeddings), the
update of layer ``l`` is ``Delta_l = h_l - h_{l-1}``. For a sequential block
(``h_mid = h + attn(h)``, ``h_l = h_mid + mlp(h_mid)``) and for a parallel one
(GPT-NeoX / Pythia, GPT-J: ``h_l = h + attn(h) + mlp(h)``) alike,
``Delta_l = attn_out_l + mlp_out_l`` when the block adds nothing else to the
stream; what differs is only what the MLP reads (``h_mid`` vs ``h``).

Every function takes ``[..., N, d]`` float tensors (rows = tokens) on any device
and works along the last axis; norms are Euclidean. Zero-norm rows, where a
cosine or a ratio is undefined, raise ``ValueError`` instead of returning a
silent number.

See docs/methods.md §C.1.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> prev, nxt = torch.randn(100, 16), torch.randn(100, 16)
    >>> update_orthogonality(prev, nxt).shape
    torch.Size([100])
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from geolens._validation import check_finite, working_dtype
from geolens.metrics.preprocess import row_norms, scaled_rows
from geolens.metrics.spectral import effective_rank

__all__ = ["update", "update_orthogonality", "update_norms", "norm_ratio", "UPDATE_SUMMARY_KEYS", "update_summary"]

UPDATE_SUMMARY_KEYS = (
    "orthogonality", "update_norm", "relative_update_norm", "ffn_mha_ratio", "erank_states", "erank_updates",
)


def _check_pair(a: Tensor, b: Tensor, names: tuple[str, str]) -> None:
    for x, name in zip((a, b), names):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.ndim < 1 or x.shape[-1] < 1:
            raise ValueError(f"{name} must have a non-empty last (feature) axis, got shape {tuple(x.shape)}")
        check_finite(x, name)
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)} must have the same shape")


def _norms(x: Tensor) -> Tensor:
    return row_norms(x.to(working_dtype(x)))  # huge (or tiny) rows are scaled first: no overflow of their squares


def _nonzero(norms: Tensor, name: str) -> None:
    zero = int((norms == 0).sum())
    if zero:
        raise ValueError(f"{zero} row(s) of {name} have zero norm; the quantity is undefined there")


def update(prev: Float[Tensor, "... N d"], nxt: Float[Tensor, "... N d"]) -> Float[Tensor, "... N d"]:
    """The update ``Delta = nxt - prev`` of each row (validated, in float32 at least).

    See docs/methods.md §C.1.
    """
    _check_pair(prev, nxt, ("prev", "nxt"))
    dtype = working_dtype(prev)
    return nxt.to(dtype) - prev.to(dtype)


def update_orthogonality(prev: Float[Tensor, "... N d"], nxt: Float[Tensor, "... N d"]) -> Float[Tensor, "... N"]:
    """``|cos(Delta, prev)|`` per row, ``Delta = nxt - prev``: 0 = the update is orthogonal to the stream.

    Raises ``ValueError`` if a row of ``prev`` or of ``Delta`` is zero (no angle).

    See docs/methods.md §C.1.

    Example:
        >>> import torch
        >>> prev = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
        >>> update_orthogonality(prev, prev + torch.tensor([[0.0, 2.0], [3.0, 0.0]]))
        tensor([0., 1.])
    """
    delta = update(prev, nxt)
    # Rows whose squares would overflow (or underflow) come back divided by a power of two, so the
    # product of the two directions is that of the states themselves.
    prev, prev_norm = scaled_rows(prev.to(delta.dtype))
    delta, delta_norm = scaled_rows(delta)
    prev_norm, delta_norm = prev_norm.squeeze(-1), delta_norm.squeeze(-1)
    _nonzero(prev_norm, "prev")
    _nonzero(delta_norm, "the update nxt - prev")
    cos = (delta * prev).sum(-1) / (prev_norm * delta_norm)
    return cos.abs().clamp(max=1.0)


def update_norms(
    prev: Float[Tensor, "... N d"], nxt: Float[Tensor, "... N d"]
) -> tuple[Float[Tensor, "... N"], Float[Tensor, "... N"]]:
    """``(||Delta||, ||Delta|| / ||prev||)`` per row, ``Delta = nxt - prev``.

    Raises ``ValueError`` if a row of ``prev`` is zero (no relative norm).

    See docs/methods.md §C.1.

    Example:
        >>> import torch
        >>> absolute, relative = update_norms(torch.tensor([[2.0, 0.0]]), torch.tensor([[2.0, 1.0]]))
        >>> absolute.item(), relative.item()
        (1.0, 0.5)
    """
    delta = update(prev, nxt)
    prev_norm = _norms(prev)
    _nonzero(prev_norm, "prev")
    absolute = _norms(delta)
    return absolute, absolute / prev_norm


def norm_ratio(a: Float[Tensor, "... N d"], b: Float[Tensor, "... N d"]) -> Float[Tensor, "... N"]:
    """``||a|| / ||b||`` per row, e.g. ``a = mlp_out``, ``b = attn_out`` (the FFN/MHA ratio).

    Raises ``ValueError`` if a row of ``b`` is zero.

    See docs/methods.md §C.1.

    Example:
        >>> import torch
        >>> norm_ratio(torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 1.0]]))
        tensor([5.])
    """
    _check_pair(a, b, ("a", "b"))
    b_norm = _norms(b)
    _nonzero(b_norm, "b")
    return _norms(a) / b_norm


def update_summary(
    resid: Float[Tensor, "Lp1 N d"],
    attn_out: Float[Tensor, "L N d"] | None = None,
    mlp_out: Float[Tensor, "L N d"] | None = None,
) -> list[dict[str, float]]:
    """Per-layer update geometry from stacked residual states ``h_0..h_L`` (and block outputs).

    Row ``l - 1`` (layer ``l = 1..L``) holds the token means of
    ``|cos(Delta_l, h_{l-1})|`` (``orthogonality``), ``||Delta_l||``
    (``update_norm``), ``||Delta_l|| / ||h_{l-1}||`` (``relative_update_norm``),
    ``||mlp_out_l|| / ||attn_out_l||`` (``ffn_mha_ratio``, NaN without block outputs)
    and the effective ranks (Roy & Vetterli, :func:`geolens.metrics.spectral.effective_rank`,
    uncentred) of ``H_l`` and of the ``Delta_l`` matrix.

    See docs/methods.md §C.1.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> rows = update_summary(torch.randn(3, 50, 8))
        >>> len(rows), rows[0]["layer"]
        (2, 1)
    """
    if resid.ndim != 3 or resid.shape[0] < 2:
        raise ValueError(f"resid must be [L + 1, N, d] with L >= 1, got shape {tuple(resid.shape)}")
    n_layers = resid.shape[0] - 1
    for blocks, name in ((attn_out, "attn_out"), (mlp_out, "mlp_out")):
        if blocks is not None and tuple(blocks.shape) != (n_layers, *resid.shape[1:]):
            raise ValueError(f"{name} must be [{n_layers}, N, d] like resid[1:], got shape {tuple(blocks.shape)}")
    have_blocks = attn_out is not None and mlp_out is not None
    ratio = norm_ratio(mlp_out, attn_out) if have_blocks else None
    prev, nxt = resid[:-1], resid[1:]
    orth = update_orthogonality(prev, nxt)
    absolute, relative = update_norms(prev, nxt)
    deltas = update(prev, nxt)
    rows = []
    for i in range(n_layers):
        rows.append(
            {
                "layer": i + 1,
                "orthogonality": float(orth[i].mean()),
                "update_norm": float(absolute[i].mean()),
                "relative_update_norm": float(relative[i].mean()),
                "ffn_mha_ratio": float(ratio[i].mean()) if ratio is not None else float("nan"),
                "erank_states": effective_rank(nxt[i], centre=False),
                "erank_updates": effective_rank(deltas[i], centre=False),
            }
        )
    return rows
