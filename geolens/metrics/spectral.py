"""Spectral geometry of a cloud of vectors: effective rank, RankMe, alpha-ReQ, isotropy, cosines, conditioning.

Every function takes an ``[N, d]`` matrix ``X`` — ``N`` states of width ``d``, or a
weight matrix with one vector per row (``W_U.T`` as ``[V, d]``: the token readout
vectors; ``W_E`` as ``[V, d]``) — on any device, float32 or float64 (half
precision is promoted to float32). With ``centre=True`` the mean row is
subtracted first. Results are Python floats computed in float64 from the
singular values ``s_1 >= s_2 >= ... >= s_min(N, d)`` of ``X``.

Conventions (docs/methods.md §B; each is a documented choice):

* **effective rank** (Roy & Vetterli 2007): ``exp(H(p))``, ``p_i = s_i / sum(s)``,
  ``H(p) = -sum p_i log p_i`` (``0 log 0 = 0``). Never capped: it lies in
  ``[1, rank(X)]`` by construction.
* **RankMe** (Garrido et al. 2023): singular values of the matrix itself (not
  covariance eigenvalues), ``p_i = s_i / ||s||_1 + eps`` with ``eps = 1e-7``, over
  all ``min(N, d)`` values, ``exp(-sum p_i log p_i)``. The paper applies it to the
  uncentred matrix: ``rankme`` defaults to ``centre=False``.
* **alpha-ReQ** (Agrawal et al. 2022): covariance eigenvalues ``lambda_i = s_i^2 / (N - 1)``
  (second-moment eigenvalues when not centred; the scale does not change alpha),
  weighted least-squares fit of ``log lambda_i`` on ``log i`` (``i`` 1-based rank)
  over the 0-based half-open index range ``fit_range = (5, 100)`` (ranks 6..100),
  weights ``1 / i``; alpha is minus the slope, with the weighted R^2 of the fit.
* **isotropy** (Mu & Viswanath 2018): ``I(X) = min_c Z(c) / max_c Z(c)``,
  ``Z(c) = sum_w exp(c^T w)``, ``c`` over the eigenvectors of ``X^T X`` *and their
  negatives* (an eigenvector's sign is arbitrary; taking both makes ``I``
  well-defined). Eigenvectors with eigenvalue 0 give ``Z = N`` exactly. ``log Z``
  is a logsumexp, so large norms do not overflow. Not scale invariant: ``cX``
  has a different isotropy (``c -> 0`` gives 1). Where ``X^T X`` has a repeated
  eigenvalue its eigenvectors are any basis of the eigenspace, and ``I`` depends
  on the basis LAPACK returns (inherent to the definition; rare for real data).
* **mean cosine** and its spread (angular variability): mean and population std
  (ddof = 0) of ``cos(x_i, x_j)`` over all pairs ``i < j``, computed exactly from
  the ``d x d`` Gram matrix of the unit rows, never from the ``N x N`` one:
  ``sum_{i != j} cos_ij = ||sum_i u_i||^2 - N`` and
  ``sum_{i != j} cos_ij^2 = ||U^T U||_F^2 - N``.
* **condition number**: ``s_max / s_min`` over the non-negligible spectrum,
  ``s_i > rtol * s_max`` with ``rtol = max(N, d) * eps(dtype)`` by default (the
  tolerance of ``numpy.linalg.matrix_rank``); also the numerical rank.

Invariances: all are invariant under rotations ``X -> X Q`` (``Q`` orthogonal);
effective rank, RankMe, alpha, condition number and the cosines are also
invariant under scaling ``X -> cX`` (``c != 0``); isotropy is not.

See docs/methods.md §B.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(500, 8, dtype=torch.float64)
    >>> 7.5 < effective_rank(x) <= 8
    True
    >>> sorted(spectral_summary(x, alpha_fit_range=(1, 8)))[:3]
    ['alpha_req', 'alpha_req_r2', 'condition_number']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float

from geolens._validation import check_float_matrix, working_dtype
from geolens.metrics import preprocess
from geolens.metrics.preprocess import check_spread

__all__ = [
    "ALPHA_FIT_RANGE",
    "METRICS",
    "RANKME_EPS",
    "Spectrum",
    "alpha_req",
    "condition_number",
    "cosine_stats",
    "effective_rank",
    "fit_range_within",
    "isotropy",
    "mean_cosine",
    "numerical_rank",
    "rankme",
    "spectral_summary",
    "spectral_summary_blocks",
    "spectrum_of",
]

RANKME_EPS = 1e-7
ALPHA_FIT_RANGE = (5, 100)
# The keys of spectral_summary, in display order.
METRICS: tuple[str, ...] = (
    "effective_rank", "rankme", "alpha_req", "alpha_req_r2", "isotropy", "log_isotropy",
    "mean_cosine", "cosine_std", "condition_number", "numerical_rank",
)


@dataclass(frozen=True)
class Spectrum:
    """The SVD of one (optionally centred) ``[N, d]`` matrix, shared by every metric.

    ``s`` holds the ``min(N, d)`` singular values, descending; ``u`` the left
    singular vectors ``[N, min(N, d)]`` (only when computed with ``vectors=True``).

    See docs/methods.md §B.1.
    """

    s: Float[torch.Tensor, "k"]
    u: Float[torch.Tensor, "N k"] | None
    n_rows: int
    n_cols: int
    dtype: torch.dtype
    centred: bool


def _prepare(x: object, name: str, centre: bool, min_rows: int = 2) -> torch.Tensor:
    x = check_float_matrix(x, name, min_rows=min_rows)
    input_dtype = x.dtype
    x = x.to(working_dtype(x))
    if not centre:
        return x
    centred = preprocess.centre(x)  # the function: the flag of the same name shadows it here
    check_spread(x, centred, dtype=input_dtype, what=f"the rows of {name}")
    return centred


def spectrum_of(
    x: Float[torch.Tensor, "N d"], *, centre: bool = False, vectors: bool = False, name: str = "X"
) -> Spectrum:
    """Validate ``x``, centre it if asked, and take its SVD once (values, and left vectors if ``vectors``).

    See docs/methods.md §B.1.

    Example:
        >>> import torch
        >>> spectrum_of(torch.eye(3)).s.tolist()
        [1.0, 1.0, 1.0]
    """
    return _svd(_prepare(x, name, centre), centre, vectors, name)


def _svd(x: torch.Tensor, centred: bool, vectors: bool, name: str) -> Spectrum:
    if vectors:
        u, s, _ = torch.linalg.svd(x, full_matrices=False)
    else:
        u, s = None, torch.linalg.svdvals(x)
    if not bool(s[0] > 0):
        raise ValueError(f"{name} is all zeros{' after centring (every row is the same)' if centred else ''}; "
                         "its spectrum is undefined")
    return Spectrum(s=s, u=u, n_rows=x.shape[0], n_cols=x.shape[1], dtype=x.dtype, centred=centred)


def _entropy_rank(p: torch.Tensor) -> float:
    # xlogy gives 0 log 0 = 0 exactly.
    return math.exp(float(-torch.special.xlogy(p, p).sum()))


def _default_rtol(sp: Spectrum) -> float:
    return max(sp.n_rows, sp.n_cols) * torch.finfo(sp.dtype).eps


# ---------------------------------------------------------------- from a Spectrum
def _effective_rank(sp: Spectrum) -> float:
    s = sp.s.double()
    return _entropy_rank(s / s.sum())


def _rankme(sp: Spectrum, eps: float = RANKME_EPS) -> float:
    s = sp.s.double()
    return _entropy_rank(s / s.abs().sum() + eps)


def _numerical_rank(sp: Spectrum, rtol: float | None) -> int:
    rtol = _default_rtol(sp) if rtol is None else float(rtol)
    return int((sp.s > rtol * sp.s[0]).sum())


def _condition_number(sp: Spectrum, rtol: float | None) -> float:
    rank = _numerical_rank(sp, rtol)
    s = sp.s.double()
    return float(s[0] / s[rank - 1])


def fit_range_within(fit_range: tuple[int, int], rank: int) -> tuple[int, int] | None:
    """``fit_range`` cut to the first ``rank`` eigenvalues (``stop <= rank``, ``stop - start >= 2``, the start moved
    down only as far as that needs); ``None`` when fewer than 2 remain.

    The default range is an upper bound: a spectrum of numerical rank 33 is fitted on ``(5, 33)``, one of rank 4
    on ``(2, 4)``.

    Example:
        >>> fit_range_within((5, 100), 33), fit_range_within((5, 100), 4), fit_range_within((5, 100), 1)
        ((5, 33), (2, 4), None)
    """
    start, stop = _check_fit_range(fit_range)
    stop = min(stop, int(rank))
    start = max(0, min(start, stop - 2))
    return (start, stop) if stop - start >= 2 else None


def _alpha_req_within_rank(sp: Spectrum, fit_range: tuple[int, int], rtol: float | None
                           ) -> tuple[float, float, int, int]:
    """``(alpha, R^2, start, stop)`` with ``fit_range`` cut to the numerical rank (NaN where the rank is below 2)."""
    rank = min(_numerical_rank(sp, rtol), sp.s.numel())
    within = fit_range_within(fit_range, rank)
    if within is None:
        return math.nan, math.nan, 0, rank
    return (*_alpha_req(sp, within, rtol), *within)


def _alpha_req(sp: Spectrum, fit_range: tuple[int, int], rtol: float | None) -> tuple[float, float]:
    start, stop = _check_fit_range(fit_range)
    n_eig = sp.s.numel()
    if stop > n_eig:
        raise ValueError(
            f"alpha-ReQ fit range {start}..{stop - 1} (0-based) needs {stop} covariance eigenvalues, but an "
            f"[{sp.n_rows}, {sp.n_cols}] matrix has only {n_eig}; "
            + (f"pass a smaller alpha_fit_range (e.g. ({max(0, min(start, n_eig - 2))}, {n_eig})) or more rows/columns"
               if n_eig >= 2 else "a fit needs at least 2 eigenvalues: pass more rows/columns")
        )
    rank = _numerical_rank(sp, rtol)
    if stop > rank:
        raise ValueError(
            f"alpha-ReQ fit range {start}..{stop - 1} reaches past the numerical rank {rank} of the "
            f"{'centred ' if sp.centred else ''}matrix (eigenvalues there are round-off); "
            f"use alpha_fit_range with stop <= {rank}"
        )
    denom = max(sp.n_rows - 1, 1) if sp.centred else sp.n_rows
    lam = sp.s.double()[start:stop].square() / denom
    ranks = torch.arange(start + 1, stop + 1, dtype=torch.float64, device=lam.device)
    return _weighted_loglog_fit(ranks, lam, weights=1.0 / ranks)


def _weighted_loglog_fit(i: torch.Tensor, lam: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
    """``(alpha, R^2)`` of the weighted fit ``log lam = a - alpha log i``."""
    x, y, w = i.log(), lam.log(), weights / weights.sum()
    x_bar, y_bar = (w * x).sum(), (w * y).sum()
    sxx = (w * (x - x_bar).square()).sum()
    sxy = (w * (x - x_bar) * (y - y_bar)).sum()
    syy = (w * (y - y_bar).square()).sum()
    slope = sxy / sxx
    residual = (w * (y - y_bar - slope * (x - x_bar)).square()).sum()
    r2 = 1.0 - residual / syy if bool(syy > 0) else torch.tensor(1.0)
    return float(-slope), float(r2)


def _log_isotropy(sp: Spectrum) -> float:
    if sp.u is None:
        raise ValueError("isotropy needs the singular vectors: spectrum_of(..., vectors=True)")
    projections = (sp.u * sp.s).double()  # column j = X v_j = the scores c^T w for c = v_j
    log_z = torch.cat([torch.logsumexp(projections, dim=0), torch.logsumexp(-projections, dim=0)])
    if sp.n_cols > sp.s.numel():
        # d > N: the null space of X^T X has eigenvectors c with c^T w = 0 for every row: Z = N.
        log_z = torch.cat([log_z, log_z.new_tensor([math.log(sp.n_rows)])])
    return float(log_z.min() - log_z.max())


def _check_fit_range(fit_range: tuple[int, int]) -> tuple[int, int]:
    try:
        start, stop = (int(v) for v in fit_range)
    except (TypeError, ValueError) as err:
        raise TypeError(f"alpha_fit_range must be a pair of ints (start, stop), got {fit_range!r}") from err
    if start < 0 or stop - start < 2:
        raise ValueError(f"alpha_fit_range = ({start}, {stop}) must satisfy 0 <= start and stop - start >= 2")
    return start, stop


# ---------------------------------------------------------------- public metrics
def effective_rank(x: Float[torch.Tensor, "N d"], *, centre: bool = False) -> float:
    """Roy & Vetterli effective rank ``exp(-sum p log p)``, ``p_i = s_i / sum(s)``.

    Lies in ``[1, rank]``; ``r`` equal non-zero singular values give exactly ``r``.

    See docs/methods.md §B.2.

    Example:
        >>> import torch
        >>> round(effective_rank(torch.diag(torch.tensor([1.0, 1.0, 0.0]))), 6)
        2.0
    """
    return _effective_rank(spectrum_of(x, centre=centre))


def rankme(x: Float[torch.Tensor, "N d"], *, centre: bool = False, eps: float = RANKME_EPS) -> float:
    """RankMe (Garrido et al. 2023): ``exp(-sum p log p)``, ``p_i = s_i / ||s||_1 + eps``, ``eps = 1e-7``.

    Convention: singular values of the matrix itself (not covariance
    eigenvalues), uncentred by default as in the paper, all ``min(N, d)`` values.

    See docs/methods.md §B.3.

    Example:
        >>> import torch
        >>> abs(rankme(torch.eye(4)) - 4) < 1e-4
        True
    """
    return _rankme(spectrum_of(x, centre=centre), eps)


def alpha_req(
    x: Float[torch.Tensor, "N d"],
    *,
    fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    centre: bool = True,
    rtol: float | None = None,
) -> tuple[float, float]:
    """alpha-ReQ: ``(alpha, R^2)`` of the power-law fit ``lambda_i ~ i^-alpha`` of the covariance spectrum.

    ``lambda_i = s_i^2 / (N - 1)`` of the centred matrix (``centre=False``: of
    ``X^T X / N``), fitted by weighted least squares of ``log lambda_i`` on
    ``log i`` (1-based rank ``i``) with weights ``1 / i`` over the 0-based
    half-open index range ``fit_range`` (default ``(5, 100)`` = indices 5..99).
    Raises if the matrix has fewer eigenvalues than the range needs, or if the
    range reaches past its numerical rank (``rtol`` as in :func:`condition_number`).

    See docs/methods.md §B.4.

    Example:
        >>> import torch
        >>> lam = torch.arange(1, 9, dtype=torch.float64) ** -1.5
        >>> alpha, r2 = alpha_req(torch.diag(lam.sqrt()), fit_range=(0, 8), centre=False)
        >>> round(alpha, 6), round(r2, 6)
        (1.5, 1.0)
    """
    return _alpha_req(spectrum_of(x, centre=centre), fit_range, rtol)


def isotropy(x: Float[torch.Tensor, "N d"], *, centre: bool = False, log: bool = False) -> float:
    """Mu & Viswanath isotropy ``min_c Z(c) / max_c Z(c)`` over ``c = +-`` eigenvectors of ``X^T X``.

    In ``(0, 1]``; 1 = perfectly isotropic. ``log=True`` returns ``log I`` (useful
    when ``I`` underflows: residual states with large norms give ``I ~ 0``).
    Not scale invariant.

    See docs/methods.md §B.5.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> isotropy(torch.randn(20000, 3, generator=g, dtype=torch.float64)) > 0.9
        True
    """
    value = _log_isotropy(spectrum_of(x, centre=centre, vectors=True))
    return value if log else math.exp(value)


def cosine_stats(x: Float[torch.Tensor, "N d"], *, centre: bool = False) -> tuple[float, float]:
    """``(mean, std)`` of the pairwise cosine similarity over all pairs ``i < j`` (std: ddof = 0).

    Exact, in ``O(N d^2)`` time and ``O(d^2)`` memory (no ``N x N`` matrix);
    computed in float64. Rows of zero norm raise.

    See docs/methods.md §B.6.

    Example:
        >>> import torch
        >>> m, sd = cosine_stats(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        >>> round(m, 6), round(sd, 6)
        (0.471405, 0.333333)
    """
    x = _prepare(x, "X", centre).double()
    n = x.shape[0]
    norms = x.norm(dim=1)
    zero = norms <= torch.finfo(torch.float64).tiny
    if bool(zero.any()):
        raise ValueError(f"{int(zero.sum())} rows have zero norm{' after centring' if centre else ''}; "
                         "their cosine similarity is undefined")
    unit = x / norms.unsqueeze(1)
    pairs = n * (n - 1)  # ordered pairs i != j; the mean over i < j is the same
    total = unit.sum(dim=0).square().sum() - n
    total_sq = (unit.T @ unit).square().sum() - n
    mean = total / pairs
    var = (total_sq / pairs - mean.square()).clamp_min(0.0)
    return float(mean), float(var.sqrt())


def mean_cosine(x: Float[torch.Tensor, "N d"], *, centre: bool = False) -> float:
    """Mean pairwise cosine similarity over pairs ``i < j`` (see :func:`cosine_stats` for its spread).

    See docs/methods.md §B.6.

    Example:
        >>> import torch
        >>> round(mean_cosine(torch.tensor([[1.0, 0.0], [1.0, 0.0]])), 6)
        1.0
    """
    return cosine_stats(x, centre=centre)[0]


def numerical_rank(x: Float[torch.Tensor, "N d"], *, centre: bool = False, rtol: float | None = None) -> int:
    """Number of singular values ``> rtol * s_max`` (default ``rtol = max(N, d) * eps(dtype)``).

    See docs/methods.md §B.7.

    Example:
        >>> import torch
        >>> numerical_rank(torch.diag(torch.tensor([2.0, 1.0, 0.0])))
        2
    """
    return _numerical_rank(spectrum_of(x, centre=centre), rtol)


def condition_number(x: Float[torch.Tensor, "N d"], *, centre: bool = False, rtol: float | None = None) -> float:
    """``s_max / s_min`` over the non-negligible singular values (``s_i > rtol * s_max``).

    ``rtol`` defaults to ``max(N, d) * eps(dtype)`` (``numpy.linalg.matrix_rank``'s
    tolerance), so exact zeros and round-off are left out and a rank-deficient
    matrix reports the conditioning of its range. An all-zero matrix raises.

    See docs/methods.md §B.7.

    Example:
        >>> import torch
        >>> round(condition_number(torch.diag(torch.tensor([4.0, 2.0, 0.0]))), 6)
        2.0
    """
    return _condition_number(spectrum_of(x, centre=centre), rtol)


def _summary(sp: Spectrum, *, alpha_fit_range: tuple[int, int], rtol: float | None, eps: float, clip_fit_range: bool,
             log_iso: float, cos_mean: float, cos_std: float) -> dict[str, float]:
    """The summary dict of :func:`spectral_summary` and :func:`spectral_summary_blocks` from their spectrum."""
    if clip_fit_range:
        alpha, r2, fit_start, fit_stop = _alpha_req_within_rank(sp, alpha_fit_range, rtol)
    else:
        alpha, r2 = _alpha_req(sp, alpha_fit_range, rtol)
    used = {"alpha_fit_start": fit_start, "alpha_fit_stop": fit_stop} if clip_fit_range else {}
    return {
        "effective_rank": _effective_rank(sp),
        "rankme": _rankme(sp, eps),
        "alpha_req": alpha,
        "alpha_req_r2": r2,
        "isotropy": math.exp(log_iso),
        "log_isotropy": log_iso,
        "mean_cosine": float(cos_mean),
        "cosine_std": float(cos_std),
        "condition_number": _condition_number(sp, rtol),
        "numerical_rank": _numerical_rank(sp, rtol),
        **used,
    }


def spectral_summary(
    x: Float[torch.Tensor, "N d"],
    centre: bool = True,
    *,
    alpha_fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    rtol: float | None = None,
    eps: float = RANKME_EPS,
    clip_fit_range: bool = False,
) -> dict[str, float]:
    """Every spectral metric of ``x`` from one SVD, as a dict of floats.

    Keys: ``effective_rank, rankme, alpha_req, alpha_req_r2, isotropy,
    log_isotropy, mean_cosine, cosine_std, condition_number, numerical_rank``.
    With ``centre=True`` (default) *every* metric is of the centred matrix,
    RankMe included (call :func:`rankme` on the raw matrix for Garrido's
    uncentred convention). ``alpha_fit_range`` must fit inside the spectrum
    (``stop <= min(N, d)``); pass a smaller one for small ``d``. With
    ``clip_fit_range=True`` it is an upper bound instead: cut to the numerical
    rank (:func:`fit_range_within`; alpha and R^2 are NaN below rank 2), and the
    range used is returned too (``alpha_fit_start``, ``alpha_fit_stop``).

    See docs/methods.md §B.1 and §B.8.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> out = spectral_summary(torch.randn(300, 16), alpha_fit_range=(2, 12))
        >>> 10 < out["effective_rank"] <= 16
        True
    """
    x = _prepare(x, "X", centre)
    sp = _svd(x, centre, True, "X")
    cos_mean, cos_std = cosine_stats(x)
    return _summary(sp, alpha_fit_range=alpha_fit_range, rtol=rtol, eps=eps, clip_fit_range=clip_fit_range,
                    log_iso=_log_isotropy(sp), cos_mean=cos_mean, cos_std=cos_std)


# Rows per float64 block of spectral_summary_blocks: block x d x 8 bytes at a time.
_ROW_BLOCK = 4096


def spectral_summary_blocks(
    x: Float[torch.Tensor, "N d"],
    centre: bool = True,
    *,
    alpha_fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    rtol: float | None = None,
    eps: float = RANKME_EPS,
    block: int = _ROW_BLOCK,
    clip_fit_range: bool = False,
) -> dict[str, float]:
    """:func:`spectral_summary` of a tall ``[N, d]`` matrix (``N >= d``) from its ``d x d`` Gram matrix, block by block.

    For a weight matrix such as ``W_U.T`` (``[50k, 4k]``) the SVD path holds a
    float32 copy, its ``[N, d]`` left singular vectors and float64 copies for the
    cosines: several times the matrix. Here rows are read ``block`` at a time in
    float64: the singular values are the square roots of the eigenvalues of
    ``X^T X`` (``eigh``, float64), the isotropy's scores ``X v_j`` and the cosines'
    sums are accumulated per block (two passes). Same keys and conventions as
    :func:`spectral_summary` (``clip_fit_range`` too); the numerical rank's default tolerance uses the
    input's working dtype, as there. Equal to it to the float32 SVD's rounding.

    See docs/methods.md §B.1 and §B.8.

    Example:
        >>> import torch
        >>> x = torch.randn(3000, 16, generator=torch.Generator().manual_seed(0))
        >>> a = spectral_summary_blocks(x, alpha_fit_range=(2, 12), block=500)
        >>> b = spectral_summary(x, alpha_fit_range=(2, 12))
        >>> abs(a["effective_rank"] - b["effective_rank"]) < 1e-4, abs(a["log_isotropy"] - b["log_isotropy"]) < 1e-4
        (True, True)
    """
    from geolens._validation import check_int

    x = check_float_matrix(x, "X", min_rows=2)
    block = check_int(block, "block", low=1)
    n, d = x.shape
    if n < d:
        raise ValueError(f"X must have at least as many rows as columns (N >= d), got shape {tuple(x.shape)}; "
                         "use spectral_summary")
    blocks = [(start, min(start + block, n)) for start in range(0, n, block)]
    mean = _block_mean(x, blocks) if centre else torch.zeros(d, dtype=torch.float64, device=x.device)
    sums = _block_sums(x, blocks, mean)
    if centre:  # the spread check of _prepare, from the two Frobenius norms
        check_spread(torch.tensor([[sums.raw_sq ** 0.5]]),
                     torch.tensor([[float(sums.gram.trace().clamp_min(0)) ** 0.5]]), dtype=x.dtype, what="the rows of X")
    s, right = _gram_spectrum(sums.gram)
    if not bool(s[0] > 0):
        raise ValueError(f"X is all zeros{' after centring (every row is the same)' if centre else ''}; "
                         "its spectrum is undefined")
    sp = Spectrum(s=s, u=None, n_rows=n, n_cols=d, dtype=working_dtype(x), centred=centre)
    log_iso = _block_log_isotropy(x, blocks, mean, right)
    if sums.n_zero:
        raise ValueError(f"{sums.n_zero} rows have zero norm{' after centring' if centre else ''}; "
                         "their cosine similarity is undefined")
    pairs = n * (n - 1)
    cos_mean = (sums.unit_sum.square().sum() - n) / pairs
    cos_var = ((sums.unit_gram.square().sum() - n) / pairs - cos_mean.square()).clamp_min(0.0)
    return _summary(sp, alpha_fit_range=alpha_fit_range, rtol=rtol, eps=eps, clip_fit_range=clip_fit_range,
                    log_iso=log_iso, cos_mean=cos_mean, cos_std=cos_var.sqrt())


@dataclass
class _BlockSums:
    """What one pass over the rows of ``X`` accumulates (float64): the centred Gram matrix, the sum and Gram
    matrix of the unit rows (the cosines' moments), the raw squared norm and the count of zero rows."""

    gram: torch.Tensor
    unit_sum: torch.Tensor
    unit_gram: torch.Tensor
    raw_sq: float = 0.0
    n_zero: int = 0


def _block_mean(x: torch.Tensor, blocks: list[tuple[int, int]]) -> torch.Tensor:
    """The float64 mean row of ``x``, read ``blocks`` at a time.

    Example:
        >>> x = torch.arange(12.0).reshape(6, 2)
        >>> _block_mean(x, [(0, 4), (4, 6)]).tolist()
        [5.0, 6.0]
    """
    mean = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for a, b in blocks:
        mean += x[a:b].to(torch.float64).sum(dim=0)
    return mean / x.shape[0]


def _block_sums(x: torch.Tensor, blocks: list[tuple[int, int]], mean: torch.Tensor) -> _BlockSums:
    """One float64 pass over the rows of ``x`` less ``mean``, block by block (see :class:`_BlockSums`).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
        >>> sums = _block_sums(x, [(0, 2), (2, 3)], torch.zeros(2, dtype=torch.float64))
        >>> sums.gram.tolist(), sums.unit_sum.tolist(), sums.raw_sq, sums.n_zero
        ([[1.0, 0.0], [0.0, 4.0]], [1.0, 1.0], 5.0, 1)
    """
    d, f64 = x.shape[1], torch.float64
    tiny = torch.finfo(f64).tiny
    sums = _BlockSums(gram=torch.zeros(d, d, dtype=f64, device=x.device),
                      unit_sum=torch.zeros(d, dtype=f64, device=x.device),
                      unit_gram=torch.zeros(d, d, dtype=f64, device=x.device))
    for a, b in blocks:
        rows = x[a:b].to(f64)
        sums.raw_sq += float(rows.square().sum())
        rows = rows - mean  # not in place: for float64 input the block is a view of x
        sums.gram.addmm_(rows.T, rows)
        norms = rows.norm(dim=1)
        sums.n_zero += int((norms <= tiny).sum())
        unit = rows / norms.clamp_min(tiny).unsqueeze(1)
        sums.unit_sum += unit.sum(dim=0)
        sums.unit_gram.addmm_(unit.T, unit)
    return sums


def _gram_spectrum(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values (descending) and right singular vectors of ``X`` from its float64 Gram matrix.

    The Gram squares the spectrum, so float64 resolves singular values only down to about
    ``s_max * sqrt(d * eps)``; below that an eigenvalue is rounding, and its singular value is taken as 0.

    Example:
        >>> s, right = _gram_spectrum(torch.diag(torch.tensor([4.0, 9.0, 0.0], dtype=torch.float64)))
        >>> s.tolist(), right[:, 0].abs().tolist()
        ([3.0, 2.0, 0.0], [0.0, 1.0, 0.0])
    """
    eigvals, eigvecs = torch.linalg.eigh(gram)
    order = torch.argsort(eigvals, descending=True)
    s, right = eigvals[order].clamp_min(0).sqrt(), eigvecs[:, order]
    floor = s[0] * math.sqrt(gram.shape[0] * torch.finfo(torch.float64).eps)
    return torch.where(s > floor, s, torch.zeros_like(s)), right


def _block_log_isotropy(x: torch.Tensor, blocks: list[tuple[int, int]], mean: torch.Tensor,
                        right: torch.Tensor) -> float:
    """The isotropy's ``min log Z(+-v_j) - max log Z(+-v_j)``, with ``log Z(+-v_j)`` the logsumexp over rows of
    ``+-(x_i - mean) . v_j``, accumulated block by block.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> _block_log_isotropy(x, [(0, 3), (3, 4)], torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
        0.0
    """
    log_pos = torch.full((right.shape[1],), -math.inf, dtype=torch.float64, device=x.device)
    log_neg = log_pos.clone()
    for a, b in blocks:
        scores = (x[a:b].to(torch.float64) - mean) @ right
        log_pos = torch.logaddexp(log_pos, torch.logsumexp(scores, dim=0))
        log_neg = torch.logaddexp(log_neg, torch.logsumexp(-scores, dim=0))
    log_z = torch.cat([log_pos, log_neg])
    return float(log_z.min() - log_z.max())
