"""Pure metric functions on tensors: no models, no hooks.

Every function takes ``[N, d]`` (or batched) float tensors on any device.

See docs/methods.md §A-§F (every definition and choice).

Example:
    >>> import torch
    >>> from geolens.metrics import readout_basis, subspace_pga
    >>> _ = torch.manual_seed(0)
    >>> score = subspace_pga(torch.randn(100, 16), readout_basis(torch.randn(16, 64), 4), n_null=10)
    >>> score.n_null, score.k, score.d
    (10, 4, 16)
"""

from geolens._renames import renamed_attributes
from geolens.metrics.distances import (
    condensed_indices,
    pairwise_cosine_distances,
    rank_data,
    sorted_average_ranks,
    spearman,
)
from geolens.metrics.grassmann import orthonormal_basis, random_subspaces
from geolens.metrics.pga import PGAScore, rank_alignment, subspace_pga
from geolens.metrics.preprocess import centre, principal_directions, remove_common_components
from geolens.metrics.readout import readout_basis, readout_spectrum
from geolens.metrics.spectral import (
    Spectrum,
    alpha_req,
    condition_number,
    cosine_stats,
    effective_rank,
    isotropy,
    mean_cosine,
    numerical_rank,
    rankme,
    spectral_summary,
    spectrum_of,
)
from geolens.metrics.subspaces import (
    grassmann_distance,
    principal_angles,
    principal_cosines,
    readout_subspace_similarity,
    top_right_singular_subspace,
)
from geolens.metrics.phases import PhaseSplit, detect_phases
from geolens.metrics.convergence import distance_convergence
from geolens.metrics.correlation import partial_rank_correlation, rank_correlation
from geolens.metrics.similarity import cka_matrix, linear_cka, mutual_knn, mutual_knn_matrix
from geolens.metrics.probes import probe_accuracy, probe_folds
from geolens.metrics.updates import norm_ratio, update, update_norms, update_orthogonality, update_summary

__all__ = [
    "PGAScore",
    "PhaseSplit",
    "Spectrum",
    "alpha_req",
    "cka_matrix",
    "condition_number",
    "cosine_stats",
    "detect_phases",
    "distance_convergence",
    "effective_rank",
    "grassmann_distance",
    "isotropy",
    "linear_cka",
    "mean_cosine",
    "mutual_knn",
    "mutual_knn_matrix",
    "numerical_rank",
    "partial_rank_correlation",
    "principal_angles",
    "principal_cosines",
    "probe_accuracy",
    "probe_folds",
    "rank_correlation",
    "rankme",
    "readout_subspace_similarity",
    "spectral_summary",
    "spectrum_of",
    "top_right_singular_subspace",
    "norm_ratio",
    "update",
    "update_norms",
    "update_orthogonality",
    "update_summary",
    "centre",
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

__getattr__ = renamed_attributes(__name__, {"center": "centre"})  # the package spells it centre
