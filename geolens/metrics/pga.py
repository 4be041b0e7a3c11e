"""Subspace PGA (prediction-geometry alignment), docs/methods.md §A.

Does the distance structure of a cloud of states survive projection onto the
unembedding's readout subspace better than onto a random subspace?

    rho_readout = Spearman(d_full, d_proj(V_k))
    rho_r       = Spearman(d_full, d_proj(Q_r)),  Q_r ~ Haar on Gr(k, d), r = 1..R
    z           = (rho_readout - mean(rho_r)) / std(rho_r)        (sample std, ddof = 1)
    p           = (1 + #{rho_r >= rho_readout}) / (R + 1)

after centring and CCR-m of the states. ``d_full`` and ``d_proj`` are condensed
pairwise cosine distances.

How it is fast and exact: the ranks of ``d_full`` are computed once; each
subspace costs one batched matmul, one Gram matrix and one float sort of the
``M = N (N - 1) / 2`` projected distances (the floor for an exact Spearman),
and the correlation is a gather-and-dot against the fixed ranks. Ties get
average ranks, as in scipy. Subspaces are processed in chunks so memory stays
bounded for large ``N``.

Approximate mode (``n_pairs``): the same Spearman on a seeded uniform sample of
pairs (the same pairs for the readout and every null subspace), with a
delete-a-group jackknife standard error for rho and z; the cost no longer
grows with ``N^2``. See docs/methods.md §A.4a.

See docs/methods.md §A.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> h = torch.randn(200, 16, dtype=torch.float64)
    >>> q = torch.linalg.qr(torch.randn(16, 4, dtype=torch.float64))[0]
    >>> score = subspace_pga(h, q, n_null=20, ccr=0, seed=0)
    >>> -1.0 <= score.rho_readout <= 1.0
    True
"""

from __future__ import annotations

import dataclasses
import warnings

from dataclasses import dataclass, field

import torch
from jaxtyping import Float

from geolens._rng import rng
from geolens._validation import DegenerateError, check_int, working_dtype
from geolens.metrics._ranking.pairs import PairSample, sample_pairs, shared_pair_sample
from geolens.metrics._ranking.ranks import FullRanks
from geolens.metrics._ranking.select import Backend, select_backend
from geolens.metrics.distances import (
    check_states,
    condensed_indices,
    negated_cosines,
    sort_with_order,
    sorted_average_ranks,
    unit_rows,
)
from geolens.metrics.grassmann import orthonormal_basis, random_subspaces
from geolens.metrics.preprocess import SPREAD_RTOL, centre, check_ccr, check_spread, principal_components

__all__ = ["PGAScore", "subspace_pga", "rank_alignment", "sampled_rank_alignment", "JACKKNIFE_BLOCKS",
           "MIN_SAMPLED_PAIRS", "MIN_NULL_VARIANCE_FRACTION", "PairSample", "SampledZ", "sample_pairs", "sampled_z"]

# Bytes of scratch memory a chunk of subspaces may use (Gram + sort buffers).
_DEFAULT_CHUNK_BYTES = 512 * 2**20
# Approximate PGA: groups of the delete-a-group jackknife, and the fewest pairs worth sampling.
JACKKNIFE_BLOCKS = 32
MIN_SAMPLED_PAIRS = 1000
# Approximate PGA: the null's variance, less its pair-sampling noise, is kept at least this fraction of
# the observed variance (below it the null's spread is mostly sampling noise: see docs/methods.md §A.4a).
MIN_NULL_VARIANCE_FRACTION = 0.05
# The states' readout part must be more than this many rounding units of their norm to rank anything.
READOUT_PART_RTOL = 64.0


