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

import torch
from jaxtyping import Float

from geolens._validation import DegenerateError, check_float_matrix, check_int

__all__ = ["SPREAD_RTOL", "center", "check_ccr", "check_spread", "principal_directions", "remove_common_components"]

# Spread below this many units of the input dtype's resolution is rounding, not geometry.
SPREAD_RTOL = 8.0


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
        >>> check_spread(x, center(x), dtype=torch.float32, what="states")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        geolens._validation.DegenerateError: states are numerically constant: after centring their spread is 3.2e-08 ...
        >>> check_spread(x, center(x), dtype=torch.float64, what="states")  # the same numbers, read as float64
    """
    scale = float(torch.linalg.matrix_norm(reference.double()))
    size = float(torch.linalg.matrix_norm(spread.double()))
    limit = SPREAD_RTOL * torch.finfo(dtype).eps
    if scale == 0 or size <= limit * scale:
        relative = size / scale if scale else 0.0
        raise DegenerateError(f"{what} are numerically constant: after centring their spread is {relative:.2g} of their "
                         f"scale, a zero norm at {str(dtype).removeprefix('torch.')} resolution (limit {limit:.2g})")


def center(states: Float[torch.Tensor, "N d"]) -> Float[torch.Tensor, "N d"]:
    """Subtract the mean over tokens (rows).

    See docs/methods.md §A.2.
    """
    return states - states.mean(dim=0, keepdim=True)


def principal_directions(centred: Float[torch.Tensor, "N d"], m: int) -> Float[torch.Tensor, "d m"]:
    """Top-``m`` principal directions (columns, unit norm) of already-centred states.

    See docs/methods.md §A.2.
    """
    if m == 0:
        return centred.new_zeros(centred.shape[1], 0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    return vh[:m].T


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
    centred = center(states)
    if m == 0:
        return centred
    pcs = principal_directions(centred, m)
    return centred - (centred @ pcs) @ pcs.T
