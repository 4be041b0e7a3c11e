"""``geolens.pga``: subspace PGA of every layer of a model."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Sequence

import torch
from tqdm.auto import tqdm

from geolens._validation import DEFAULT_N_TOKENS, DegenerateError, check_int
from geolens.capture import States, capture
from geolens.interventions import subspace_basis
from geolens.metrics.grassmann import random_subspaces
from geolens.metrics.pga import subspace_pga
from geolens.metrics.readout import readout_basis
from geolens.model import READOUTS, as_adapter
from geolens.results import PGAResult
from geolens.sites import FINAL_SITE, RESIDUAL_SITE, check_site

__all__ = ["pga", "default_k"]

DEFAULT_K = 100
_SCORE_COLUMNS = ("rho_readout", "null_mean", "null_std", "z", "p_value", "pc1_readout_energy", "random_energy")
# With n_pairs (approximate PGA): each estimate's jackknife standard error next to it, and the null's
# spread as observed (null_std_raw) and its pair-sampling noise (pair_noise_std), taken out of null_std.
_APPROX_COLUMNS = ("rho_readout", "rho_se", "null_mean", "null_std", "null_std_raw", "pair_noise_std", "z", "z_se",
                   "p_value", "pc1_readout_energy", "random_energy")


def default_k(d_model: int) -> int:
    """The paper's k = 100, clipped below d."""
    return min(DEFAULT_K, d_model - 1)