@dataclass(frozen=True)
class PGAScore:
    """Subspace PGA of one cloud of states. Floats are plain Python floats.

    See docs/methods.md §A.6-§A.7.

    Attributes:
        rho_readout: Spearman between full and readout-projected distances.
        null_rhos: ``[n_null]`` float64 CPU tensor, the same for each random subspace.
        z: ``(rho_readout - null_mean) / null_std``.
        null_std: the null rhos' sample std (ddof = 1); on sampled pairs, with their pair-sampling
            noise taken out (``sqrt(null_std_raw^2 - pair_noise_std^2)``, docs/methods.md §A.4a).
        p_value: empirical one-sided p-value ``(1 + #{null >= rho}) / (n_null + 1)``.
        pc1_readout_energy: ``||V_k^T pc1||^2`` of the centred states' first PC
            (before CCR); compare with ``random_energy = k / d``.
        n_pairs: pairs the rhos were computed on (``N (N - 1) / 2`` when exact).
        rho_se: jackknife standard error of ``rho_readout`` from the sampling of pairs
            (``0.0`` when exact).
        z_se: jackknife standard error of ``z`` from the sampling of pairs (``0.0`` when exact);
            it covers the errors of ``rho_readout``, of ``null_mean`` and of the corrected
            ``null_std``; see docs/methods.md §A.4a.
        null_std_raw: the sample std of the null rhos as computed (on sampled pairs it holds their
            pair-sampling noise too); equal to ``null_std`` when exact.
        pair_noise_std: the jackknife estimate of the pair-sampling noise in the null rhos' spread
            (``0.0`` when exact).
        null_floored: the noise estimate reached ``1 - MIN_NULL_VARIANCE_FRACTION`` of the observed
            variance, so ``null_std`` is that floor (too few pairs: the z-score is unreliable).
    """

    rho_readout: float
    null_rhos: torch.Tensor = field(repr=False)
    z: float
    p_value: float
    null_mean: float
    null_std: float
    pc1_readout_energy: float
    random_energy: float
    k: int
    d: int
    n_tokens: int
    n_null: int
    ccr: int
    seed: int | None
    n_pairs: int = 0
    rho_se: float = 0.0
    z_se: float = 0.0
    null_std_raw: float | None = None
    pair_noise_std: float = 0.0
    null_floored: bool = False

    def __post_init__(self) -> None:
        if self.null_std_raw is None:  # exact: nothing taken out
            object.__setattr__(self, "null_std_raw", self.null_std)

    @property
    def exact(self) -> bool:
        """The rhos use every pair (no sampling error)."""
        return self.n_pairs == self.n_tokens * (self.n_tokens - 1) // 2

    def __repr__(self) -> str:
        if self.exact:
            z, rho, pairs = f"{self.z:.2f}", f"{self.rho_readout:.4f}", ""
        else:
            z, rho = f"{self.z:.2f}±{self.z_se:.2f}", f"{self.rho_readout:.4f}±{self.rho_se:.4f}"
            pairs = f", n_pairs={self.n_pairs}"
        return (
            f"PGAScore(z={z}, rho_readout={rho}, "
            f"null={self.null_mean:.4f}±{self.null_std:.4f}, p={self.p_value:.3g}, "
            f"k={self.k}, d={self.d}, N={self.n_tokens}, ccr={self.ccr}, n_null={self.n_null}{pairs})"
        )


