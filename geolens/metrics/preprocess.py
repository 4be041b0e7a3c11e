"""Centring and common-component removal (CCR-m) of a cloud of states.

CCR-m projects the centred states onto the orthogonal complement of their top-m
principal directions: the anisotropy correction of subspace PGA (a single
dominant direction can hide an otherwise aligned geometry).

See docs/methods.md §A.2.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> h = torch.randn(100, 8, dtype=torch.float64)
    >>> out = remove_common_components(h, m=1)
    >>> bool(out.mean(0).abs().max() < 1e-12)
    True
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
import torch
from jaxtyping import Float

from geolens._renames import renamed_attributes
from geolens._validation import DegenerateError, check_float_matrix, check_int

__all__ = ["SPREAD_RTOL", "centre", "check_ccr", "check_spread", "check_spread_norms", "gram_components",
           "largest_eigenpairs", "power_of_two_scale", "principal_components", "principal_directions",
           "remove_common_components", "row_norms", "scaled_rows", "unit_scaled"]

# Spread below this many units of the input dtype's resolution is rounding, not geometry.
SPREAD_RTOL = 8.0


# ----------------------------------------------------------------------------- scale before norms
def power_of_two_scale(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The power of two ``2^e <= max |x| < 2^(e+1)`` (over ``dim``, kept as a size-1 axis; over all of ``x``
    when ``dim`` is ``None``), ``0.5`` where ``x`` is all zeros.

    ``x`` divided by it has its largest entry in ``[1, 2)``, so squares and sums of squares
    of ``d`` entries neither overflow nor underflow, and the division is exact (a power of
    two changes only the exponent): every cosine, ratio and rank of the divided numbers
    is the one of ``x``. ``2^e`` is representable for every finite ``x``, subnormals included.

    Example:
        >>> torch.log2(power_of_two_scale(torch.tensor([[3.0, -1.0], [0.0, 0.0]]) * 2.0**100, dim=-1)).tolist()
        [[101.0], [-1.0]]
    """
    largest = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    _, exponent = torch.frexp(largest)  # largest = m 2^exponent, m in [0.5, 1)
    return torch.pow(torch.tensor(2.0, dtype=x.dtype, device=x.device), (exponent - 1).to(x.dtype))


def _norms_are_safe(norms: torch.Tensor) -> bool:
    """No sum of squares behind ``norms`` overflowed or lost digits to underflow.

    A norm below ``sqrt(tiny) / eps`` may hold squares in the subnormal range (or rows
    flushed to zero); an infinite one overflowed. Between the two, squares lost below
    ``tiny`` weigh less than the dtype's resolution.
    """
    info = torch.finfo(norms.dtype)
    low = info.tiny ** 0.5 / info.eps
    return bool(((norms >= low) & (norms < float("inf"))).all())


def scaled_rows(
    x: Float[torch.Tensor, "*batch d"], *, in_place: bool = False
) -> tuple[Float[torch.Tensor, "*batch d"], Float[torch.Tensor, "*batch 1"]]:
    """``(rows, their norms)`` along the last axis, safe from overflow and underflow for any finite ``x``.

    Usually ``rows`` is ``x`` itself. Where a row's sum of squares would overflow (huge
    activations) or underflow, every row is first divided by its own
    :func:`power_of_two_scale` (exactly: the directions are those of ``x``), so
    ``rows / norms`` is the unit row of ``x`` in every case. ``in_place``: divide ``x``
    itself. Norms are ``[..., 1]``; a zero row has norm 0.

    Example:
        >>> x = torch.tensor([[3.0, 4.0]])
        >>> rows, norms = scaled_rows(x * 2.0**100)            # float32: its squares overflow
        >>> torch.equal(rows / norms, x / 5.0), torch.linalg.vector_norm(x * 2.0**100).item()
        (True, inf)
    """
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if _norms_are_safe(norms):
        return x, norms
    scale = power_of_two_scale(x, dim=-1)
    x = x.div_(scale) if in_place else x / scale
    return x, torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def row_norms(x: Float[torch.Tensor, "*batch d"]) -> Float[torch.Tensor, "*batch"]:
    """Euclidean norms of the rows (last axis) of ``x`` without overflow or underflow of their squares.

    Rows whose squares leave the dtype's range are measured divided by a power of two
    and scaled back, so a norm is ``inf`` only when the norm itself is beyond the dtype.

    Example:
        >>> x = torch.tensor([[3.0, 4.0], [3.0, 4.0]]) * torch.tensor([[2.0**100], [2.0**-100]])
        >>> (row_norms(x) * torch.tensor([2.0**-100, 2.0**100])).tolist()    # float32
        [5.0, 5.0]
        >>> torch.linalg.vector_norm(x, dim=-1).tolist()                  # the squares overflow, underflow
        [inf, 0.0]
    """
    norms = torch.linalg.vector_norm(x, dim=-1)
    if _norms_are_safe(norms):
        return norms
    scale = power_of_two_scale(x, dim=-1)
    return torch.linalg.vector_norm(x / scale, dim=-1) * scale.squeeze(-1)