def pga(
    model: object,
    tokens: str | Sequence[str] | torch.Tensor | States,
    *,
    k: int | None = None,
    n_null: int = 100,
    ccr: int | Sequence[int] = 1,
    site: str = RESIDUAL_SITE,
    layers: Sequence[int] | None = None,
    readout: str | torch.Tensor = "raw",
    include_final: bool = True,
    n_pairs: int | None = None,
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
        k: readout dimension; default ``min(100, d_model - 1)``. ``k >= d_model`` raises.
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
            ``pair_noise_std``: the noise taken out). Its cost hardly grows with ``N``: on 2 CPU
            cores ``n_pairs=500_000`` measured 7.8x faster than exact at ``N = 4096`` and
            46x at ``N = 8192`` (bench/pga.py, idle).
        n_tokens: positions sampled (seeded, the same for every layer); an upper bound.
        seed: seed for positions and null subspaces.
        batch_size, max_length, attention_mask: forward batching, truncation, mask of an id tensor.
        progress: show progress bars.

    Returns:
        :class:`~geolens.results.PGAResult`; ``.to_pandas()`` has one row per
        layer (and ccr): ``layer, site, ccr, rho_readout, null_mean, null_std,
        z, p_value, pc1_readout_energy, random_energy`` (with ``n_pairs``:
        ``rho_se`` after ``rho_readout``, ``null_std_raw, pair_noise_std`` after ``null_std``
        and ``z_se`` after ``z``);
        ``params["n_pairs"]`` is the number of pairs used (``None``: all).
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
    """
    adapter = as_adapter(model)
    ccrs = _ccr_list(ccr)
    n_null = check_int(n_null, "n_null", low=2)
    if n_pairs is not None:
        n_pairs = check_int(n_pairs, "n_pairs", low=2)  # before any capture; the rest once N is known
    check_site(site)
    if isinstance(readout, torch.Tensor):
        basis = subspace_basis(readout, adapter.d_model, "readout")
        k = basis.shape[1]
        if not 1 <= k < adapter.d_model:
            raise ValueError(f"readout must have 1 to d_model - 1 = {adapter.d_model - 1} columns, got {k}")
    else:
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS} or a [d_model, k] tensor, got {readout!r}")
        if k is None:
            k = default_k(adapter.d_model)
            if k < DEFAULT_K:
                warnings.warn(f"k: the paper's k = {DEFAULT_K} does not fit d_model = {adapter.d_model}; using "
                              f"k = {k} (pass k to choose)", stacklevel=2)
        k = check_int(k, "k", low=1)
        if k >= adapter.d_model:
            raise ValueError(f"k must be < d_model = {adapter.d_model}, got k = {k}")
        basis = readout_basis(adapter.unembed_matrix(readout), k)
    if isinstance(tokens, States):
        states = tokens
        if site not in states.sites:
            raise ValueError(f"the states hold sites {list(states.sites)}, not {site!r}")
        if states.d_model != adapter.d_model:
            raise ValueError(f"the states have d = {states.d_model} but the model has d_model = {adapter.d_model}")
        states = states.select([s for s in (site, FINAL_SITE) if s in states.sites and (s == site or include_final)])
    else:
        sites = (site, FINAL_SITE) if include_final and site != FINAL_SITE else (site,)
        states = capture(
            adapter, tokens, sites=sites, layers=layers, n_tokens=n_tokens, seed=seed, batch_size=batch_size,
            progress=progress, attention_mask=attention_mask, max_length=max_length,
        )
    result = _score_states(states, basis, n_null=n_null, ccr=ccrs, seed=seed, n_pairs=n_pairs, progress=progress)
    result.params.update(
        model=adapter.name, readout=readout if isinstance(readout, str) else "custom", site=site,
        processing=dict(adapter.processing), n_layers=adapter.n_layers, d_model=adapter.d_model,
    )
    return result


def pga_of_states(states: States, readout: torch.Tensor, **kwargs) -> PGAResult:
    """Deprecated: use ``geolens.pga(model, states, readout=basis)``."""
    warnings.warn("pga_of_states is deprecated; use geolens.pga(model, states, readout=basis)", DeprecationWarning,
                  stacklevel=2)
    return _score_states(states, readout, **kwargs)


def _score_states(
    states: States,
    readout: torch.Tensor,
    *,
    n_null: int = 100,
    ccr: int | Sequence[int] = 1,
    seed: int = 0,
    n_pairs: int | None = None,
    progress: bool = True,
) -> PGAResult:
    """Subspace PGA of captured :class:`~geolens.capture.States` against a ``[d, k]`` orthonormal readout basis."""
    ccrs = _ccr_list(ccr)
    any_site = states.sites[0]
    reference = states[any_site]
    d, k = reference.shape[-1], readout.shape[-1]
    readout = readout.to(device=reference.device, dtype=reference.dtype)
    nulls = random_subspaces(d, k, n_null, seed=seed, dtype=reference.dtype, device=reference.device)
    jobs = [(site, layer) for site in states.sites for layer in states.layers[site]]
    columns = _SCORE_COLUMNS if n_pairs is None else _APPROX_COLUMNS
    used_pairs = None
    rows, null_rhos = [], []
    bar = tqdm(total=len(jobs) * len(ccrs), desc="PGA", disable=not progress, leave=False)
    degenerate: list[str] = []
    for site, layer in jobs:
        layer_states = states.layer(site, layer)
        for m in ccrs:
            try:
                score = subspace_pga(layer_states, readout, ccr=m, null_subspaces=nulls, seed=seed, n_pairs=n_pairs)
            except DegenerateError as err:
                # One degenerate cell (e.g. CCR-10 of an embedding layer with few distinct tokens) is
                # flagged in its row; the rest of the sweep still stands. All degenerate: nothing to show.
                degenerate.append(f"{site} layer {layer} (ccr={m}): {err}")
                rows.append({"layer": layer, "site": site, "ccr": m, **dict.fromkeys(columns, math.nan),
                             "degenerate": str(err)})
                null_rhos.append({"site": site, "layer": layer, "ccr": m, "rhos": []})
                bar.update()
                continue
            except ValueError as err:
                raise ValueError(f"{site} layer {layer} (ccr={m}): {err}") from err
            values = {"rho_readout": score.rho_readout, "rho_se": score.rho_se, "null_mean": score.null_mean,
                      "null_std": score.null_std, "null_std_raw": score.null_std_raw,
                      "pair_noise_std": score.pair_noise_std, "z": score.z, "z_se": score.z_se, "p_value": score.p_value,
                      "pc1_readout_energy": score.pc1_readout_energy, "random_energy": score.random_energy}
            rows.append({"layer": layer, "site": site, "ccr": m, **{c: values[c] for c in columns}})
            used_pairs = score.n_pairs
            null_rhos.append({"site": site, "layer": layer, "ccr": m, "rhos": score.null_rhos.tolist()})
            bar.update()
    bar.close()
    if degenerate and len(degenerate) == len(rows):
        raise DegenerateError(f"every layer is degenerate, e.g. {degenerate[0]}")
    if degenerate:
        warnings.warn(f"{len(degenerate)} of {len(rows)} PGA scores are undefined (NaN, reason in the 'degenerate' "
                      f"column), e.g. {degenerate[0]}", stacklevel=3)
        for row in rows:
            row.setdefault("degenerate", "")
    params = {"k": k, "n_null": n_null, "ccr": ccrs if len(ccrs) > 1 else ccrs[0], "n_tokens": states.n_tokens,
              "seed": seed}
    if n_pairs is not None:
        n = states.n_tokens
        params["n_pairs"] = used_pairs if used_pairs is not None else min(n_pairs, n * (n - 1) // 2)
        params["exact"] = params["n_pairs"] == n * (n - 1) // 2
        if not params["exact"]:
            params["null_std"] = "pair-sampling noise subtracted (jackknife; docs/methods.md §A.4a)"
    return PGAResult(rows=rows, params=params, null_rhos=null_rhos)


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