def subspace_pga(
    states: Float[torch.Tensor, "N d"],
    readout: Float[torch.Tensor, "d k"],
    *,
    n_null: int = 100,
    ccr: int = 1,
    seed: int | None = 0,
    null_subspaces: Float[torch.Tensor, "R d k"] | None = None,
    n_pairs: int | None = None,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    backend: str | Backend = "auto",
) -> PGAScore:
    """Subspace PGA z-score of ``states`` against the readout subspace ``readout``.

    See docs/methods.md §A.1-§A.7.

    Args:
        states: ``[N, d]`` float tensor, one row per token position, ``N >= 3``.
        readout: ``[d, k]`` basis of the readout subspace (e.g. from
            :func:`geolens.metrics.readout_basis`); orthonormalised if it is not
            orthonormal already. Needs ``1 <= k < d``.
        n_null: number ``R >= 2`` of Haar-random subspaces of ``Gr(k, d)``.
        ccr: number of top principal components removed after centring
            (``0`` = centring only; the paper's default is 1).
        seed: seed of the random subspaces (not used for them if ``null_subspaces`` is
            given) and of the pair sample (``n_pairs``).
        null_subspaces: optional ``[R, d, k]`` orthonormal bases to use as the null.
        n_pairs: ``None`` (default): exact, every pair. An int: Spearman on a seeded
            uniform sample of that many pairs ``i < j``, the same for the readout and
            every null subspace (at least ``MIN_SAMPLED_PAIRS``; ``n_pairs >= N (N - 1) / 2``
            is exact); ``rho_se``/``z_se`` then hold jackknife standard errors.
        chunk_bytes: scratch memory budget; more subspaces per chunk is faster.
        backend: which kernels rank the distances, chosen once for the call: ``"auto"`` (default: the
            compiled CPU kernels for float32 states on the CPU, the torch kernels for any other device
            or dtype), ``"cpu"`` (the compiled kernels; a ``ValueError`` where they cannot run) or
            ``"torch"`` (``torch.sort`` and gathers, on any device). Both give the same numbers, to
            rounding; the choice changes only the speed.

    Returns:
        :class:`PGAScore`.

    Example:
        >>> import torch
        >>> from geolens.metrics import readout_basis, subspace_pga
        >>> _ = torch.manual_seed(0)
        >>> w_u = torch.randn(32, 100)
        >>> h = torch.randn(300, 32)
        >>> s = subspace_pga(h, readout_basis(w_u, 8), n_null=30, ccr=1)
        >>> s.n_null, s.k, s.d
        (30, 8, 32)
        >>> a = subspace_pga(h, readout_basis(w_u, 8), n_null=30, ccr=1, n_pairs=20_000)  # about half the pairs
        >>> a.n_pairs, a.z_se > 0, abs(a.z - s.z) < 3 * a.z_se      # the exact z within 3 standard errors
        (20000, True, True)
        >>> t = subspace_pga(h, readout_basis(w_u, 8), n_null=30, ccr=1, backend="torch")  # the torch kernels
        >>> abs(t.z - s.z) < 1e-6
        True
    """
    states = check_states(states)
    n, d = states.shape
    n_pairs = check_n_pairs(n_pairs, n)
    input_dtype = states.dtype
    states = states.to(working_dtype(states))
    readout = _checked_readout(readout, d)
    k = readout.shape[1]
    ccr = check_ccr(ccr, n, d)
    total = n * (n - 1) // 2
    exact = n_pairs is None or n_pairs >= total
    backend = select_backend(backend, device=states.device, dtype=states.dtype, n_values=total if exact else n_pairs,
                             n_blocks=None if exact else min(JACKKNIFE_BLOCKS, n_pairs))
    null_subspaces = _null_subspaces(null_subspaces, n_null, d, k, seed=seed, like=states)
    n_null = null_subspaces.shape[0]
    readout = readout.to(dtype=states.dtype, device=states.device)
    processed, pc1_energy = _centred_and_reduced(states, readout, ccr, input_dtype)
    _check_readout_part(processed, readout, input_dtype)
    subspaces = torch.cat([readout.unsqueeze(0), null_subspaces], dim=0)
    if exact:
        rhos, deleted = rank_alignment(processed, subspaces, chunk_bytes=chunk_bytes, backend=backend).cpu(), None
        used = total
    else:
        pairs = shared_pair_sample(n, n_pairs, 0 if seed is None else int(seed))
        rhos, deleted = sampled_rank_alignment(processed, subspaces, pairs, seed=0 if seed is None else seed,
                                               chunk_bytes=chunk_bytes, backend=backend)
        used = pairs.n_pairs
    stats = _null_statistics(rhos, deleted, n_tokens=n, n_pairs=used)
    rho_readout, null_rhos = float(rhos[0]), rhos[1:]
    return PGAScore(
        rho_readout=rho_readout,
        null_rhos=null_rhos,
        z=stats.z,
        p_value=(1 + int((null_rhos >= rho_readout).sum())) / (n_null + 1),
        null_mean=float(null_rhos.mean()),
        null_std=stats.null_std,
        pc1_readout_energy=pc1_energy,
        random_energy=k / d,
        k=k,
        d=d,
        n_tokens=n,
        n_null=n_null,
        ccr=ccr,
        seed=seed,
        n_pairs=used,
        rho_se=stats.rho_se,
        z_se=stats.z_se,
        null_std_raw=stats.null_std_raw,
        pair_noise_std=stats.pair_noise_std,
        null_floored=stats.floored,
    )