def unit_scaled(x: torch.Tensor) -> torch.Tensor:
    """``x`` divided by its :func:`power_of_two_scale` (largest entry in ``[1, 2)``): exactly the same
    numbers up to one power of two, for measures that are invariant to the scale of the whole cloud
    (linear CKA, inner-product neighbours) and whose products would overflow or underflow.

    Example:
        >>> unit_scaled(torch.tensor([3.0, -1.0]) * 2.0**100).tolist()
        [1.5, -0.5]
    """
    return x / power_of_two_scale(x)


def check_ccr(m: object, n: int, d: int) -> int:
    """``m`` as an int that leaves ``n`` states in ``R^d`` at least one direction with variance.

    See docs/methods.md §A.2.
    """
    m = check_int(m, "ccr", low=0)
    if m >= min(n - 1, d):
        raise ValueError(f"ccr = {m} removes every direction of {n} states in d = {d}; need ccr < {min(n - 1, d)}")
    return m


def check_spread(
    reference: Float[torch.Tensor, "N d"],
    spread: Float[torch.Tensor, "N d"],
    *,
    dtype: torch.dtype,
    what: str,
) -> None:
    """Raise ``ValueError`` when ``spread`` (e.g. centred states) is rounding-sized next to ``reference``.

    ``||spread||_F <= SPREAD_RTOL * eps(dtype) * ||reference||_F`` means the rows
    differ only by the rounding of ``dtype`` (the dtype the numbers came in), so
    any geometry computed from them would be noise. See docs/methods.md §F.

    Example:
        >>> import torch
        >>> x = torch.full((5, 3), 1000.0)
        >>> x[0, 0] += 1e-4                      # one float32 step at 1000: rounding, not geometry
        >>> check_spread(x, centre(x), dtype=torch.float32, what="states")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        geolens._validation.DegenerateError: states are numerically constant: after centring their spread is 3.2e-08 ...
        >>> check_spread(x, centre(x), dtype=torch.float64, what="states")  # the same numbers, read as float64
    """
    reference, spread = reference.double(), spread.double()
    scale = torch.linalg.matrix_norm(reference)
    if not _norms_are_safe(scale):  # float64 squares out of range: measure both divided by one power of two
        unit = power_of_two_scale(reference)
        reference, spread = reference / unit, spread / unit
        scale = torch.linalg.matrix_norm(reference)
    check_spread_norms(float(scale), float(torch.linalg.matrix_norm(spread)), dtype=dtype, what=what)


def check_spread_norms(scale: float, size: float, *, dtype: torch.dtype, what: str) -> None:
    """:func:`check_spread`'s rule on the two Frobenius norms themselves, ``scale`` (the reference's) and ``size``
    (the spread's), for a caller that has them without the rows (a resample, from its rows' squared norms).

    Example:
        >>> check_spread_norms(1000.0, 1e-6, dtype=torch.float32, what="states")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        geolens._validation.DegenerateError: states are numerically constant: after centring their spread is 1e-09 ...
        >>> check_spread_norms(1000.0, 1e-6, dtype=torch.float64, what="states")
    """
    limit = SPREAD_RTOL * torch.finfo(dtype).eps
    if scale == 0 or size <= limit * scale:
        relative = size / scale if scale else 0.0
        raise DegenerateError(f"{what} are numerically constant: after centring their spread is {relative:.2g} of their "
                         f"scale, a zero norm at {str(dtype).removeprefix('torch.')} resolution (limit {limit:.2g})")


