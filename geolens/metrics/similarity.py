"""Representation similarity over the same N rows: linear CKA and mutual k-NN alignment (docs/methods.md §E).

Both compare two clouds ``X [N, d1]`` and ``Y [N, d2]`` whose rows are paired
(the same token positions seen by two models, or by two layers); the widths may
differ.

* **Linear CKA** (Kornblith et al. 2019): with column-centred ``X``, ``Y``,
  ``CKA = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``, in ``[0, 1]``.
  ``debiased=True`` replaces each HSIC by the unbiased estimator of Song et al.
  (2012) on the linear Gram matrices ``K = X X^T``, ``L = Y Y^T`` (the debiased CKA
  of Nguyen et al. 2021 / Murphy et al. 2024), which is near 0, rather than near
  ``sqrt(d1 d2 / ((N + d1)(N + d2)))``, for independent clouds; it lies in ``[-1, 1]``.
  Invariant to rotations, isotropic scaling and translations of either side.
* **Mutual k-NN** (Huh et al. 2024, the platonic-representation alignment): for
  each row ``i``, the ``k`` nearest other rows in ``X`` and in ``Y`` by cosine
  similarity (or inner product); the score is the mean over rows of
  ``|kNN_X(i) ∩ kNN_Y(i)| / k``, in ``[0, 1]``; about ``k / (N - 1)`` for unrelated
  clouds. Invariant to rotations and (with cosine) to rescaling of rows.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(200, 8, generator=g, dtype=torch.float64)
    >>> q = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))[0]
    >>> round(linear_cka(x, 3.0 * x @ q + 1.0), 6), mutual_knn(x, x @ q, k=5)
    (1.0, 1.0)
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from geolens._validation import check_float_matrix, check_int, working_dtype
from geolens.metrics.preprocess import scaled_rows, unit_scaled

__all__ = ["linear_cka", "mutual_knn", "KNN_METRICS"]

KNN_METRICS = ("cosine", "ip")
_BLOCK_ROWS = 2048  # rows of the [block, N] similarity matrix held at once by mutual_knn


def _paired(x: object, y: object, *, min_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate two clouds over the same rows (finite float ``[N, d]`` tensors)."""
    x = check_float_matrix(x, "x", min_rows=min_rows)
    y = check_float_matrix(y, "y", min_rows=min_rows)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same rows (N): got {x.shape[0]} and {y.shape[0]}")
    return x, y