def _checked_readout(readout: torch.Tensor, d: int) -> torch.Tensor:
    """``readout`` orthonormalised, checked to be ``[d, k]`` with ``1 <= k < d``.

    Example:
        >>> tuple(_checked_readout(torch.randn(4, 2), 4).shape)
        (4, 2)
    """
    readout = orthonormal_basis(readout, name="readout")
    if readout.shape[0] != d:
        raise ValueError(f"readout must be [d, k] with d = {d} (the states' width), got {tuple(readout.shape)}")
    k = readout.shape[1]
    if k >= d:
        raise ValueError(f"k must be < d = {d} (k = d is the whole space), got k = {k}")
    return readout


def _null_subspaces(
    given: torch.Tensor | None, n_null: int, d: int, k: int, *, seed: int | None, like: torch.Tensor
) -> torch.Tensor:
    """The ``[R >= 2, d, k]`` null bases in ``like``'s dtype and device: ``given``, checked, or ``n_null``
    Haar-random ones drawn from ``seed``.

    Example:
        >>> _null_subspaces(None, 3, 6, 2, seed=0, like=torch.zeros(1, dtype=torch.float64)).shape
        torch.Size([3, 6, 2])
    """
    if given is None:
        n_null = check_int(n_null, "n_null", low=2)
        return random_subspaces(d, k, n_null, seed=seed, dtype=like.dtype, device=like.device)
    if given.ndim != 3 or tuple(given.shape[1:]) != (d, k):
        raise ValueError(f"null_subspaces must be [R, {d}, {k}], got {tuple(given.shape)}")
    check_int(given.shape[0], "number of null subspaces", low=2)
    return given.to(dtype=like.dtype, device=like.device)


def _centred_and_reduced(
    states: torch.Tensor, readout: torch.Tensor, ccr: int, input_dtype: torch.dtype
) -> tuple[torch.Tensor, float]:
    """The states centred with their top ``ccr`` principal components removed, and the first PC's
    readout energy ``||V_k^T pc1||^2`` (of the centred states, before CCR).

    Raises :class:`DegenerateError` when fewer than two directions are left: cosine distances of a
    cloud that is (numerically) one line are all 0 or 2, no geometry to rank.

    Example:
        >>> h = torch.randn(50, 4, dtype=torch.float64) * torch.tensor([10.0, 1.0, 1.0, 1.0], dtype=torch.float64)
        >>> reduced, energy = _centred_and_reduced(h, torch.eye(4, dtype=torch.float64)[:, :1], 1, torch.float64)
        >>> energy > 0.9, abs(float(reduced.mean(0).abs().max())) < 1e-12
        (True, True)
    """
    centred = centre(states)
    check_spread(states, centred, dtype=input_dtype, what="the states")
    # One decomposition gives both PC1 (for migration) and the CCR components.
    sv, vh = principal_components(centred, max(ccr, 1))
    kept_rank = int((sv[ccr:] > SPREAD_RTOL * torch.finfo(input_dtype).eps * sv[0]).sum())
    if kept_rank < 2:
        raise DegenerateError(f"after centring and CCR-{ccr} the states span {kept_rank} direction(s); "
                              "cosine distances need at least 2 (lower ccr, or give more varied states)")
    pc1_energy = float((readout.T @ vh[0]).pow(2).sum())
    if not ccr:
        return centred, pc1_energy
    pcs = vh[:ccr].T
    processed = centred - (centred @ pcs) @ pcs.T
    check_spread(centred, processed, dtype=input_dtype, what=f"the states after CCR-{ccr}")
    return processed, pc1_energy


def _check_readout_part(processed: torch.Tensor, readout: torch.Tensor, input_dtype: torch.dtype) -> None:
    """Raise :class:`DegenerateError` when the states have (numerically) nothing in the readout subspace: their
    readout part is then rounding noise of the input dtype, and its distances rank nothing.

    Example:
        >>> q = torch.eye(4, dtype=torch.float64)[:, :1]
        >>> h = torch.randn(20, 4, dtype=torch.float64)
        >>> _check_readout_part(h, q, torch.float32)              # a readout part of normal size: fine
        >>> _check_readout_part(h - h @ q @ q.T + 1e-9 * h, q, torch.float32)
        Traceback (most recent call last):
        ...
        geolens._validation.DegenerateError: the states have nothing in the readout subspace: its part of them is 1e-09 of their norm, below the float32 rounding limit 8e-06
    """
    wide = processed.double()
    wide = wide / wide.abs().max().clamp_min(torch.finfo(torch.float64).tiny)  # norms of huge states do not overflow
    whole = float(torch.linalg.matrix_norm(wide))
    part = float(torch.linalg.matrix_norm(wide @ readout.double()))
    limit = READOUT_PART_RTOL * torch.finfo(input_dtype).eps
    if whole > 0 and part <= limit * whole:
        raise DegenerateError(f"the states have nothing in the readout subspace: its part of them is "
                              f"{part / whole:.2g} of their norm, below the {str(input_dtype).removeprefix('torch.')} "
                              f"rounding limit {limit:.1g}")


