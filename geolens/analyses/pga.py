"""``geolens.pga``: subspace PGA of every layer of a model."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from geolens import plotting
from geolens._validation import DEFAULT_N_TOKENS, DegenerateError, check_int, resolve_k
from geolens.capture import States, capture
from geolens.interventions import subspace_basis
from geolens.metrics.grassmann import random_subspaces
from geolens.metrics.intervals import INTERVAL_LEVEL, MIN_FINITE_FRACTION, symmetric_interval
from geolens.metrics.pga import MIN_SAMPLED_PAIRS, PairSample, subspace_pga
from geolens.metrics.readout import readout_basis
from geolens.metrics.resampling import LayerResampler, resample_pairs, text_resamples
from geolens.model import READOUTS, Model, as_adapter
from geolens.results import Result
from geolens.sites import FINAL_SITE, RESIDUAL_SITE, check_site

__all__ = ["pga", "PGAResult", "default_k", "text_resamples", "resample_pairs", "resampled_z",
           "MIN_BOOTSTRAP_TEXTS", "MIN_RESAMPLES", "MAX_RESAMPLES", "capture_sites", "report_section", "zoo_options"]

DEFAULT_K = 100
_SCORE_COLUMNS = ("rho_readout", "null_mean", "null_std", "z", "p_value", "pc1_readout_energy", "random_energy")
# With n_pairs (approximate PGA): each estimate's jackknife standard error next to it, and the null's
# spread as observed (null_std_raw) and its pair-sampling noise (pair_noise_std), taken out of null_std.
_APPROX_COLUMNS = ("rho_readout", "rho_se", "null_mean", "null_std", "null_std_raw", "pair_noise_std", "z", "z_se",
                   "p_value", "pc1_readout_energy", "random_energy")
# The bootstrap over texts (n_resamples > 0): the fewest texts it is worth much with (below it the resamples
# repeat a handful of texts; it runs, warns and says so in params).
MIN_BOOTSTRAP_TEXTS = 10
# An interval needs a spread of resampled z to read its ends from: fewer resamples are refused. The floor is
# the fewest whose t(B - 1) quantile widens the interval by at most 10 % over the normal one (the price of
# reading the spread from B resamples). More than MAX_RESAMPLES cost time (and memory for their z) without
# changing the interval.
MIN_RESAMPLES = 15
MAX_RESAMPLES = 10_000
# Pairs of all resamples kept at once (16 bytes each); beyond, each layer remakes its resamples' pairs.
_PAIR_CACHE = 1 << 24


@dataclass(repr=False)
class PGAResult(Result):
    """Subspace PGA per layer (and per CCR value): ``layer, site, ccr, rho_readout, null_mean,
    null_std, z, p_value, pc1_readout_energy, random_energy``.

    ``null_rhos`` holds, per row, ``{"site", "layer", "ccr", "rhos"}`` with the null
    Spearman values, so the null distribution can be inspected or re-plotted.
    With ``geolens.pga(..., n_resamples=B)`` the table also has ``z_low, z_high`` (the
    95 % interval of z over resampled texts, symmetric about z; docs/methods.md §A.10) and
    ``z_end_error``, and ``resampled_z`` holds, per
    row, ``{"site", "layer", "ccr", "z"}`` with the ``B`` resampled z (empty without).
    """

    null_rhos: list[dict[str, Any]] = field(default_factory=list)
    resampled_z: list[dict[str, Any]] = field(default_factory=list)
    title: ClassVar[str] = "PGAResult"

    def plot(self, *, kind: str = "z"):
        """Plotly figure: ``kind="z"`` (z by layer, null band +-1.96; with ``z_low``/``z_high``, each
        line's bootstrap interval as a shaded band) or ``"rho"`` (rho vs null mean +-2 sd)."""
        return plotting.pga_figure(self.to_pandas(), kind=kind, title=self._summary())


def default_k(d_model: int) -> int:
    """The paper's k = 100, clipped below d."""
    return min(DEFAULT_K, d_model - 1)


def pga(
    model: Model,
    tokens: str | Sequence[str] | torch.Tensor | States,
    *,
    k: int | float | None = None,
    n_null: int = 100,
    ccr: int | Sequence[int] = 1,
    site: str = RESIDUAL_SITE,
    layers: Sequence[int] | None = None,
    readout: str | torch.Tensor = "raw",
    include_final: bool = True,
    n_pairs: int | None = None,
    n_resamples: int = 0,
    bootstrap_pairs: int | None = None,
    n_tokens: int | None = DEFAULT_N_TOKENS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> PGAResult:
    """Subspace PGA z-score of every layer of ``model`` on ``tokens``.

    Captures ``n_tokens`` sampled positions (BOS and padding excluded) at
    ``site`` for each layer (0 = embeddings), plus the post-``ln_final`` state
    the unembedding reads (``include_final``), then scores each layer's states
    against the top-``k`` readout subspace of ``W_U`` with ``n_null``
    Haar-random subspaces (the same ones for every layer and CCR value).
    See docs/methods.md §A.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text, list of texts, ``[B, T]`` token ids, or :class:`~geolens.capture.States`
            captured before from this model (scored as they are: every captured layer
            of ``site``, and ``final`` if captured; ``layers`` and the sampling
            options are then not used).
        k: readout dimension (an int, or a float in (0, 1): that fraction of ``d_model``); default
            ``min(100, d_model - 1)``. ``k >= d_model`` raises.
        n_null: number of random subspaces (>= 2).
        ccr: components removed after centring; a list (e.g. ``[0, 1, 5, 10]``)
            gives one row per (layer, ccr), the paper's masking sweep.
        site: which states (``resid_post`` = the residual stream; also ``attn_out``, ...).
        layers: layer indices (default all).
        readout: ``"raw"`` (the model's ``W_U``), ``"folded"`` (``diag(ln_final.w) @ W_U``),
            or a ``[d_model, k]`` basis of your own (orthonormalised; ``k`` is then its width).
        include_final: also score the post-``ln_final`` state (the row with ``site == "final"``).
        n_pairs: ``None`` (default): exact PGA over all ``N (N - 1) / 2`` pairs. An int:
            approximate PGA on a seeded uniform sample of that many pairs (the same pairs
            for every layer, CCR value and subspace); the table then has ``rho_se`` and
            ``z_se`` (jackknife standard errors, docs/methods.md §A.4a) next to
            ``rho_readout`` and ``z``, and ``null_std`` is the null's spread with the
            pair-sampling noise taken out (``null_std_raw``: as observed;
            ``pair_noise_std``: the noise taken out). Its cost hardly grows with ``N``
            (measured speed-ups in docs/benchmarks.md, from bench/pga.py).
        n_resamples: ``0`` (default): no bootstrap; the table has no ``z_low``/``z_high``
            columns. ``B > 0``: the uncertainty of z over the text sample (docs/methods.md
            §A.10). The texts (sequences) that have captured rows are resampled with
            replacement ``B`` times, each text's positions kept together, and z is
            recomputed on the captured rows of each resample (no new forward pass):
            centring, CCR and every Spearman again, against the *same* null subspaces
            (they define the statistic: redrawing them would mix the null's own Monte
            Carlo error, which depends on ``n_null`` and not on the text, into an interval
            about the text). A row drawn twice would pair with its own copy at distance 0;
            those self-duplicate pairs are dropped (the statistic has no pair of a
            position with itself), every other pair counts as often as its two rows were
            drawn. Ranked on a sample of its pairs, a resample's null spread has their noise
            taken out as in the point estimate. The table gains ``z_low``, ``z_high`` after
            ``z`` (``z -+ t(B - 1) sqrt(T / (T - 1)) sd`` of the resampled z over ``T``
            texts: the interval of z at this sample's size, not of its large-sample limit;
            NaN where fewer than 80 % of the resamples were scorable) and ``z_end_error``
            (the Monte Carlo error of an end), ``result.resampled_z`` every resample's z.
            ``B`` is ``MIN_RESAMPLES`` (15) to 10,000. Fewer than ``MIN_BOOTSTRAP_TEXTS`` texts
            warns (a handful of texts cannot show what another sample would give); fewer than 2
            raises. Costs about ``B`` times the
            scoring (less with ``bootstrap_pairs``).
        bootstrap_pairs: pairs per resample: ``None`` (default) as the point estimate
            (all pairs, or ``n_pairs``); an int (at least ``MIN_SAMPLED_PAIRS``) ranks each
            resample on a seeded uniform sample of that many of its pairs, so the interval
            also holds that sample's (smaller) error: the affordable way to bootstrap
            exact scores.
        n_tokens: positions sampled (seeded, the same for every layer); an upper bound.
        seed: seed for positions, null subspaces and resamples.
        batch_size: texts per forward pass.
        max_length: truncation of each text, in tokens (``None``: whole texts).
        attention_mask: mask of a token-id tensor.
        progress: show progress bars.

    Returns:
        :class:`PGAResult`; ``.to_pandas()`` has one row per
        layer (and ccr): ``layer, site, ccr, rho_readout, null_mean, null_std,
        z, p_value, pc1_readout_energy, random_energy`` (with ``n_pairs``:
        ``rho_se`` after ``rho_readout``, ``null_std_raw, pair_noise_std`` after ``null_std``
        and ``z_se`` after ``z``);
        ``params["n_pairs"]`` is the number of pairs used (``None``: all). With
        ``n_resamples``: ``z_low, z_high`` after ``z`` (and ``z_se``), and
        ``params["bootstrap"]`` (resamples, texts, pairs, how many failed).
        ``p_value`` is the one-sided empirical p-value
        ``(1 + #{null rho >= rho_readout}) / (n_null + 1)``, never below its floor
        ``1 / (n_null + 1)`` however large ``z`` is (0.048 at ``n_null=20``).

    Example:
        >>> res = pga(model, texts, k=8, n_null=10, ccr=[0, 1], n_tokens=24, progress=False)
        >>> res.to_pandas().shape
        (8, 10)
        >>> states = capture(model, texts, sites=("resid_post", "final"), n_tokens=24, progress=False)
        >>> pga(model, states, k=8, n_null=10, progress=False).to_pandas().site.tolist()
        ['resid_post', 'resid_post', 'resid_post', 'final']

        With the bootstrap over texts (here 12 random-id sequences; use tens of texts):

        >>> ids = torch.randint(0, adapter.d_vocab, (12, 10), generator=torch.Generator().manual_seed(0))
        >>> table = pga(model, ids, k=8, n_null=10, n_tokens=60, n_resamples=20, progress=False).to_pandas()
        >>> list(table.columns[6:9]), bool((table.z_low <= table.z_high).all())
        (['z', 'z_low', 'z_high'], True)
    """
    adapter = as_adapter(model)
    ccrs = _ccr_list(ccr)
    n_null = check_int(n_null, "n_null", low=2)
    if n_pairs is not None:
        n_pairs = check_int(n_pairs, "n_pairs", low=2)  # before any capture; the rest once N is known
    n_resamples, bootstrap_pairs = _check_bootstrap(n_resamples, bootstrap_pairs)
    check_site(site)
    if isinstance(readout, torch.Tensor):
        basis = subspace_basis(readout, adapter.d_model, "readout")
        k = basis.shape[1]
        if not 1 <= k < adapter.d_model:
            raise ValueError(f"readout must have 1 to d_model - 1 = {adapter.d_model - 1} columns, got {k}")
    else:
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS} or a [d_model, k] tensor, got {readout!r}")
        k = resolve_k(k, adapter.d_model)
        if k is None:
            k = default_k(adapter.d_model)
            if k < DEFAULT_K:
                warnings.warn(f"k: the paper's k = {DEFAULT_K} does not fit d_model = {adapter.d_model}; using "
                              f"k = {k} (pass k to choose)", stacklevel=2)
        if k >= adapter.d_model:
            raise ValueError(f"k must be < d_model = {adapter.d_model}, got k = {k}")
        basis = readout_basis(adapter.unembed_matrix(readout), k)
    if isinstance(tokens, States):
        states = tokens
        if site not in states.sites:
            raise ValueError(f"the states hold sites {list(states.sites)}, not {site!r}")
        states.check_width(adapter.d_model)
        states = states.select([s for s in (site, FINAL_SITE) if s in states.sites and (s == site or include_final)])
    else:
        sites = (site, FINAL_SITE) if include_final and site != FINAL_SITE else (site,)
        states = capture(
            adapter, tokens, sites=sites, layers=layers, n_tokens=n_tokens, seed=seed, batch_size=batch_size,
            progress=progress, attention_mask=attention_mask, max_length=max_length,
        )
    if n_resamples:
        _check_texts(states, n_resamples)
    result = _score_states(states, basis, n_null=n_null, ccr=ccrs, seed=seed, n_pairs=n_pairs, progress=progress,
                           n_resamples=n_resamples, bootstrap_pairs=bootstrap_pairs)
    result.params.update(
        model=adapter.name, readout=readout if isinstance(readout, str) else "custom", site=site,
        processing=dict(adapter.processing), n_layers=adapter.n_layers, d_model=adapter.d_model,
    )
    return result


def _score_states(
    states: States,
    readout: torch.Tensor,
    *,
    n_null: int = 100,
    ccr: int | Sequence[int] = 1,
    seed: int = 0,
    n_pairs: int | None = None,
    progress: bool = True,
    n_resamples: int = 0,
    bootstrap_pairs: int | None = None,
) -> PGAResult:
    """Subspace PGA of captured :class:`~geolens.capture.States` against a ``[d, k]`` orthonormal readout basis."""
    ccrs = _ccr_list(ccr)
    reference = states[states.sites[0]]
    d, k = reference.shape[-1], readout.shape[-1]
    readout = readout.to(device=reference.device, dtype=reference.dtype)
    nulls = random_subspaces(d, k, n_null, seed=seed, dtype=reference.dtype, device=reference.device)
    columns = _SCORE_COLUMNS if n_pairs is None else _APPROX_COLUMNS
    cells = [(site, layer, m) for site in states.sites for layer in states.layers[site] for m in ccrs]
    rows, null_rhos, degenerate, used_pairs = [], [], [], None
    for site, layer, m in tqdm(cells, desc="PGA", disable=not progress, leave=False):
        row, rhos, score = _score_cell(states.layer(site, layer), readout, nulls, site=site, layer=layer, ccr=m,
                                       seed=seed, n_pairs=n_pairs, columns=columns)
        rows.append(row)
        null_rhos.append({"site": site, "layer": layer, "ccr": m, "rhos": rhos})
        if score is None:
            degenerate.append(f"{site} layer {layer} (ccr={m}): {row['degenerate']}")
        else:
            used_pairs = score.n_pairs
    _flag_degenerate(rows, degenerate)
    params = {"k": k, "n_null": n_null, "ccr": ccrs if len(ccrs) > 1 else ccrs[0], "n_tokens": states.n_tokens,
              "seed": seed}
    if n_pairs is not None:
        params.update(_pair_params(n_pairs, used_pairs, states.n_tokens))
    resampled: list[dict] = []
    if n_resamples:
        pairs = bootstrap_pairs if bootstrap_pairs is not None else n_pairs
        if pairs is not None and pairs >= states.n_tokens * (states.n_tokens - 1) // 2:
            pairs = None  # as many as a resample has: all of them, and recorded so
        resampled = _bootstrap(states, readout, nulls, ccrs, rows, n_resamples=n_resamples, n_pairs=pairs, seed=seed,
                               progress=progress)
        n_texts = int(torch.unique(states.batch_index).numel())
        failed = _add_intervals(rows, resampled, columns, n_resamples, n_texts=n_texts)
        params["n_resamples"] = n_resamples
        params["bootstrap"] = {
            "n_resamples": n_resamples, "n_texts": n_texts, "unit": "text (positions kept together)",
            "interval": f"z +- t(B - 1) * sqrt(T / (T - 1)) * sd of the resampled z (T texts), level {INTERVAL_LEVEL}",
            "target": "z at the sample's size (another sample of as many texts); not z's large-sample limit",
            "nulls": "the point estimate's, kept fixed",
            "pairs": "all, self-duplicate pairs dropped" if pairs is None else
                     f"{pairs} sampled per resample, self-duplicate pairs dropped, their noise taken out of each "
                     "resample's null spread as in the point estimate (docs/methods.md §A.4a)",
            "failed": failed,
            "few_texts": n_texts < MIN_BOOTSTRAP_TEXTS,
        }
    return PGAResult(rows=rows, params=params, null_rhos=null_rhos, resampled_z=resampled)


def _score_cell(layer_states: torch.Tensor, readout: torch.Tensor, nulls: torch.Tensor, *, site: str, layer: int,
                ccr: int, seed: int, n_pairs: int | None, columns: Sequence[str]):
    """One (site, layer, CCR) cell: ``(row, null rhos, score)``; a degenerate cell gives a row of NaN with the
    reason in ``degenerate``, no null rhos and ``score = None``. Other bad input raises, naming the cell."""
    try:
        score = subspace_pga(layer_states, readout, ccr=ccr, null_subspaces=nulls, seed=seed, n_pairs=n_pairs)
    except DegenerateError as err:
        # One degenerate cell (e.g. CCR-10 of an embedding layer with few distinct tokens) is
        # flagged in its row; the rest of the sweep still stands.
        return {"layer": layer, "site": site, "ccr": ccr, **dict.fromkeys(columns, math.nan),
                "degenerate": str(err)}, [], None
    except ValueError as err:
        raise ValueError(f"{site} layer {layer} (ccr={ccr}): {err}") from err
    values = {"rho_readout": score.rho_readout, "rho_se": score.rho_se, "null_mean": score.null_mean,
              "null_std": score.null_std, "null_std_raw": score.null_std_raw,
              "pair_noise_std": score.pair_noise_std, "z": score.z, "z_se": score.z_se, "p_value": score.p_value,
              "pc1_readout_energy": score.pc1_readout_energy, "random_energy": score.random_energy}
    row = {"layer": layer, "site": site, "ccr": ccr, **{c: values[c] for c in columns}}
    return row, score.null_rhos.tolist(), score


def _flag_degenerate(rows: list[dict], degenerate: list[str]) -> None:
    """Every row gets a ``degenerate`` column (``""`` where scored) when any cell is; all degenerate raises.

    Example:
        >>> rows = [{"z": 1.0}, {"z": float("nan"), "degenerate": "one distinct state"}]
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _flag_degenerate(rows, ["resid_post layer 0 (ccr=1): one distinct state"])
        >>> rows[0]["degenerate"], len(caught)
        ('', 1)
    """
    if not degenerate:
        return
    if len(degenerate) == len(rows):  # nothing to show
        raise DegenerateError(f"every layer is degenerate, e.g. {degenerate[0]}")
    warnings.warn(f"{len(degenerate)} of {len(rows)} PGA scores are undefined (NaN, reason in the 'degenerate' "
                  f"column), e.g. {degenerate[0]}", stacklevel=4)
    for row in rows:
        row.setdefault("degenerate", "")


def _pair_params(n_pairs: int, used_pairs: int | None, n_tokens: int) -> dict[str, Any]:
    """``n_pairs`` as used (all ``N(N-1)/2`` at most), whether that is exact, and how the null spread was corrected.

    Example:
        >>> _pair_params(10_000, None, 100)
        {'n_pairs': 4950, 'exact': True}
    """
    total = n_tokens * (n_tokens - 1) // 2
    out: dict[str, Any] = {"n_pairs": used_pairs if used_pairs is not None else min(n_pairs, total)}
    out["exact"] = out["n_pairs"] == total
    if not out["exact"]:
        out["null_std"] = "pair-sampling noise subtracted (jackknife; docs/methods.md §A.4a)"
    return out


def _add_intervals(rows: list[dict], resampled: list[dict], columns: Sequence[str], n_resamples: int, *,
                   n_texts: int) -> int:
    """Each row's interval of z (``z_low``, ``z_high``, symmetric about ``z``; :func:`~geolens.metrics.intervals.
    symmetric_interval` over ``n_texts`` resampled texts) and the Monte Carlo error of its ends
    (``z_end_error``), after ``z_se`` (else after ``z``), in place; returns how many resampled scores of
    scorable cells were undefined (a warning says so).

    Example:
        >>> rows = [{"layer": 0, "site": "s", "ccr": 1, "z": 5.0}]
        >>> _add_intervals(rows, [{"z": [4.0, 6.0] * 10}], ["z"], 20, n_texts=32), list(rows[0])
        (0, ['layer', 'site', 'ccr', 'z', 'z_low', 'z_high', 'z_end_error'])
        >>> round(rows[0]["z_high"] - rows[0]["z"], 3)    # t(19) * sqrt(32 / 31) * sd
        2.182
    """
    failed = sum(int(np.isnan(r["z"]).sum()) for r, row in zip(resampled, rows) if math.isfinite(row["z"]))
    scorable = [r for r, row in zip(resampled, rows) if math.isfinite(row["z"])]
    for row, r in zip(rows, resampled):
        replicates = np.asarray(r["z"], dtype=float)
        row["z_low"], row["z_high"], row["z_end_error"] = symmetric_interval(row["z"], replicates, n_units=n_texts)
    if failed:
        warnings.warn(f"n_resamples: {failed} of {len(scorable) * n_resamples} resampled PGA scores are undefined "
                      f"(degenerate resamples); each interval uses the others (NaN below "
                      f"{MIN_FINITE_FRACTION:.0%})", stacklevel=4)
    columns = list(columns)
    at = columns.index("z_se" if "z_se" in columns else "z") + 1
    order = ["layer", "site", "ccr", *columns[:at], "z_low", "z_high", "z_end_error", *columns[at:]]
    rows[:] = [{key: row[key] for key in [*order, *(c for c in row if c not in order)]} for row in rows]
    return failed


def _check_bootstrap(n_resamples: object, bootstrap_pairs: object) -> tuple[int, int | None]:
    """``n_resamples`` 0 (off) or from ``MIN_RESAMPLES`` to ``MAX_RESAMPLES``; ``bootstrap_pairs`` None or at
    least ``MIN_SAMPLED_PAIRS``, and only with resamples.

    Example:
        >>> _check_bootstrap(0, None), _check_bootstrap(40, 10_000)
        ((0, None), (40, 10000))
        >>> _check_bootstrap(1, None)
        Traceback (most recent call last):
        ...
        ValueError: n_resamples = 1 cannot make an interval: pass at least 15 resamples (or 0 for none)
    """
    n_resamples = check_int(n_resamples, "n_resamples", low=0)
    if 0 < n_resamples < MIN_RESAMPLES:
        raise ValueError(f"n_resamples = {n_resamples} cannot make an interval: pass at least {MIN_RESAMPLES} "
                         "resamples (or 0 for none)")
    if n_resamples > MAX_RESAMPLES:
        raise ValueError(f"n_resamples = {n_resamples} is more than the {MAX_RESAMPLES} resamples an interval "
                         "can use (its Monte Carlo error is then far below the interval's width)")
    if bootstrap_pairs is None:
        return n_resamples, None
    bootstrap_pairs = check_int(bootstrap_pairs, "bootstrap_pairs", low=MIN_SAMPLED_PAIRS)
    if not n_resamples:
        raise ValueError("bootstrap_pairs sets the pairs of each bootstrap resample; it needs n_resamples > 0")
    return n_resamples, bootstrap_pairs


def _check_texts(states: States, n_resamples: int) -> None:
    """Raise with fewer than 2 texts (every resample would be the sample itself); warn under ``MIN_BOOTSTRAP_TEXTS``."""
    n_texts = int(torch.unique(states.batch_index).numel())
    if n_texts < 2:
        raise ValueError(f"n_resamples = {n_resamples}: the captured rows come from {n_texts} text; a bootstrap over "
                         "texts needs at least 2 (pass a list of texts, or n_resamples=0)")
    if n_texts < MIN_BOOTSTRAP_TEXTS:
        warnings.warn(f"n_resamples: the captured rows come from only {n_texts} texts; an interval from resampling "
                      f"fewer than {MIN_BOOTSTRAP_TEXTS} says little about another sample (recorded in "
                      "params['bootstrap']['few_texts'])", stacklevel=3)


def _bootstrap(
    states: States, readout: torch.Tensor, nulls: torch.Tensor, ccrs: list[int], rows: list[dict], *,
    n_resamples: int, n_pairs: int | None, seed: int, progress: bool,
) -> list[dict]:
    """Every row's z on each of ``n_resamples`` text resamples (rows whose own z is undefined are skipped),
    layer by layer (:class:`~geolens.metrics.resampling.LayerResampler`: what does not change between
    resamples is made once per layer)."""
    subspaces = torch.cat([readout.unsqueeze(0), nulls], dim=0)
    cells = {(row["site"], row["layer"], row["ccr"]): i for i, row in enumerate(rows)}
    z = np.full((len(rows), n_resamples), np.nan)
    jobs = [(site, layer) for site in states.sites for layer in states.layers[site]]
    todo = {job: [m for m in ccrs if math.isfinite(rows[cells[(*job, m)]]["z"])] for job in jobs}
    base_seed = 0 if seed is None else int(seed)
    resamples = text_resamples(states.batch_index, n_resamples, seed=base_seed)

    def pairs_of(b: int) -> PairSample:
        return resample_pairs(resamples[b], n_pairs, seed=base_seed, resample=b)

    # The pair sets are made once and kept when they fit in _PAIR_CACHE pairs, else remade per layer.
    n = states.n_tokens
    per_resample = n * (n - 1) // 2 if n_pairs is None else min(n_pairs, n * (n - 1) // 2)
    kept = [pairs_of(b) for b in range(n_resamples)] if per_resample * n_resamples <= _PAIR_CACHE else None
    work = [job for job in jobs if todo[job]]
    bar = tqdm(total=len(work) * n_resamples, desc="PGA bootstrap", disable=not progress, leave=False)
    for site, layer in work:
        layer_rows = LayerResampler(states.layer(site, layer), subspaces, texts=states.batch_index)
        for b, values in enumerate(layer_rows.z_many(resamples, kept.__getitem__ if kept else pairs_of,
                                                     todo[(site, layer)])):
            for m, value in zip(todo[(site, layer)], values):
                z[cells[(site, layer, m)], b] = value
            bar.update()
    bar.close()
    return [{"site": row["site"], "layer": row["layer"], "ccr": row["ccr"], "z": z[i].tolist()}
            for i, row in enumerate(rows)]


def _ccr_list(ccr: int | Sequence[int]) -> list[int]:
    if isinstance(ccr, (numbers.Number, torch.Tensor)) and not (isinstance(ccr, torch.Tensor) and ccr.ndim > 0):
        values = [ccr]
    elif isinstance(ccr, (str, bytes)) or not hasattr(ccr, "__iter__"):
        raise TypeError(f"ccr must be an int or a list of ints, got {type(ccr).__name__}")
    else:
        values = list(ccr)
    if not values:
        raise ValueError("ccr is an empty list")
    return [check_int(m, "ccr", low=0) for m in values]


# ---------------------------------------------------------------- how the report, studies and the zoo run pga
# (its record in geolens.analyses.registry points here)


def capture_sites(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The sites :func:`pga` scores with ``options``: its ``site``, and the final state with ``include_final``
    (what a study's cell captures once for it).

    Example:
        >>> capture_sites({}), capture_sites({"include_final": False})
        (('resid_post', 'final'), ('resid_post',))
    """
    site = options.get("site", RESIDUAL_SITE)
    return (site, FINAL_SITE) if options.get("include_final", True) and site != FINAL_SITE else (site,)


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[PGAResult, list[Any]]:
    """The report's PGA section: the run's shared states, its CCR sweep and bootstrap over texts."""
    s = run.settings
    states = run.states()
    # A bootstrap over texts needs two texts at least; with one, the point estimates alone, and why.
    n_texts = int(states.batch_index.unique().numel())
    resamples = s.pga_n_resamples if n_texts >= 2 else 0
    result = pga(run.adapter, states, k=s.k, n_null=s.n_null, ccr=s.ccr if isinstance(s.ccr, int) else list(s.ccr),
                 seed=s.seed, progress=s.progress, n_resamples=resamples,
                 bootstrap_pairs=s.pga_bootstrap_pairs if resamples else None)
    if s.pga_n_resamples and not resamples:
        result.params["bootstrap"] = f"not run: the captured positions come from {n_texts} text"
    return result, [result.plot()]


def zoo_options(settings: Any, *, width: int, lens_texts: Sequence[str]) -> dict[str, Any]:
    """PGA's options on a zoo member of ``width``: the settings' nulls and CCR sweep, ``k`` a fixed fraction of
    the width (``settings.k_for(width)``)."""
    return {"n_null": settings.n_null, "ccr": list(settings.ccr), "k": settings.k_for(width)}
