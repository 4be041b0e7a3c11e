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

from typing import Sequence

import torch
from jaxtyping import Float

from geolens._validation import check_float_matrix, check_int, working_dtype
from geolens.metrics.preprocess import scaled_rows, unit_scaled

__all__ = ["cka_matrix", "linear_cka", "mutual_knn", "mutual_knn_matrix", "KNN_METRICS"]

KNN_METRICS = ("cosine", "ip")
_BLOCK_ROWS = 2048  # rows of the [block, N] similarity and membership matrices held at once (mutual k-NN)


def _paired(x: object, y: object, *, min_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate two clouds over the same rows (finite float ``[N, d]`` tensors)."""
    x = check_float_matrix(x, "x", min_rows=min_rows)
    y = check_float_matrix(y, "y", min_rows=min_rows)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same rows (N): got {x.shape[0]} and {y.shape[0]}")
    return x, y


# ----------------------------------------------------------------------------- CKA
def _cka_side(z: torch.Tensor, name: str, device: torch.device) -> torch.Tensor:
    """``z`` in float64 on ``device``, divided by a power of two and column-centred; raises if every row is the same.

    CKA is invariant to the scale of either side: the power of two (exact) keeps the fourth powers in
    ``||X^T X||_F^2`` from overflowing or underflowing.
    """
    z = unit_scaled(z.to(device=device, dtype=torch.float64))
    z = z - z.mean(dim=0)
    if not bool(z.abs().amax() > 0):
        raise ValueError(f"{name} has no variance (every row is the same): CKA is undefined")
    return z


def _gram_route(n: int, widths_x: list[int], widths_y: list[int]) -> bool:
    """Whether the Gram matrices (``O(N^2 d)`` per cloud) cost less than the ``d x d`` cross products
    (``O(N d1 d2)`` per pair and ``O(N d^2)`` per cloud): only when ``N`` is small against the widths."""
    sx, sy = sum(widths_x), sum(widths_y)
    return n * (sx + sy) < sx * sy + sum(d * d for d in widths_x) + sum(d * d for d in widths_y)


def _gram_parts(z: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gram matrix ``Z Z^T`` as its strict upper triangle and its diagonal (it is symmetric)."""
    gram = z @ z.T
    return gram[upper[0], upper[1]], gram.diagonal()


def _squared_frobenius_terms(
    xs: list[torch.Tensor], ys: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(||X_i^T Y_j||_F^2 [A, B], ||X_i^T X_i||_F^2 [A], ||Y_j^T Y_j||_F^2 [B])``, by the cheaper exact route.

    Feature space: the ``d x d`` cross products. Sample space: ``||X^T Y||_F^2 = <X X^T, Y Y^T>`` on the
    Gram matrices, each made once for all pairs (twice the strict upper triangle plus the diagonal).
    """
    n = xs[0].shape[0]
    if _gram_route(n, [x.shape[1] for x in xs], [y.shape[1] for y in ys]):
        upper = torch.triu_indices(n, n, offset=1, device=xs[0].device)
        ux, dx = (torch.stack(p) for p in zip(*(_gram_parts(x, upper) for x in xs)))
        uy, dy = (ux, dx) if ys is xs else (torch.stack(p) for p in zip(*(_gram_parts(y, upper) for y in ys)))
        cross = 2.0 * (ux @ uy.T) + dx @ dy.T
        self_x = 2.0 * torch.linalg.vecdot(ux, ux) + torch.linalg.vecdot(dx, dx)
        self_y = self_x if ys is xs else 2.0 * torch.linalg.vecdot(uy, uy) + torch.linalg.vecdot(dy, dy)
        return cross, self_x, self_y
    cross = torch.stack([torch.stack([(x.T @ y).square().sum() for y in ys]) for x in xs])
    self_x = torch.stack([(x.T @ x).square().sum() for x in xs])
    self_y = self_x if ys is xs else torch.stack([(y.T @ y).square().sum() for y in ys])
    return cross, self_x, self_y


def _unbiased_hsic(cross: torch.Tensor, ab: torch.Tensor, sums: torch.Tensor, n: int) -> torch.Tensor:
    """Unbiased HSIC (Song et al. 2012) of column-centred ``X``, ``Y`` without any ``N x N`` matrix (elementwise).

    With ``K = X X^T``, ``L = Y Y^T``, ``K~``/``L~`` their copies with zeroed diagonal,
    ``HSIC_u = [tr(K~ L~) + (1'K~1)(1'L~1) / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))``.
    Centred columns give ``K 1 = 0``, so with ``a = diag K``, ``b = diag L``:
    ``tr(K~ L~) = ||X^T Y||_F^2 - a.b``, ``1'K~1 = -sum(a)``, ``K~ 1 = -a`` and
    ``1'K~L~1 = a.b``. ``cross`` is ``||X^T Y||_F^2``, ``ab`` is ``a.b`` and ``sums`` is ``sum(a) sum(b)``.
    """
    return (cross - ab + sums / ((n - 1) * (n - 2)) - 2.0 * ab / (n - 2)) / (n * (n - 3))


def _cka(xs: list[torch.Tensor], ys: list[torch.Tensor], names_x: list[str], names_y: list[str],
         debiased: bool) -> torch.Tensor:
    """Linear CKA ``[A, B]`` of validated clouds over the same rows (``ys is xs``: each product made once)."""
    device = xs[0].device
    same = ys is xs
    xs = [_cka_side(x, name, device) for x, name in zip(xs, names_x)]
    ys = xs if same else [_cka_side(y, name, device) for y, name in zip(ys, names_y)]
    cross, self_x, self_y = _squared_frobenius_terms(xs, ys)
    if debiased:
        n = xs[0].shape[0]
        a = torch.stack([x.square().sum(dim=1) for x in xs])  # diag(X X^T) of each cloud
        b = a if same else torch.stack([y.square().sum(dim=1) for y in ys])
        cross = _unbiased_hsic(cross, a @ b.T, a.sum(dim=1)[:, None] * b.sum(dim=1)[None, :], n)
        self_x = _unbiased_hsic(self_x, a.square().sum(dim=1), a.sum(dim=1).square(), n)
        self_y = self_x if same else _unbiased_hsic(self_y, b.square().sum(dim=1), b.sum(dim=1).square(), n)
        for names, values in ((names_x, self_x), (names_y, self_y)):
            for name, value in zip(names, values):
                if not bool(value > 0):
                    raise ValueError(f"the unbiased HSIC of {name} with itself is {float(value):.3g} (not > 0): "
                                     "debiased CKA is undefined")
    return cross / (self_x.sqrt()[:, None] * self_y.sqrt()[None, :])


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
    ``N >= 4``. The one-pair case of :func:`cka_matrix`.

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
    _check_debiased(debiased)
    x, y = _paired(x, y, min_rows=4 if debiased else 2)
    return float(_cka([x], [y], ["x"], ["y"], debiased)[0, 0])


def cka_matrix(
    xs: Sequence[Float[torch.Tensor, "N d1"]],
    ys: Sequence[Float[torch.Tensor, "N d2"]] | None = None,
    *,
    debiased: bool = False,
) -> Float[torch.Tensor, "A B"]:
    """Linear CKA of every cloud of ``xs`` against every cloud of ``ys`` (all over the same ``N`` rows).

    Entry ``[i, j]`` is :func:`linear_cka` ``(xs[i], ys[j], debiased=debiased)``, but each cloud's
    products are made once for all pairs (every layer of one model against every layer of another).
    ``ys=None`` compares ``xs`` with itself. Clouds are moved to the device of ``xs[0]``.

    Args:
        xs: ``A`` finite floating-point ``[N, d]`` clouds (widths may differ).
        ys: ``B`` such clouds of the same ``N`` rows, or ``None`` for ``xs``.
        debiased: use the unbiased HSIC estimator (Song et al. 2012) for every HSIC (``N >= 4``).

    Returns:
        ``[A, B]`` float64 tensor of CKA values.

    Raises:
        TypeError: a cloud is not a floating-point tensor, ``debiased`` not a bool.
        ValueError: no clouds, wrong shapes, different ``N``, too few rows, non-finite values, or a
            cloud with no variance.

    Example:
        >>> x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
        >>> cka_matrix([x, x[:, :1]]).round(decimals=4)
        tensor([[1.0000, 0.7071],
                [0.7071, 1.0000]], dtype=torch.float64)
    """
    _check_debiased(debiased)
    clouds_x, names_x, clouds_y, names_y = _cloud_sets(xs, ys, min_rows=4 if debiased else 2)
    return _cka(clouds_x, clouds_y, names_x, names_y, debiased)


def _check_debiased(debiased: object) -> None:
    if not isinstance(debiased, bool):
        raise TypeError(f"debiased must be a bool, got {type(debiased).__name__}")


def _cloud_sets(xs: object, ys: object, *, min_rows: int) -> tuple[list, list[str], list, list[str]]:
    """Validate ``xs`` and ``ys`` (``None``: ``xs`` itself), non-empty sequences of clouds over the same rows:
    ``(clouds_x, names_x, clouds_y, names_y)`` with names ``"xs[i]"``; ``ys=None`` gives the very same lists."""
    clouds_x, names_x = _clouds(xs, "xs", min_rows)
    clouds_y, names_y = (clouds_x, names_x) if ys is None else _clouds(ys, "ys", min_rows)
    n = clouds_x[0].shape[0]
    for name, cloud in zip(names_x + names_y, clouds_x + clouds_y):
        if cloud.shape[0] != n:
            raise ValueError(f"every cloud must have the same rows (N): {names_x[0]} has {n}, {name} {cloud.shape[0]}")
    return clouds_x, names_x, clouds_y, names_y


def _clouds(clouds: object, name: str, min_rows: int) -> tuple[list[torch.Tensor], list[str]]:
    """Validate a non-empty sequence of clouds: ``(clouds, their names "name[i]")``."""
    if isinstance(clouds, torch.Tensor) or not isinstance(clouds, Sequence) or not clouds:
        raise TypeError(f"{name} must be a non-empty sequence of [N, d] tensors")
    names = [f"{name}[{i}]" for i in range(len(clouds))]
    return [check_float_matrix(c, n, min_rows=min_rows) for c, n in zip(clouds, names)], names


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
    _check_metric(metric)
    x, y = _paired(x, y, min_rows=2)
    n = x.shape[0]
    k = check_int(k, "k", low=1, high=n - 1)
    sets_x = _neighbour_sets(_prepare_knn(x, "x", metric), k)
    sets_y = _neighbour_sets(_prepare_knn(y.to(x.device), "y", metric), k)
    return float(_shared_neighbours(sets_x, [sets_y])[0] / (n * k))


def mutual_knn_matrix(
    xs: Sequence[Float[torch.Tensor, "N d1"]],
    ys: Sequence[Float[torch.Tensor, "N d2"]] | None = None,
    *,
    k: int = 10,
    metric: str = "cosine",
) -> Float[torch.Tensor, "A B"]:
    """Mutual k-NN alignment of every cloud of ``xs`` against every cloud of ``ys`` (all over the same ``N`` rows).

    Entry ``[i, j]`` is :func:`mutual_knn` ``(xs[i], ys[j], k=k, metric=metric)``, with each cloud's
    neighbour sets found once for all pairs. ``ys=None`` compares ``xs`` with itself. Clouds are
    moved to the device of ``xs[0]``.

    Returns:
        ``[A, B]`` float64 tensor of alignments in ``[0, 1]``.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> mutual_knn_matrix([x, x[[0, 2, 1, 3]]], k=1)
        tensor([[1., 0.],
                [0., 1.]], dtype=torch.float64)
    """
    _check_metric(metric)
    clouds_x, names_x, clouds_y, names_y = _cloud_sets(xs, ys, min_rows=2)
    n = clouds_x[0].shape[0]
    k = check_int(k, "k", low=1, high=n - 1)
    device = clouds_x[0].device
    sets_x = [_neighbour_sets(_prepare_knn(c.to(device), name, metric), k) for c, name in zip(clouds_x, names_x)]
    sets_y = sets_x if ys is None else [_neighbour_sets(_prepare_knn(c.to(device), name, metric), k)
                                        for c, name in zip(clouds_y, names_y)]
    return torch.stack([_shared_neighbours(a, sets_y) for a in sets_x]) / (n * k)


def _check_metric(metric: object) -> None:
    if not isinstance(metric, str):
        raise TypeError(f"metric must be a str, got {type(metric).__name__}")
    if metric not in KNN_METRICS:
        raise ValueError(f"metric must be one of {KNN_METRICS}, got {metric!r}")


def _neighbour_sets(z: torch.Tensor, k: int) -> torch.Tensor:
    """``[N, k]`` indices of each row's ``k`` most similar other rows of the prepared ``z``, in blocks of rows."""
    n = z.shape[0]
    return torch.cat([_neighbour_rows(z, slice(start, min(start + _BLOCK_ROWS, n)), k)
                      for start in range(0, n, _BLOCK_ROWS)])


def _shared_neighbours(sets_x: torch.Tensor, sets_ys: list[torch.Tensor]) -> torch.Tensor:
    """``[B]`` float64: for each of ``sets_ys``, the number of (row, neighbour) pairs it shares with ``sets_x``.

    One ``[block, N]`` membership matrix of ``sets_x`` per block of rows, read by every ``sets_ys``.
    """
    n = sets_x.shape[0]
    shared = torch.zeros(len(sets_ys), dtype=torch.float64, device=sets_x.device)
    for start in range(0, n, _BLOCK_ROWS):
        rows = slice(start, min(start + _BLOCK_ROWS, n))
        member = torch.zeros(rows.stop - rows.start, n, dtype=torch.bool, device=sets_x.device)
        member.scatter_(1, sets_x[rows], True)
        for j, sets_y in enumerate(sets_ys):
            shared[j] += member.gather(1, sets_y[rows]).sum(dtype=torch.float64)
    return shared