def _null_statistics(rhos: torch.Tensor, deleted: torch.Tensor | None, *, n_tokens: int, n_pairs: int) -> SampledZ:
    """The z-score and the null's spread from the rhos ``[S]`` (readout first): plain when exact
    (``deleted`` is ``None``), corrected for the pair sampling by :func:`sampled_z` otherwise.

    Raises :class:`DegenerateError` when the null rhos have no spread; warns (``RuntimeWarning``) when
    the sampled null's spread had to be floored.

    Example:
        >>> s = _null_statistics(torch.tensor([0.5, 0.1, 0.2, 0.3], dtype=torch.float64), None, n_tokens=4, n_pairs=6)
        >>> round(s.z, 6), s.z_se, s.null_std == s.null_std_raw
        (3.0, 0.0, True)
    """
    null_std_raw = float(rhos[1:].std(unbiased=True))
    if not null_std_raw > 1e-9:  # rho lies in [-1, 1]: a spread below 1e-9 is rounding
        raise DegenerateError(f"the null rhos have (numerically) zero spread ({null_std_raw:.2g}), so the z-score is "
                              "undefined; the states' distance structure is degenerate")
    if deleted is None:
        return SampledZ(z=_z_score(rhos), null_std=null_std_raw, null_std_raw=null_std_raw, pair_noise_std=0.0,
                        rho_se=0.0, z_se=0.0, floored=False)
    total = n_tokens * (n_tokens - 1) // 2
    sampled = sampled_z(rhos, deleted, 1.0 - n_pairs / total)
    if sampled.floored:
        warnings.warn(f"approximate PGA (n_pairs = {n_pairs}, N = {n_tokens}): the pair-sampling noise is "
                      f"{100 * sampled.pair_noise_std**2 / null_std_raw**2:.0f}% of the null rhos' variance, so their "
                      f"spread is floored at {MIN_NULL_VARIANCE_FRACTION:g} of it and z is unreliable; use more pairs",
                      RuntimeWarning, stacklevel=3)
    return dataclasses.replace(sampled, null_std_raw=null_std_raw)


def check_n_pairs(n_pairs: object, n: int) -> int | None:
    """``n_pairs`` as an int (or ``None``, exact), checked: at least ``MIN_SAMPLED_PAIRS`` unless it covers all pairs.

    Example:
        >>> check_n_pairs(None, 100), check_n_pairs(500_000, 100)
        (None, 500000)
    """
    if n_pairs is None:
        return None
    n_pairs = check_int(n_pairs, "n_pairs", low=2)
    total = n * (n - 1) // 2
    if n_pairs < min(total, MIN_SAMPLED_PAIRS):
        raise ValueError(f"n_pairs = {n_pairs} is too few pairs to rank with a usable error estimate; pass at least "
                         f"{MIN_SAMPLED_PAIRS} (or None: all {total} pairs of N = {n})")
    return n_pairs


def _z_score(rhos: torch.Tensor) -> float | torch.Tensor:
    """``(rhos[0] - mean(rhos[1:])) / std(rhos[1:])`` along the first axis (one z per column of a 2-D input)."""
    null = rhos[1:]
    z = (rhos[0] - null.mean(0)) / null.std(0, unbiased=True)
    return float(z) if rhos.ndim == 1 else z


@dataclass(frozen=True)
class SampledZ:
    """The z-score of sampled-pair rhos with the null's spread corrected for the pair sampling
    (:func:`sampled_z`); floats, see :class:`PGAScore` for the names."""

    z: float
    null_std: float
    null_std_raw: float
    pair_noise_std: float
    rho_se: float
    z_se: float
    floored: bool


