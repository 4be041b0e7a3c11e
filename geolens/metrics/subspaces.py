"""Subspaces on the Grassmannian: principal angles, RSS trajectories, geodesic distance.

A k-dim subspace of ``R^d`` is an orthonormal basis ``[d, k]``. For two of them
the cosines of the principal angles are the singular values of ``Q1^T Q2``.

See docs/methods.md §C.6-§C.8.

Example:
    >>> import torch
    >>> q1 = torch.eye(4, dtype=torch.float64)[:, :2]
    >>> q2 = torch.eye(4, dtype=torch.float64)[:, 1:3]
    >>> principal_cosines(q1, q2).tolist()            # one shared axis, one orthogonal
    [1.0, 0.0]
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from geolens._validation import check_float, check_float_matrix, check_int
from geolens.metrics.grassmann import orthonormal_basis

__all__ = [
    "choose_resolution",
    "grassmann_distance",
    "principal_angles",
    "principal_cosines",
    "readout_subspace_similarity",
    "resolution_sweep",
    "top_right_singular_subspace",
]


def _bases(q1: torch.Tensor, q2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q1, q2 = orthonormal_basis(q1, name="q1"), orthonormal_basis(q2, name="q2")
    if q1.shape[0] != q2.shape[0]:
        raise ValueError(f"subspaces live in different spaces: d = {q1.shape[0]} and {q2.shape[0]}")
    dtype = torch.promote_types(q1.dtype, q2.dtype)
    return q1.to(dtype), q2.to(dtype=dtype, device=q1.device)


def principal_cosines(q1: Float[torch.Tensor, "d k1"], q2: Float[torch.Tensor, "d k2"]) -> Float[torch.Tensor, "k"]:
    """Cosines of the ``min(k1, k2)`` principal angles, descending (largest cosine = smallest angle).

    See docs/methods.md §C.7.
    """
    q1, q2 = _bases(q1, q2)
    return torch.linalg.svdvals(q1.T @ q2).clamp(0.0, 1.0)


def principal_angles(q1: Float[torch.Tensor, "d k1"], q2: Float[torch.Tensor, "d k2"]) -> Float[torch.Tensor, "k"]:
    """Principal angles in radians, ascending, as ``scipy.linalg.subspace_angles`` (which sorts descending).

    Small angles are computed from the sines (``||(I - Q1 Q1^T) Q2 v||``) where the
    arccos of a cosine near 1 loses precision.

    See docs/methods.md §C.7.
    """
    q1, q2 = _bases(q1, q2)
    u, s, vh = torch.linalg.svd(q1.T @ q2, full_matrices=False)
    s = s.clamp(0.0, 1.0)
    angles = torch.arccos(s)
    # Sines of the angles: the part of each principal vector of q2 outside span(q1).
    residual = q2 @ vh.T - q1 @ (u * s)
    sines = torch.linalg.vector_norm(residual, dim=0).clamp(0.0, 1.0)
    small = s > 0.7071067811865476  # below 45 degrees arcsin is the better conditioned one
    return torch.where(small, torch.arcsin(sines), angles)


def grassmann_distance(q1: Float[torch.Tensor, "d k"], q2: Float[torch.Tensor, "d k"]) -> float:
    """Geodesic (arc-length) distance on ``Gr(k, d)``: the 2-norm of the principal angles.

    See docs/methods.md §C.7.
    """
    if q1.shape[1] != q2.shape[1]:
        raise ValueError(f"the geodesic distance needs equal dimensions, got k = {q1.shape[1]} and {q2.shape[1]}")
    return float(torch.linalg.vector_norm(principal_angles(q1, q2)))


def readout_subspace_similarity(bases: Float[torch.Tensor, "L d k"]) -> Float[torch.Tensor, "L-1"]:
    """RSS between consecutive subspaces: the mean principal cosine of ``bases[l]`` and ``bases[l + 1]``.

    See docs/methods.md §C.7.

    Example:
        >>> import torch
        >>> eye = torch.eye(3, dtype=torch.float64)
        >>> readout_subspace_similarity(torch.stack([eye[:, :1], eye[:, :1], eye[:, 1:2]])).tolist()
        [1.0, 0.0]
    """
    if bases.ndim != 3 or bases.shape[0] < 2:
        raise ValueError(f"bases must be [L >= 2, d, k], got shape {tuple(bases.shape)}")
    cosines = torch.linalg.svdvals(bases[:-1].transpose(1, 2) @ bases[1:]).clamp(0.0, 1.0)
    return cosines.mean(dim=-1)


def top_right_singular_subspace(
    linear_map: Float[torch.Tensor, "d_out d_in"], k: int
) -> tuple[Float[torch.Tensor, "d_in k"], float]:
    """Top-``k`` right singular vectors of a linear map (acting on column vectors), and the energy they keep.

    Energy = the fraction of the map's squared singular values (its squared
    Frobenius norm) carried by the top ``k``.

    See docs/methods.md §C.6.

    Example:
        >>> import torch
        >>> basis, energy = top_right_singular_subspace(torch.diag(torch.tensor([3.0, 1.0, 0.0])), 1)
        >>> basis.abs().flatten().tolist(), round(energy, 3)
        ([1.0, 0.0, 0.0], 0.9)
    """
    linear_map = check_float_matrix(linear_map, "linear_map")
    k = check_int(k, "k", low=1, high=min(linear_map.shape))
    _, s, vh = torch.linalg.svd(linear_map.to(torch.float64), full_matrices=False)
    total = float(s.pow(2).sum())
    if total == 0:
        raise ValueError("the linear map is zero: it has no readout subspace")
    return vh[:k].T.to(linear_map.dtype if linear_map.dtype in (torch.float32, torch.float64) else torch.float32), float(
        s[:k].pow(2).sum()
    ) / total


def resolution_sweep(linear_maps: Float[torch.Tensor, "L d d"], fractions) -> list[dict[str, object]]:
    """RSS trajectories of the maps' top-k right singular subspaces, for ``k`` = each fraction of ``d``.

    One SVD per map serves every ``k``. Per fraction: ``k = max(1, round(f d))``,
    ``rss`` (``[L - 1]``, consecutive maps), ``energy`` (spectral fidelity: mean
    over maps of the fraction of squared singular values kept) and
    ``visibility`` (inter-layer distinguishability: ``1 - mean(rss)``). Small
    ``k`` keeps little of the maps' energy; large ``k`` makes every subspace alike
    (at ``k = d`` all coincide), so the two pull against each other
    (:func:`choose_resolution`).

    See docs/methods.md §C.8.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> maps = torch.eye(6, dtype=torch.float64).expand(4, 6, 6) + 0.1 * torch.randn(4, 6, 6, dtype=torch.float64)
        >>> [row["k"] for row in resolution_sweep(maps, [0.2, 0.5])]
        [1, 3]
    """
    if linear_maps.ndim != 3 or linear_maps.shape[1] != linear_maps.shape[2] or linear_maps.shape[0] < 2:
        raise ValueError(f"linear_maps must be [L >= 2, d, d], got shape {tuple(linear_maps.shape)}")
    # Checked before the SVD, each named by its position in the list.
    fractions = [check_float(f, f"fractions[{i}] (each in (0, 1))", low=0, high=1, low_open=True, high_open=True)
                 for i, f in enumerate(fractions)]
    d = linear_maps.shape[-1]
    _, s, vh = torch.linalg.svd(linear_maps.to(torch.float64))
    sq = s.pow(2)
    total = sq.sum(-1)
    if bool((total == 0).any()):
        raise ValueError("a linear map is zero: it has no readout subspace")
    out = []
    for fraction in fractions:
        k = max(1, round(fraction * d))
        bases = vh[:, :k].transpose(1, 2)  # [L, d, k]: rows of vh are right singular vectors
        rss = readout_subspace_similarity(bases)
        out.append({
            "fraction": fraction, "k": k, "rss": rss,
            "energy": float((sq[:, :k].sum(-1) / total).mean()),
            "visibility": float(1.0 - rss.mean()),
        })
    return out


def choose_resolution(sweep: list[dict[str, object]], *, tolerance: float = 0.05) -> dict[str, object]:
    """The resolution on the visibility/energy Pareto front where layers are most distinguishable.

    Energy only grows with ``k``; visibility rises, peaks at an intermediate
    ``k`` and falls as the subspaces fill the space. Below the peak both are
    lost; past it, energy is bought with distinguishability. The choice is the
    smallest ``k`` whose visibility is within ``tolerance`` (relative) of the
    sweep's best.

    See docs/methods.md §C.8.

    Example:
        >>> sweep = [{"k": 1, "visibility": 0.10, "energy": 0.1}, {"k": 5, "visibility": 0.158, "energy": 0.5},
        ...          {"k": 9, "visibility": 0.16, "energy": 0.7}, {"k": 20, "visibility": 0.12, "energy": 0.9}]
        >>> choose_resolution(sweep)["k"]
        5
    """
    if not sweep:
        raise ValueError("empty resolution sweep")
    best = max(float(row["visibility"]) for row in sweep)
    eligible = [row for row in sweep if float(row["visibility"]) >= (1.0 - tolerance) * best]
    return min(eligible, key=lambda row: row["k"])
