"""Subspaces of ``R^d``: orthonormal bases and Haar-random points of ``Gr(k, d)``.

A k-dimensional subspace is held as an orthonormal basis ``Q`` of shape
``[d, k]`` (columns orthonormal); coordinates of states in it are ``H @ Q``.

See docs/methods.md §A.5.

Example:
    >>> import torch
    >>> q = random_subspaces(8, 3, n=2, seed=0)        # [2, 8, 3]
    >>> bool(torch.allclose(q[0].T @ q[0], torch.eye(3, dtype=q.dtype), atol=1e-12))
    True
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from geolens._rng import rng
from geolens._validation import check_float_matrix, check_int

__all__ = ["orthonormal_basis", "random_subspaces"]


def random_subspaces(
    d: int,
    k: int,
    n: int,
    *,
    seed: int | None = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Float[torch.Tensor, "n d k"]:
    """``n`` subspaces drawn uniformly (Haar) from the Grassmannian ``Gr(k, d)``.

    QR of a ``d x k`` standard Gaussian, with the sign fix ``Q *= sign(diag(R))``
    that makes ``Q`` Haar-distributed on the Stiefel manifold (without it QR's
    sign convention biases the columns). Drawn in float64 on the CPU from
    ``seed`` (or ``generator``), so a seed gives the same subspaces on every
    device; then moved to ``dtype``/``device``.

    See docs/methods.md §A.5.

    Example:
        >>> random_subspaces(16, 4, n=10, seed=1).shape
        torch.Size([10, 16, 4])
    """
    d = check_int(d, "d", low=1)
    k = check_int(k, "k", low=1, high=d)
    n = check_int(n, "n", low=0)
    if generator is None:
        generator = rng(seed, "null subspaces")
    gaussian = torch.randn(n, d, k, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs[signs == 0] = 1.0
    q = q * signs.unsqueeze(-2)
    return q.to(dtype=dtype, device=device)


def orthonormal_basis(
    basis: Float[torch.Tensor, "d k"], *, name: str = "basis", rtol: float = 1e-6
) -> Float[torch.Tensor, "d k"]:
    """An orthonormal basis of the column span of ``basis`` (``[d, k]``, ``k <= d``).

    Already-orthonormal input is returned unchanged; otherwise QR is used.
    Rank-deficient input raises: its span is not k-dimensional.

    See docs/methods.md §A.3.

    Example:
        >>> import torch
        >>> q = orthonormal_basis(torch.tensor([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]]))
        >>> q.abs().tolist()
        [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    """
    basis = check_float_matrix(basis, name)
    d, k = basis.shape
    if k > d:
        raise ValueError(f"{name} must be [d, k] with k <= d, got shape {tuple(basis.shape)}")
    work = basis if basis.dtype in (torch.float32, torch.float64) else basis.float()
    eye = torch.eye(k, dtype=work.dtype, device=work.device)
    tol = 1e-5 if work.dtype == torch.float32 else 1e-10
    if torch.allclose(work.T @ work, eye, atol=tol):
        return work
    q, r = torch.linalg.qr(work)
    diag = torch.diagonal(r).abs()
    if bool((diag <= rtol * diag.max()).any()):
        raise ValueError(f"{name} is rank-deficient: its {k} columns do not span a {k}-dim subspace")
    return q