def sampled_z(rhos: torch.Tensor, deleted: torch.Tensor, fpc: float,
              floor: float = MIN_NULL_VARIANCE_FRACTION) -> SampledZ:
    """z and its standard error from sampled-pair rhos ``[S]`` (readout first) and their ``[S, G]``
    delete-a-group jackknife replicates, the null's spread freed of the pair-sampling noise.

    Each null rho is ``rho_i + e_i`` with ``e_i`` its pair-sampling error, so the observed variance
    ``s^2`` of the null rhos estimates ``var(rho) + (1 / (R - 1)) sum_i var(e_i - mean e)``. The second
    term is the mean jackknife variance of the nulls' deviations from their mean, read off the same
    replicates (``theta_ig - mean_j theta_jg``; the mean's share of the errors, common to every
    subspace of a pair sample, does not widen the spread, so it is not subtracted):

        noise = 1 / (R - 1) sum_i fpc (G - 1) / G sum_g (a_ig - mean_g a_ig)^2,  a_ig = theta_ig - mean_j theta_jg
        null_std = sqrt(max(s^2 - noise, floor s^2))

    ``z = (rho_0 - mean(rho_i)) / null_std``. Its standard error adds, in quadrature, the jackknife
    spread of ``z`` over the replicates (``noise`` held fixed: the errors of ``rho_0``, of the null
    mean and of ``s^2``, with their correlations through the shared pairs) and the delta-method term
    of the noise estimate's own error, ``|z| / (2 null_std^2) * se(noise)``, with ``se(noise)`` from
    the spread of its ``G`` per-block terms. ``fpc = 1 - P / M``: pairs drawn without replacement.

    Example:
        >>> rhos = torch.tensor([0.5, 0.1, 0.2, 0.3], dtype=torch.float64)
        >>> deleted = rhos.unsqueeze(1) + 0.01 * torch.tensor([[1.0, -1.0, 0.5, -0.5]] * 4, dtype=torch.float64)
        >>> s = sampled_z(rhos, deleted, fpc=1.0)   # the same error in every subspace: nothing to take out
        >>> round(s.z, 6), s.pair_noise_std, s.null_std == s.null_std_raw
        (3.0, 0.0, True)
    """
    rhos, deleted = rhos.to(torch.float64), deleted.to(torch.float64)
    g = deleted.shape[1]
    scale = fpc * (g - 1) / g
    null, replicas = rhos[1:], deleted[1:]
    r = null.shape[0]
    raw_var = float(null.var(unbiased=True))
    deviations = replicas - replicas.mean(0, keepdim=True)
    deviations -= deviations.mean(1, keepdim=True)
    per_block = scale * deviations.pow(2).sum(0) / (r - 1)  # [G]: noise = their sum
    noise = float(per_block.sum())
    noise_se = float((g * per_block.var(unbiased=True)).sqrt()) if g > 1 else 0.0
    floored = raw_var - noise < floor * raw_var
    null_var = max(raw_var - noise, floor * raw_var)
    null_std = null_var**0.5
    z = float((rhos[0] - null.mean()) / null_std)
    # Replicate z's with the noise estimate fixed; a replicate's variance floored as the estimate's.
    rep_var = replicas.var(0, unbiased=True)
    rep_std = (rep_var - noise).clamp_min(floor * rep_var).sqrt()
    rep_z = (deleted[0] - replicas.mean(0)) / rep_std

    def jack_var(theta: torch.Tensor) -> float:
        return float(scale * (theta - theta.mean()).pow(2).sum())

    z_var = jack_var(rep_z) + (abs(z) / (2 * null_var) * noise_se) ** 2
    return SampledZ(z=z, null_std=null_std, null_std_raw=raw_var**0.5, pair_noise_std=noise**0.5,
                    rho_se=jack_var(deleted[0]) ** 0.5, z_se=z_var**0.5, floored=floored)