def centre(states: Float[torch.Tensor, "N d"]) -> Float[torch.Tensor, "N d"]:
    """Subtract the mean over tokens (rows).

    See docs/methods.md §A.2.
    """
    return states - states.mean(dim=0, keepdim=True)


def principal_components(
    centred: Float[torch.Tensor, "N d"], top: int, *, gram: bool | None = None
) -> tuple[Float[torch.Tensor, "V"], Float[torch.Tensor, "top d"]]:
    """The largest singular values of already-centred states (descending: at least ``top + 2`` of them,
    or all there are) and their top ``top`` right singular vectors (the principal directions, as rows).

    ``gram`` (default: for every dtype but float64) takes them from the smaller Gram matrix, formed in
    float64, with only the top ``top + 2`` eigenpairs computed (:func:`largest_eigenpairs`): BLAS products and
    a partial eigendecomposition, where the float32 SVD of a tall matrix costs many times more on a CPU. Its singular values
    are accurate to about ``1e-8`` of the largest, far below the float32 rounding that a rank test
    allows for (``SPREAD_RTOL * eps``). Otherwise a plain SVD (a float64 rank test needs its full
    resolution). A rank test after removing ``m < top + 1`` components needs values ``m`` and ``m + 1``
    only. Returned in the input's dtype, on its device.

    See docs/methods.md §A.2.

    Example:
        >>> x = centre(torch.randn(50, 6, dtype=torch.float64) * torch.arange(6, 0, -1, dtype=torch.float64))
        >>> sv, vh = principal_components(x, 2)
        >>> sv_g, vh_g = principal_components(x, 2, gram=True)
        >>> sv.shape, sv_g.shape, bool(torch.allclose(sv[:4], sv_g, atol=1e-9))
        (torch.Size([6]), torch.Size([4]), True)
        >>> bool(torch.allclose((vh @ vh_g.T).abs(), torch.eye(2, dtype=torch.float64), atol=1e-9))
        True
    """
    if gram is None:
        gram = centred.dtype != torch.float64
    if not gram:
        _, sv, vh = torch.linalg.svd(centred, full_matrices=False)
        return sv, vh[:top]
    x64 = centred.double()
    n, d = x64.shape
    if n >= d:
        sv, vh = gram_components(x64.T @ x64, top)
        return sv.to(centred.dtype), vh.to(centred.dtype)
    sv, top_vectors = gram_components(x64 @ x64.T, top)
    # Left vectors of a wide x: v_i = x^T u_i / s_i (the top ones; their s_i are well above 0).
    vh = (top_vectors @ x64) / sv[:top, None].clamp_min(torch.finfo(torch.float64).tiny)
    return sv.to(centred.dtype), vh.to(centred.dtype)


def gram_components(gram: Float[torch.Tensor, "d d"], top: int) -> tuple[Float[torch.Tensor, "V"], Float[torch.Tensor, "top d"]]:
    """:func:`principal_components` from the float64 Gram matrix ``x^T x`` of already-centred states: the
    largest singular values (descending, ``top + 2`` of them or all there are: square roots of the Gram
    matrix's largest eigenvalues) and the top ``top`` eigenvectors, as rows; only those eigenpairs are
    computed (:func:`largest_eigenpairs`). Float64, on the Gram matrix's device.

    Example:
        >>> x = centre(torch.randn(50, 6, dtype=torch.float64) * torch.arange(6, 0, -1, dtype=torch.float64))
        >>> sv, vh = gram_components(x.T @ x, 2)
        >>> bool(torch.allclose(sv, torch.linalg.svdvals(x)[:4], atol=1e-9)), tuple(vh.shape)
        (True, (2, 6))
    """
    lam, vec = largest_eigenpairs(gram.cpu().numpy(), min(gram.shape[0], top + 2))  # ascending
    lam, vec = torch.from_numpy(lam).to(gram.device), torch.from_numpy(vec).to(gram.device)
    return lam.flip(0).clamp_min(0.0).sqrt(), vec.flip(1)[:, :top].T


# From this size on, a few of the largest eigenpairs come faster from Lanczos iterations (ARPACK, one
# matrix-vector product each) than from LAPACK, which reduces the whole matrix to tridiagonal form first.
_LANCZOS_MIN_SIZE = 256


