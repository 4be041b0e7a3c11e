"""Cross-model convergence of distance structure (docs/methods.md §E.2).

For two clouds of states over the *same* token positions (two models, or two
layers), the Spearman correlation between their condensed cosine-distance
vectors, computed in full space, in each side's readout subspace, and in pairs
of Haar-random subspaces (the null). The paper's finding is
readout > full > random.

See docs/methods.md §E.2-§E.3.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> a = torch.randn(60, 16, dtype=torch.float64)
    >>> q = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))[0]
    >>> out = distance_convergence(a, a @ q, n_null=0, ccr=0)        # a rotation of itself
    >>> round(out["spearman_full"], 6)
    1.0
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from geolens._rng import rng
from geolens._validation import check_int, working_dtype
from geolens.metrics.distances import check_states, condensed_indices, negated_cosines, rank_data
from geolens.metrics.grassmann import orthonormal_basis, random_subspaces
from geolens.metrics.preprocess import remove_common_components

__all__ = ["centred_unit_ranks", "distance_convergence", "rank_correlation_matrix"]


def centred_unit_ranks(
    states: Float[torch.Tensor, "*batch N d"], flat_index: torch.Tensor | None = None
) -> Float[torch.Tensor, "*batch M"]:
    """Average ranks of the condensed cosine distances, centred and scaled to unit norm (float64).

    The Spearman correlation of two such rows is their dot product, so a whole
    grid of correlations is one matrix product.

    See docs/methods.md §E.3.
    """
    n = states.shape[-2]
    if flat_index is None:
        flat_index = condensed_indices(n, device=states.device)
    ranks = rank_data(negated_cosines(states, flat_index=flat_index))
    ranks = ranks - ranks.mean(dim=-1, keepdim=True)
    norms = torch.linalg.vector_norm(ranks, dim=-1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("all pairwise distances are equal: rank correlation undefined")
    return ranks / norms


def rank_correlation_matrix(
    units_a: Float[torch.Tensor, "A M"], units_b: Float[torch.Tensor, "B M"]
) -> Float[torch.Tensor, "A B"]:
    """Spearman correlations between every row of ``units_a`` and of ``units_b`` (from :func:`centred_unit_ranks`).

    See docs/methods.md §E.3.
    """
    return units_a @ units_b.T


def distance_convergence(
    states_a: Float[torch.Tensor, "N da"],
    states_b: Float[torch.Tensor, "N db"],
    readout_a: Float[torch.Tensor, "da k"] | None = None,
    readout_b: Float[torch.Tensor, "db k"] | None = None,
    *,
    n_null: int = 100,
    ccr: int = 1,
    seed: int | None = 0,
    chunk: int = 8,
) -> dict[str, float]:
    """Spearman between the distance structures of two clouds over the same N positions.

    Both clouds are centred and CCR-``ccr`` corrected on their own. Returns
    ``spearman_full``; with readouts also ``spearman_readout``; with ``n_null >= 2`` also
    ``spearman_random_mean``/``spearman_random_std`` (each null draw projects each side onto
    its own Haar-random k-dim subspace) and ``spearman_readout_z`` (readout vs that null).

    See docs/methods.md §E.2.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> h = torch.randn(50, 8, dtype=torch.float64)
        >>> round(distance_convergence(h, h, n_null=0, ccr=0)["spearman_full"], 6)
        1.0
    """
    states_a, states_b = check_states(states_a, "states_a"), check_states(states_b, "states_b")
    if states_a.shape[0] != states_b.shape[0]:
        raise ValueError(
            f"states_a and states_b must cover the same positions: got {states_a.shape[0]} and {states_b.shape[0]} rows"
        )
    n = states_a.shape[0]
    n_null = check_int(n_null, "n_null", low=0)
    dtype = working_dtype(states_a) if states_a.dtype == states_b.dtype else torch.float64
    a = remove_common_components(states_a.to(dtype), ccr)
    b = remove_common_components(states_b.to(dtype=dtype, device=a.device), ccr)
    flat_index = condensed_indices(n, device=a.device)
    out: dict[str, float] = {"n_positions": n, "ccr": ccr}
    out["spearman_full"] = float(centred_unit_ranks(a, flat_index) @ centred_unit_ranks(b, flat_index))
    if (readout_a is None) != (readout_b is None):
        raise ValueError("give both readouts or neither")
    if readout_a is None:
        return out
    qa, qb = orthonormal_basis(readout_a, name="readout_a"), orthonormal_basis(readout_b, name="readout_b")
    if qa.shape[0] != a.shape[1] or qb.shape[0] != b.shape[1]:
        raise ValueError(f"readouts must be [d, k] with d = {a.shape[1]} and {b.shape[1]}")
    if qa.shape[1] != qb.shape[1]:
        raise ValueError(f"both readouts need the same k, got {qa.shape[1]} and {qb.shape[1]}")
    k = qa.shape[1]
    out["k"] = k
    proj_a, proj_b = a @ qa.to(a), b @ qb.to(b)
    out["spearman_readout"] = float(centred_unit_ranks(proj_a, flat_index) @ centred_unit_ranks(proj_b, flat_index))
    if n_null < 2:
        return out
    nulls_a = random_subspaces(a.shape[1], k, n_null, generator=rng(seed, "null subspaces"), dtype=a.dtype,
                               device=a.device)
    nulls_b = random_subspaces(b.shape[1], k, n_null, generator=rng(seed, "null subspaces", part=1), dtype=b.dtype,
                               device=b.device)
    rhos = []
    for start in range(0, n_null, chunk):
        units_a = centred_unit_ranks(a @ nulls_a[start : start + chunk], flat_index)
        units_b = centred_unit_ranks(b @ nulls_b[start : start + chunk], flat_index)
        rhos.append((units_a * units_b).sum(dim=-1))
    null = torch.cat(rhos).cpu()
    out["spearman_random_mean"] = float(null.mean())
    out["spearman_random_std"] = float(null.std(unbiased=True))
    out["spearman_readout_z"] = (out["spearman_readout"] - out["spearman_random_mean"]) / out["spearman_random_std"]
    out["n_null"] = n_null
    return out