def rank_alignment(
    states: Float[torch.Tensor, "N d"],
    subspaces: Float[torch.Tensor, "S d k"],
    *,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    backend: str | Backend = "auto",
) -> Float[torch.Tensor, "S"]:
    """Spearman between full-space and each subspace's cosine distances (no preprocessing).

    ``states`` are used as given (centre/CCR them first); ``subspaces`` are
    orthonormal bases. Returns float64 rhos, one per subspace. ``backend``: as in
    :func:`subspace_pga` (or a backend object from ``geolens.metrics._ranking.select.select_backend``).

    See docs/methods.md §A.3-§A.4.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> h = torch.randn(50, 6, dtype=torch.float64)
        >>> eye = torch.eye(6, dtype=torch.float64).unsqueeze(0)   # the whole space
        >>> round(float(rank_alignment(h, eye)[0]), 6)
        1.0
    """
    n = states.shape[0]
    flat_index = condensed_indices(n, device=states.device)
    backend = select_backend(backend, device=states.device, dtype=states.dtype, n_values=flat_index.numel())
    # The full space in float64 whatever the states' dtype: its distances then tie only where they are
    # equal (float32 rounding ties many of them at large N), which also lets the CPU kernel read the
    # full ranks off its sort keys instead of gathering them (FullRanks).
    full, full_norm = _centred_full_ranks(negated_cosines(states.double(), flat_index=flat_index), "full-space")
    out = []
    for dots, sq_norms in backend.exact_chunks(states, subspaces, flat_index, full, chunk_bytes=chunk_bytes):
        if bool((sq_norms <= 0).any()):
            raise DegenerateError("all projected distances are equal in some subspace: rank correlation undefined")
        out.append(dots / (full_norm * sq_norms.sqrt()))
    return out[0] if len(out) == 1 else torch.cat(out)