def largest_eigenpairs(matrix: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenvalues of the symmetric ``matrix`` (ascending) and their eigenvectors
    (columns), both to rounding.

    For a matrix of ``_LANCZOS_MIN_SIZE`` rows or more asked for at most an eighth of its pairs: ARPACK's
    implicitly restarted Lanczos (``scipy.sparse.linalg.eigsh``, converged to machine precision, from a
    fixed start vector, so a call gives the same numbers every time). Otherwise, or where ARPACK fails (no
    convergence) or the matrix is not finite (LAPACK's check then raises ``ValueError``), LAPACK's ``eigh`` on
    the requested range. Eigenvectors are defined up to sign (and within a repeated eigenvalue, up to
    rotation); CCR and every use here depend on the subspace they span alone.

    Example:
        >>> q = np.linalg.qr(np.cos(np.arange(300 * 300).reshape(300, 300)))[0]
        >>> m = (q * np.linspace(1.0, 2.0, 300)) @ q.T
        >>> lam, vec = largest_eigenpairs(m, 3)
        >>> ref = scipy.linalg.eigh(m, subset_by_index=[297, 299])
        >>> bool(np.allclose(lam, ref[0], atol=1e-12)), bool(np.allclose(np.abs(vec.T @ ref[1]), np.eye(3), atol=1e-8))
        (True, True)
    """
    size = matrix.shape[0]
    if size >= _LANCZOS_MIN_SIZE and count <= size // 8 and np.isfinite(matrix).all():
        try:
            lam, vec = scipy.sparse.linalg.eigsh(_symmetric_operator(matrix), k=count, which="LA", tol=0,
                                                 v0=_lanczos_start(size))
        except scipy.sparse.linalg.ArpackError:  # no convergence among them: LAPACK below
            pass
        else:
            order = np.argsort(lam)
            return lam[order], vec[:, order]
    return scipy.linalg.eigh(matrix, subset_by_index=[size - count, size - 1])


def _symmetric_operator(matrix: np.ndarray) -> scipy.sparse.linalg.LinearOperator:
    """``v -> matrix @ v`` by BLAS ``symv``, which reads one triangle of the symmetric ``matrix``: half the bytes
    of a full product, which is what a Lanczos step costs when the matrix is larger than the core's cache."""
    # A symmetric matrix is its own transpose: its C-ordered array, transposed, is the Fortran-ordered one symv takes.
    columns = matrix.T if matrix.flags.c_contiguous else np.asfortranarray(matrix)
    symv = scipy.linalg.blas.get_blas_funcs("symv", (columns,))
    return scipy.sparse.linalg.LinearOperator(matrix.shape, matvec=lambda v: symv(1.0, columns, v),
                                              dtype=matrix.dtype)


def _lanczos_start(size: int) -> np.ndarray:
    """A fixed start vector with no structure a Gram matrix could share (fractional parts of multiples of the
    golden ratio, centred): generic for any matrix, and the same every call."""
    return np.modf(np.arange(1, size + 1) * 0.6180339887498949)[0] - 0.5


def principal_directions(centred: Float[torch.Tensor, "N d"], m: int) -> Float[torch.Tensor, "d m"]:
    """Top-``m`` principal directions (columns, unit norm) of already-centred states
    (:func:`principal_components`).

    See docs/methods.md §A.2.
    """
    if m == 0:
        return centred.new_zeros(centred.shape[1], 0)
    return principal_components(centred, m)[1].T


def remove_common_components(states: Float[torch.Tensor, "N d"], m: int) -> Float[torch.Tensor, "N d"]:
    """Centre ``states`` and remove their top-``m`` principal components (CCR-m).

    ``m = 0`` only centres. ``m`` must leave at least one direction with
    variance: ``m < min(N - 1, d)``.

    See docs/methods.md §A.2.

    Example:
        >>> import torch
        >>> h = torch.tensor([[3.0, 0.1], [-3.0, -0.1], [0.0, 0.2]])
        >>> remove_common_components(h, 1).shape
        torch.Size([3, 2])
    """
    states = check_float_matrix(states, "states", min_rows=2)
    n, d = states.shape
    m = check_ccr(m, n, d)
    centred = centre(states)
    if m == 0:
        return centred
    pcs = principal_directions(centred, m)
    return centred - (centred @ pcs) @ pcs.T


__getattr__ = renamed_attributes(__name__, {"center": "centre"})  # the package spells it centre
