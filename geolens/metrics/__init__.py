"""Pure metric functions on tensors: no models, no hooks.

Every function takes ``[N, d]`` (or batched) float tensors on any device.

Example:
    >>> import torch
    >>> from geolens.metrics import readout_basis, subspace_pga
    >>> score = subspace_pga(torch.randn(100, 16), readout_basis(torch.randn(16, 64), 4), n_null=10)
"""

from geolens.metrics.distances import (
    condensed_indices,
    pairwise_cosine_distances,
    rank_data,
    sorted_average_ranks,
    spearman,
)
from geolens.metrics.grassmann import orthonormal_basis, random_subspaces
from geolens.metrics.pga import PGAScore, rank_alignment, subspace_pga
from geolens.metrics.preprocess import center, principal_directions, remove_common_components
from geolens.metrics.readout import readout_basis, readout_spectrum

__all__ = [
    "PGAScore",
    "center",
    "condensed_indices",
    "orthonormal_basis",
    "pairwise_cosine_distances",
    "principal_directions",
    "random_subspaces",
    "rank_alignment",
    "rank_data",
    "readout_basis",
    "readout_spectrum",
    "remove_common_components",
    "sorted_average_ranks",
    "spearman",
    "subspace_pga",
]