def sampled_rank_alignment(
    states: Float[torch.Tensor, "N d"],
    subspaces: Float[torch.Tensor, "S d k"],
    pairs: PairSample,
    *,
    seed: int = 0,
    n_blocks: int = JACKKNIFE_BLOCKS,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    backend: str | Backend = "auto",
) -> tuple[Float[torch.Tensor, "S"], Float[torch.Tensor, "S G"]]:
    """:func:`rank_alignment` on a sample of pairs, with its delete-a-group jackknife replicates.

    Returns ``(rhos [S], deleted [S, G])`` in float64 on the CPU: the Spearman of
    each subspace over the sampled pairs, and the same with each of ``G`` random,
    equal-sized blocks of pairs left out, to first order: ``rho - sum_{p in g}
    IF_p / (P - |g|)`` with ``IF`` the empirical influence function of Spearman's
    rho (docs/methods.md §A.4a). ``seed`` seeds the split into blocks. ``backend``: as in
    :func:`rank_alignment`.

    Example:
        >>> import torch
        >>> from geolens.metrics.pga import sample_pairs
        >>> _ = torch.manual_seed(0)
        >>> h = torch.randn(300, 6, dtype=torch.float64)
        >>> eye = torch.eye(6, dtype=torch.float64).unsqueeze(0)
        >>> rhos, deleted = sampled_rank_alignment(h, eye, sample_pairs(300, 5000, seed=0))
        >>> round(float(rhos[0]), 6), tuple(deleted.shape)
        (1.0, (1, 32))
    """
    p = pairs.n_pairs
    n_blocks = min(n_blocks, p)
    device = states.device
    backend = select_backend(backend, device=device, dtype=states.dtype, n_values=p, n_blocks=n_blocks)
    # The full space in float64, as in the exact mode: its values tie only where they are equal.
    full, full_norm = _centred_full_ranks(backend.pair_values(states.double(), pairs), "sampled full-space")
    blocks, sizes = _jackknife_blocks(p, n_blocks, seed=seed)
    ranks = backend.sampled_ranks(full, blocks.to(device), n_blocks)
    # Scratch per subspace: its coordinates (the compiled kernel makes the pair values inside its sort
    # keys, in buffers of its worker threads); two chunks are alive at once. One batched product makes
    # them: products in a pool thread beside the full space's ranking, or per subspace in the workers,
    # were slower (OpenMP and BLAS threads contend with the workers).
    per_subspace = 2 * states.shape[0] * subspaces.shape[-1] * states.element_size()
    chunk = max(1, int(chunk_bytes // per_subspace))
    compiled = backend.takes_unit_rows
    rhos, phis = [], []

    def collect(pending) -> None:
        dots, sq_norms, phi = pending()
        if bool((sq_norms <= 0).any()):
            raise DegenerateError("all sampled projected distances are equal in some subspace: rank correlation undefined")
        rhos.append((dots / (full_norm * sq_norms.sqrt())).cpu())
        phis.append(phi.cpu())

    pending = None
    for start in range(0, subspaces.shape[0], chunk):
        # On the CPU, the workers rank this chunk while the next one is built.
        coordinates = _chunk_coordinates(states, subspaces, start, chunk, unit=compiled)
        submitted = ranks.submit_pairs(coordinates, pairs, normalised=compiled)
        if pending is not None:
            collect(pending)
        pending = submitted
    collect(pending)
    rho = torch.cat(rhos)
    return rho, _deleted_rhos(rho, torch.cat(phis), sizes)


def _centred_full_ranks(values: torch.Tensor, what: str) -> tuple[FullRanks, torch.Tensor]:
    """The average ranks of the full space's values ``[M]`` (ties averaged), less their mean ``(M + 1) / 2`` (the same
    with or without ties), with their sort order, and their norm; ``what`` names the values in the
    :class:`DegenerateError` raised when they are all equal.

    Example:
        >>> full, norm = _centred_full_ranks(torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64), "full-space")
        >>> full.centred().tolist(), round(float(norm) ** 2, 6)
        ([1.0, -1.0, 0.0], 2.0)
    """
    full_sorted, full_order = sort_with_order(values)
    del values
    full = FullRanks(sorted_average_ranks(full_sorted).sub_((full_sorted.numel() + 1) / 2.0), full_order)
    del full_sorted, full_order
    full_norm = torch.linalg.vector_norm(full.by_position)
    if full_norm == 0:
        raise DegenerateError(f"all {what} distances are equal: rank correlation undefined")
    return full, full_norm


def _chunk_coordinates(
    states: torch.Tensor, subspaces: torch.Tensor, start: int, chunk: int, *, unit: bool
) -> torch.Tensor:
    """The coordinates ``[C, N, k]`` of the states in subspaces ``start:start + chunk``, one batched product;
    with ``unit`` (the compiled kernel's input) as unit rows, normalised in place.

    Example:
        >>> h = torch.randn(5, 4, dtype=torch.float64)
        >>> c = _chunk_coordinates(h, torch.eye(4, dtype=torch.float64)[None, :, :2], 0, 8, unit=True)
        >>> torch.allclose(c.norm(dim=-1), torch.ones(1, 5, dtype=torch.float64))
        True
    """
    product = states @ subspaces[start : start + chunk]
    return unit_rows(product, in_place=True) if unit else product


def _jackknife_blocks(n_pairs: int, n_blocks: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random, equal-sized blocks of the sampled pairs: ``(block of each pair [P] int64, block sizes [G]
    float64)``, on the CPU. Block ``g`` holds the pairs at positions ``perm[g::G]`` of a permutation seeded
    by ``seed``, so the sizes differ by at most one.

    Example:
        >>> blocks, sizes = _jackknife_blocks(10, 4, seed=0)
        >>> sizes.tolist(), sorted(blocks.tolist()) == sorted([g % 4 for g in range(10)])
        ([3.0, 3.0, 2.0, 2.0], True)
    """
    perm = torch.randperm(n_pairs, generator=rng(seed, "pair blocks"))
    blocks = torch.empty(n_pairs, dtype=torch.int64)
    blocks[perm] = torch.arange(n_pairs) % n_blocks
    return blocks, torch.bincount(blocks, minlength=n_blocks).to(torch.float64)


def _deleted_rhos(rho: torch.Tensor, phi: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The delete-a-group jackknife replicates ``[S, G]`` of the rhos ``[S]`` to first order, from the
    per-block sums ``phi [S, G]`` of the pairs' influence terms and the block sizes ``[G]``.

    Leaving block ``g`` out moves rho by ``-12 (sum_{p in g} phi_p - |g| mean phi) / (P - |g|)``,
    with ``P`` the number of pairs (docs/methods.md §A.4a).

    Example:
        >>> rho = torch.tensor([0.5], dtype=torch.float64)
        >>> phi = torch.tensor([[1.0, 1.0]], dtype=torch.float64)   # the same influence in each block: no move
        >>> _deleted_rhos(rho, phi, torch.tensor([2.0, 2.0], dtype=torch.float64)).tolist()
        [[0.5, 0.5]]
    """
    p = float(sizes.sum())
    influence = 12.0 * (phi - sizes * (phi.sum(1, keepdim=True) / p))
    return rho.unsqueeze(1) - influence / (p - sizes)