# ----------------------------------------------------------------------------- CKA
def _squared_frobenius_terms(
    x: Float[torch.Tensor, "N d1"], y: Float[torch.Tensor, "N d2"]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(||X^T Y||_F^2, ||X^T X||_F^2, ||Y^T Y||_F^2)``, by the cheaper of two exact routes.

    Feature space: the ``d x d`` cross products, ``O(N (d1^2 + d1 d2 + d2^2))``.
    Sample space: ``||X^T Y||_F^2 = <X X^T, Y Y^T>`` on the Gram matrices,
    ``O(N^2 (d1 + d2))``; cheaper only when ``N`` is small against the widths.
    """
    n, d1 = x.shape
    d2 = y.shape[1]
    if n * (d1 + d2) < d1 * d1 + d1 * d2 + d2 * d2:
        k, l = x @ x.T, y @ y.T
        return (k * l).sum(), k.square().sum(), l.square().sum()
    return (x.T @ y).square().sum(), (x.T @ x).square().sum(), (y.T @ y).square().sum()


def _unbiased_hsic(cross: torch.Tensor, a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """Unbiased HSIC (Song et al. 2012) of column-centred ``X``, ``Y`` without any ``N x N`` matrix.

    With ``K = X X^T``, ``L = Y Y^T``, ``K~``/``L~`` their copies with zeroed diagonal,
    ``HSIC_u = [tr(K~ L~) + (1'K~1)(1'L~1) / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))``.
    Centred columns give ``K 1 = 0``, so with ``a = diag K``, ``b = diag L``:
    ``tr(K~ L~) = ||X^T Y||_F^2 - a.b``, ``1'K~1 = -sum(a)``, ``K~ 1 = -a`` and
    ``1'K~L~1 = a.b``. ``cross`` is ``||X^T Y||_F^2``.
    """
    ab = a @ b
    return (cross - ab + a.sum() * b.sum() / ((n - 1) * (n - 2)) - 2.0 * ab / (n - 2)) / (n * (n - 3))


def linear_cka(
    x: Float[torch.Tensor, "N d1"],
    y: Float[torch.Tensor, "N d2"],
    *,
    debiased: bool = False,
) -> float:
    """Linear CKA between two clouds over the same ``N`` rows (Kornblith et al. 2019).

    Columns are centred first; everything is computed in float64 (the result is one
    scalar from ``d x d`` products, and the debiased estimator subtracts terms of
    similar size, where float32 would lose digits). Neither form builds an
    ``N x N`` matrix unless ``N`` is smaller than the widths; the debiased one needs
    ``N >= 4``.

    Args:
        x: ``[N, d1]`` finite floating-point states.
        y: ``[N, d2]`` states of the same ``N`` rows (any width; moved to ``x``'s device).
        debiased: use the unbiased HSIC estimator (Song et al. 2012) for every HSIC.

    Returns:
        CKA as a float: in ``[0, 1]`` (biased) or ``[-1, 1]`` (debiased); 1 when ``y``
        is a rotated, scaled and translated copy of ``x``.

    Raises:
        TypeError: ``x`` or ``y`` is not a floating-point tensor, ``debiased`` not a bool.
        ValueError: wrong shapes, different ``N``, too few rows, non-finite
            values, or a side with no variance (every row the same).

    Example:
        >>> x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
        >>> round(linear_cka(x @ torch.tensor([[0.6, 0.8], [-0.8, 0.6]]), 2.0 * x - 5.0), 6)  # rotated; scaled, shifted
        1.0
        >>> round(linear_cka(x, x[:, :1]), 4)      # one of two equal, uncorrelated directions: 1/sqrt(2)
        0.7071
        >>> round(linear_cka(x, x[:, :1], debiased=True), 4)
        0.5
    """
    if not isinstance(debiased, bool):
        raise TypeError(f"debiased must be a bool, got {type(debiased).__name__}")
    x, y = _paired(x, y, min_rows=4 if debiased else 2)
    # CKA is invariant to the scale of either side: each divided by a power of two (exact), so the
    # fourth powers in ||X^T X||_F^2 neither overflow nor underflow.
    x = unit_scaled(x.to(torch.float64))
    y = unit_scaled(y.to(device=x.device, dtype=torch.float64))
    x, y = x - x.mean(dim=0), y - y.mean(dim=0)
    for name, side in (("x", x), ("y", y)):
        if not bool(side.abs().amax() > 0):
            raise ValueError(f"{name} has no variance (every row is the same): CKA is undefined")
    cross, xx, yy = _squared_frobenius_terms(x, y)
    if debiased:
        n = x.shape[0]
        a, b = x.square().sum(dim=1), y.square().sum(dim=1)
        cross, xx, yy = _unbiased_hsic(cross, a, b, n), _unbiased_hsic(xx, a, a, n), _unbiased_hsic(yy, b, b, n)
        for name, self_hsic in (("x", xx), ("y", yy)):
            if not bool(self_hsic > 0):
                raise ValueError(f"the unbiased HSIC of {name} with itself is {float(self_hsic):.3g} (not > 0): "
                                 "debiased CKA is undefined")
    return float(cross / (xx.sqrt() * yy.sqrt()))


# ----------------------------------------------------------------------------- mutual k-NN
def _neighbour_rows(z: torch.Tensor, rows: slice, k: int) -> torch.Tensor:
    """Indices ``[rows, k]`` of the ``k`` most similar other rows of ``z`` for a block of rows."""
    sim = z[rows] @ z.T
    block = torch.arange(rows.start, rows.stop, device=z.device)
    sim[block - rows.start, block] = -torch.inf  # self excluded by index, also against duplicate rows
    return torch.topk(sim, k, dim=1).indices


def _prepare_knn(z: torch.Tensor, name: str, metric: str) -> torch.Tensor:
    z = z.to(working_dtype(z))
    if metric == "ip":
        return unit_scaled(z)  # one power of two for the whole side: the same order of inner products, no overflow
    z, norms = scaled_rows(z)  # rows whose squares overflow or underflow are divided by a power of two first
    zero = norms.squeeze(1) == 0
    if bool(zero.any()):
        raise ValueError(f"{name} has {int(zero.sum())} rows of zero norm: their cosine similarity is undefined "
                         "(use metric='ip' or drop them)")
    return z / norms


def mutual_knn(
    x: Float[torch.Tensor, "N d1"],
    y: Float[torch.Tensor, "N d2"],
    *,
    k: int = 10,
    metric: str = "cosine",
) -> float:
    """Mutual k-nearest-neighbour alignment (Huh et al. 2024) of two clouds over the same ``N`` rows.

    For each row ``i``: ``N_x(i)``, the ``k`` rows ``j != i`` most similar to row ``i``
    of ``x``, and ``N_y(i)`` likewise in ``y``; the score is
    ``mean_i |N_x(i) ∩ N_y(i)| / k``. Similarity is the cosine (``metric="cosine"``,
    rows normalised; zero rows raise) or the inner product (``metric="ip"``). Each
    side is computed in its own dtype (float32 at least), in blocks of rows
    (``O(block * N)`` memory), with ``torch.topk`` — no loop over rows.

    Ties: where several rows are equally similar at the ``k``-th place, the ones
    kept are ``torch.topk``'s choice (not specified, may differ between devices);
    the self row is excluded by index, so a duplicate of row ``i`` counts as a
    neighbour. Expect ties only for duplicated or highly symmetric inputs.

    Args:
        x: ``[N, d1]`` finite floating-point states.
        y: ``[N, d2]`` states of the same ``N`` rows (moved to ``x``'s device).
        k: neighbours per row, ``1 <= k <= N - 1``.
        metric: ``"cosine"`` or ``"ip"``.

    Returns:
        A float in ``[0, 1]``: 1 when every row has the same neighbours in both clouds;
        about ``k / (N - 1)`` for unrelated clouds.

    Raises:
        TypeError: non-tensor or non-float input, ``k`` not an int, ``metric`` not a str.
        ValueError: bad shapes, different ``N``, ``k`` out of range, non-finite
            values, unknown ``metric``, zero rows under the cosine.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> y = torch.tensor([[5.0, 1.0], [4.0, 2.0], [1.0, 5.0], [2.0, 4.0]])
        >>> mutual_knn(x, y, k=1)                     # the same nearest neighbour everywhere
        1.0
        >>> mutual_knn(x, y[[0, 2, 1, 3]], k=1)       # neighbours swapped
        0.0
    """
    if not isinstance(metric, str):
        raise TypeError(f"metric must be a str, got {type(metric).__name__}")
    if metric not in KNN_METRICS:
        raise ValueError(f"metric must be one of {KNN_METRICS}, got {metric!r}")
    x, y = _paired(x, y, min_rows=2)
    n = x.shape[0]
    k = check_int(k, "k", low=1, high=n - 1)
    zx = _prepare_knn(x, "x", metric)
    zy = _prepare_knn(y.to(x.device), "y", metric)
    shared = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, n, _BLOCK_ROWS):
        rows = slice(start, min(start + _BLOCK_ROWS, n))
        nx, ny = _neighbour_rows(zx, rows, k), _neighbour_rows(zy, rows, k)
        in_x = torch.zeros(rows.stop - rows.start, n, dtype=torch.bool, device=x.device)
        in_x.scatter_(1, nx, True)
        shared += in_x.gather(1, ny).sum(dtype=torch.float64)
    return float(shared / (n * k))
