"""The unembedding's readout subspace ``V_k``.

TransformerLens stores the unembedding as ``W_U`` with shape ``[d_model, d_vocab]``;
the k directions of hidden space it reads most strongly are its top-k *left*
singular vectors (the "right singular vectors" of HF's ``[V, d]`` ``lm_head.weight``).

See docs/methods.md §A.1.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> w_u = torch.randn(16, 50)
    >>> readout_basis(w_u, 4).shape
    torch.Size([16, 4])
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from geolens._validation import check_float_matrix, check_int

__all__ = ["gram_matrix", "readout_basis", "readout_spectrum"]


# Vocabulary columns per float64 block of the Gram accumulation: d x 4096 x 8 bytes per block.
_GRAM_BLOCK = 4096


def _check_w_u(w_u: object) -> torch.Tensor:
    w_u = check_float_matrix(w_u, "W_U", finite=False)  # checked block by block in gram_matrix
    d, v = w_u.shape
    if v < d:
        raise ValueError(
            f"W_U must be [d_model, d_vocab] (TransformerLens layout) with d_vocab >= d_model, "
            f"got shape {tuple(w_u.shape)}; pass lm_head.weight.T for an HF [V, d] matrix"
        )
    return w_u


def gram_matrix(w: Float[torch.Tensor, "d V"], *, block: int = _GRAM_BLOCK) -> Float[torch.Tensor, "d d"]:
    """``W W^T`` in float64, accumulated over blocks of ``block`` columns (``W`` is ``[d, V]``, any float dtype).

    Only one ``[d, block]`` float64 block exists at a time, so a bf16 ``[d, 50k]``
    unembedding never gets a float64 (or float32) copy of itself. Equal to
    ``W.double() @ W.double().T`` up to the order of the float64 sums. NaN or
    infinite entries raise ``ValueError`` (counted block by block, too).

    Example:
        >>> import torch
        >>> w = torch.randn(3, 10, dtype=torch.float64)
        >>> torch.allclose(gram_matrix(w, block=4), w @ w.T)
        True
    """
    return _gram(check_float_matrix(w, "W", finite=False), check_int(block, "block", low=1), "W")


def _gram(w: torch.Tensor, block: int, name: str) -> torch.Tensor:
    """The blockwise Gram matrix; NaN/inf entries, counted block by block, raise ``ValueError`` naming ``name``."""
    d = w.shape[0]
    gram = torch.zeros(d, d, dtype=torch.float64, device=w.device)
    n_nan = n_inf = 0
    for start in range(0, w.shape[1], block):
        part = w[:, start : start + block].to(torch.float64)
        finite = torch.isfinite(part)
        if not bool(finite.all()):
            nan = int(torch.isnan(part).sum())
            n_nan, n_inf = n_nan + nan, n_inf + int((~finite).sum()) - nan
            continue
        gram.addmm_(part, part.T)
    if n_nan or n_inf:
        raise ValueError(f"{name} contains {n_nan} NaN and {n_inf} infinite values; geometry is undefined")
    return gram


def readout_spectrum(
    w_u: Float[torch.Tensor, "d V"],
) -> tuple[Float[torch.Tensor, "d"], Float[torch.Tensor, "d d"]]:
    """Singular values (descending) and left singular vectors of ``W_U`` (``[d, V]``).

    Uses the eigen-decomposition of the ``d x d`` Gram matrix ``W_U W_U^T`` in
    float64: the vocabulary is large and the hidden size small, so this is far
    cheaper than an SVD of ``[d, V]`` and exact to float64 rounding. The Gram
    matrix is accumulated over blocks of vocabulary columns (:func:`gram_matrix`),
    so no float64 copy of the whole ``[d, V]`` matrix is made.

    See docs/methods.md §A.1.
    """
    w_u = _check_w_u(w_u)
    eigvals, eigvecs = torch.linalg.eigh(_gram(w_u, _GRAM_BLOCK, "W_U"))
    order = torch.argsort(eigvals, descending=True)
    singular = eigvals[order].clamp_min(0).sqrt()
    return singular, eigvecs[:, order]


def readout_basis(w_u: Float[torch.Tensor, "d V"], k: int) -> Float[torch.Tensor, "d k"]:
    """Orthonormal basis ``[d, k]`` of the top-``k`` left singular directions of ``W_U``.

    ``k`` must satisfy ``1 <= k < d`` (``k = d`` is the whole space, where PGA is
    trivially 1). Returned in ``W_U``'s dtype (float32 at least) and device.
    Directions tied in singular value at the cut make ``V_k`` ill-defined: raise.

    See docs/methods.md §A.1.

    Example:
        >>> import torch
        >>> w_u = torch.zeros(4, 10); w_u[0, 0] = 3.0; w_u[1, 1] = 2.0; w_u[2, 2] = 1.0
        >>> readout_basis(w_u, 2).abs().argmax(dim=0).tolist()
        [0, 1]
    """
    w_u = check_float_matrix(w_u, "W_U", finite=False)  # NaN/inf raise in readout_spectrum, block by block
    d = w_u.shape[0]
    k = check_int(k, "k", low=1)
    if k >= d:
        raise ValueError(f"k must be < d_model = {d} (k = d is the whole space), got k = {k}")
    singular, vectors = readout_spectrum(w_u)
    if singular[k - 1] <= 0:
        raise ValueError(f"W_U has rank < k = {k}: its readout subspace is not {k}-dimensional")
    if torch.isclose(singular[k - 1], singular[k], rtol=1e-12, atol=0.0):
        raise ValueError(f"singular values {k} and {k + 1} of W_U are equal: the top-{k} subspace is not unique")
    out_dtype = w_u.dtype if w_u.dtype in (torch.float32, torch.float64) else torch.float32
    return vectors[:, :k].to(out_dtype)
