"""``geolens.spectrum`` and ``geolens.weight_geometry``: spectral metrics of states per layer, and of the weights.

See docs/methods.md §B.

Metric definitions and conventions: :mod:`geolens.metrics.spectral`.

Example:
    >>> res = geolens.spectrum(model, texts, n_tokens=24, alpha_fit_range=(1, 20), progress=False)
    >>> res.to_pandas()[["layer", "effective_rank", "numerical_rank"]].round(1).values.tolist()
    [[0.0, 18.9, 20.0], [1.0, 19.4, 23.0], [2.0, 19.3, 23.0]]
    >>> fig = res.plot()
    >>> geolens.weight_geometry(model, alpha_fit_range=(5, 64), progress=False).to_pandas().matrix.tolist()
    ['W_U raw', 'W_U folded', 'W_E']
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from geolens._validation import DEFAULT_N_TOKENS
from geolens.analyses.compare import compare
from geolens.capture import States, capture
from geolens.sites import RESIDUAL_SITE
from geolens.metrics.spectral import (ALPHA_FIT_RANGE, METRICS, RANKME_EPS, spectral_summary,
                                      spectral_summary_blocks)
from geolens.model import Model, ModelAdapter, as_adapter
from geolens import plotting
from geolens._renames import renamed_keywords
from geolens.results import Result

__all__ = [
    "METRICS",
    "SpectrumResult",
    "WeightGeometryResult",
    "capture_sites",
    "report_section",
    "spectrum",
    "weight_geometry",
    "weights_report_section",
    "zoo_options",
]

# Shown by plot() by default: the paper's metrics (R^2, isotropy (which underflows) and rank are diagnostics).
PLOTTED: tuple[str, ...] = (
    "effective_rank", "rankme", "alpha_req", "log_isotropy", "mean_cosine", "cosine_std", "condition_number",
)


@dataclass(repr=False)
class SpectrumResult(Result):
    """Spectral metrics per layer: ``layer, site, effective_rank, rankme, alpha_req, alpha_req_r2,
    isotropy, log_isotropy, mean_cosine, cosine_std, condition_number, numerical_rank``."""

    title: ClassVar[str] = "SpectrumResult"

    def _summary(self) -> str:
        keys = ("model", "site", "n_tokens", "centre", "alpha_fit_range", "seed")
        return ", ".join(f"{k}={self.params[k]}" for k in keys if k in self.params)

    @renamed_keywords(metrics="kind")
    def plot(self, *, kind: str | Sequence[str] | None = None):
        """One subplot per metric ``kind`` (a column or a list of them; default: the paper's seven), against the layer."""
        metrics = list(PLOTTED) if kind is None else [kind] if isinstance(kind, str) else list(kind)
        return plotting.metric_grid(self.to_pandas(), "layer", metrics,
                                    title=f"Spectral geometry by layer — {self._summary()}",
                                    xaxis_title="layer (0 = embeddings)")


@dataclass(repr=False)
class WeightGeometryResult(Result):
    """Spectral metrics of weight matrices, rows = token vectors: ``matrix, rows, cols`` and the metrics."""

    title: ClassVar[str] = "WeightGeometryResult"

    def _summary(self) -> str:
        keys = ("model", "centre", "alpha_fit_range")
        return ", ".join(f"{k}={self.params[k]}" for k in keys if k in self.params)

    @renamed_keywords(metrics="kind")
    def plot(self, *, kind: str | Sequence[str] | None = None):
        """One bar subplot per metric ``kind`` (default: the paper's seven), one bar per matrix (W_U raw, W_U folded,
        W_E), each in its fixed colour."""
        return plotting.weight_geometry_figure(self, kind=PLOTTED if kind is None else kind)




def spectrum(
    model: Model,
    tokens,
    *,
    site: str = RESIDUAL_SITE,
    layers: Sequence[int] | None = None,
    centre: bool = True,
    alpha_fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    rtol: float | None = None,
    n_tokens: int | None = DEFAULT_N_TOKENS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> SpectrumResult:
    """Spectral metrics of the ``[n_tokens, d]`` states of every layer of ``model`` on ``tokens``.

    Captures ``n_tokens`` sampled positions (BOS and padding excluded; the same
    positions for every layer) at ``site`` and applies
    :func:`~geolens.metrics.spectral.spectral_summary` to each layer's states
    (one SVD per layer). With ``centre=True`` every metric (RankMe included) is
    of the mean-centred states.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text, list of texts, ``[B, T]`` token ids, or :class:`~geolens.capture.States`
            captured before (every captured layer of ``site`` is measured as it is).
        site: ``resid_post`` (layers 0..L), ``attn_out``, ``mlp_out``, ... (see :func:`geolens.capture`).
        layers: layer indices (default all).
        n_tokens: positions sampled (seeded).
        centre: mean-centre each layer's states first.
        seed: seed of the position sample.
        progress: show progress bars.
        alpha_fit_range: 0-based half-open index range of the alpha-ReQ fit. The default ``(5, 100)`` is an
            upper bound: cut to the eigenvalues there are and to each layer's numerical rank (with a warning;
            the rows then carry the range used, ``alpha_fit_start, alpha_fit_stop``, and ``params``
            lists the layers cut to their rank). An explicit range is used as given: its stop must be
            <= the numerical rank of every layer.
        rtol: relative tolerance of "negligible" singular values (condition number, rank).

    Returns:
        :class:`SpectrumResult`, one row per layer: ``layer, site`` and every metric.

    Example:
        >>> res = spectrum(model, texts, n_tokens=24, alpha_fit_range=(1, 20), progress=False)
        >>> res.to_pandas()[["layer", "site"]].values.tolist()
        [[0, 'resid_post'], [1, 'resid_post'], [2, 'resid_post']]
    """
    adapter = as_adapter(model)
    if isinstance(tokens, States):
        states = tokens.check_width(adapter.d_model)
    else:
        states = capture(adapter, tokens, sites=(site,), layers=layers, n_tokens=n_tokens, seed=seed,
                         batch_size=batch_size, progress=progress, attention_mask=attention_mask,
                         max_length=max_length)
    result = _spectrum_of_states(states, site=site, centre=centre, alpha_fit_range=alpha_fit_range, rtol=rtol,
                                progress=progress)
    result.params.update(model=adapter.name, seed=seed, n_layers=adapter.n_layers, d_model=adapter.d_model)
    return result


def clipped_fit_range(n_values: int, fit_range: tuple[int, int] = ALPHA_FIT_RANGE) -> tuple[int, int]:
    """``fit_range`` cut to the ``n_values`` eigenvalues a spectrum has: ``stop <= n_values``, ``stop - start >= 2``.

    Example:
        >>> clipped_fit_range(64), clipped_fit_range(4), clipped_fit_range(1000)
        ((5, 64), (2, 4), (5, 100))
    """
    start, stop = fit_range
    stop = min(stop, n_values)
    start = max(0, min(start, stop - 2))
    if stop - start < 2:
        raise ValueError(f"an alpha-ReQ fit needs at least 2 eigenvalues; this spectrum has {n_values}")
    return start, stop


def _fit_range(fit_range: tuple[int, int], n_values: int, what: str) -> tuple[tuple[int, int], bool]:
    """``(range, is_default)``: the default range is an upper bound (cut to the ``n_values`` eigenvalues, with a
    warning, and later to each layer's numerical rank); an explicit one is used as given."""
    if fit_range is not ALPHA_FIT_RANGE:
        return tuple(fit_range), False
    if ALPHA_FIT_RANGE[1] <= n_values:
        return tuple(fit_range), True
    clipped = clipped_fit_range(n_values)
    warnings.warn(f"alpha_fit_range: the default {ALPHA_FIT_RANGE} needs {ALPHA_FIT_RANGE[1]} eigenvalues but {what} "
                  f"have {n_values}; fitting {clipped} (pass alpha_fit_range to choose)", stacklevel=3)
    return clipped, True


def _summaries(matrices: dict[Any, torch.Tensor], *, centre: bool, fit_range: tuple[int, int], clip: bool,
               rtol: float | None, eps: float, describe, progress: bool, desc: str) -> tuple[dict, list]:
    """``spectral_summary`` of each matrix; with the default range (``clip``) each fit is cut to the matrix's
    numerical rank, the range used kept in ``alpha_fit_start, alpha_fit_stop`` and the cut ones listed (and
    warned about once)."""
    out, cut = {}, []
    for key, matrix in tqdm(matrices.items(), desc=desc, disable=not progress, leave=False):
        try:
            summary = spectral_summary_blocks if _blockwise(matrix) else spectral_summary
            metrics = summary(matrix, centre=centre, alpha_fit_range=fit_range, rtol=rtol, eps=eps,
                              clip_fit_range=clip)
        except ValueError as err:
            raise ValueError(f"{describe(key)}: {err}") from err
        if clip and (metrics["alpha_fit_start"], metrics["alpha_fit_stop"]) != tuple(fit_range):
            cut.append((key, metrics["alpha_fit_start"], metrics["alpha_fit_stop"]))
        out[key] = metrics
    if cut:
        shown = ", ".join(f"{describe(key)}: ({a}, {b})" for key, a, b in cut[:5])
        warnings.warn(f"alpha_fit_range: the default {ALPHA_FIT_RANGE} reaches past the numerical rank of "
                      f"{len(cut)} of {len(matrices)} spectra; each is fitted up to its rank ({shown}"
                      f"{', ...' if len(cut) > 5 else ''}; alpha is NaN below rank 2). The range used is in the "
                      "alpha_fit_start, alpha_fit_stop columns (pass alpha_fit_range to choose)", stacklevel=4)
    return out, cut


def _spectrum_of_states(
    states: States,
    site: str | None = None,
    *,
    centre: bool = True,
    alpha_fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    rtol: float | None = None,
    eps: float = RANKME_EPS,
    progress: bool = True,
) -> SpectrumResult:
    """Spectral metrics of already-captured :class:`~geolens.capture.States` (every site, or just ``site``)."""
    sites = states.sites if site is None else (site,)
    n_values = min(states.n_tokens - 1 if centre else states.n_tokens, states.d_model)
    alpha_fit_range, default = _fit_range(alpha_fit_range, n_values,
                                          f"{states.n_tokens} states of width {states.d_model}")
    jobs = {(s, layer): states.layer(s, layer) for s in sites for layer in states.layers[s]}
    metrics, cut = _summaries(jobs, centre=centre, fit_range=alpha_fit_range, clip=default, rtol=rtol, eps=eps,
                              describe=lambda key: f"{key[0]} layer {key[1]}", progress=progress, desc="spectrum")
    rows = [{"layer": layer, "site": s, **values} for (s, layer), values in metrics.items()]
    params = {"site": site if site is not None else list(sites), "n_tokens": states.n_tokens, "centre": centre,
              "alpha_fit_range": list(alpha_fit_range), "rtol": rtol, "rankme_eps": eps}
    if default:  # the spectra whose fit was cut to their numerical rank: [site, layer, start, stop]
        params["alpha_fit_clipped"] = [[s, layer, a, b] for (s, layer), a, b in cut]
    return SpectrumResult(rows=rows, params=params)


# ---------------------------------------------------------------- weights
def _blockwise(matrix: torch.Tensor) -> bool:
    """A vocabulary-sized ``[V, d]`` matrix is measured from its ``d x d`` Gram matrix, block by block.

    Its SVD would hold a float32 copy, ``[V, d]`` singular vectors and float64 copies for the cosines:
    several times the matrix, next to the model's weights. Small matrices keep the SVD.
    """
    rows, cols = matrix.shape
    return rows >= 8 * cols and rows * cols >= 1 << 22


def _weight_matrices(adapter: ModelAdapter) -> dict[str, torch.Tensor]:
    return {
        "W_U raw": adapter.unembed_matrix("raw").T,        # [V, d]: row v = the readout vector of token v
        "W_U folded": adapter.unembed_matrix("folded").T,
        "W_E": adapter.embedding_matrix(),
    }


def weight_geometry(
    model: Model,
    *,
    centre: bool = False,
    alpha_fit_range: tuple[int, int] = ALPHA_FIT_RANGE,
    rtol: float | None = None,
    eps: float = RANKME_EPS,
    progress: bool = True,
) -> WeightGeometryResult:
    """Spectral metrics of the unembedding (raw and folded) and the embedding, rows = token vectors.

    Matrices, each ``[V, d]``: ``"W_U raw"`` (``W_U.T``: row ``v`` is token ``v``'s
    readout vector), ``"W_U folded"`` (``(diag(ln_final.w) @ W_U).T``; equal to the
    raw one when the model has no ln_final weight, see ``processing``) and
    ``"W_E"``. ``centre=False`` (default) measures the matrices as the model holds
    them, as Mu & Viswanath and Garrido et al. do; float16/bf16 weights are
    measured in float32.

    Example:
        >>> res = geolens.weight_geometry(model, alpha_fit_range=(5, 64), progress=False)   # d_model = 64 eigenvalues
        >>> res.to_pandas()[["matrix", "rows", "cols", "effective_rank"]].round(1).values.tolist()
        [['W_U raw', 200, 64, 61.1], ['W_U folded', 200, 64, 58.3], ['W_E', 200, 64, 61.0]]
    """
    adapter = as_adapter(model)
    matrices = _weight_matrices(adapter)
    n_values = min(min(m.shape[0] - 1 if centre else m.shape[0], m.shape[1]) for m in matrices.values())
    alpha_fit_range, default = _fit_range(alpha_fit_range, n_values,
                                          f"the [V, d = {adapter.d_model}] weight matrices")
    metrics, cut = _summaries(matrices, centre=centre, fit_range=alpha_fit_range, clip=default, rtol=rtol, eps=eps,
                              describe=str, progress=progress, desc="weights")
    rows = [{"matrix": name, "rows": int(matrices[name].shape[0]), "cols": int(matrices[name].shape[1]), **values}
            for name, values in metrics.items()]
    params: dict[str, Any] = {"model": adapter.name, "centre": centre, "alpha_fit_range": list(alpha_fit_range),
                              "rtol": rtol, "rankme_eps": eps, "processing": dict(adapter.processing)}
    if default:
        params["alpha_fit_clipped"] = [[name, a, b] for name, a, b in cut]
    return WeightGeometryResult(rows=rows, params=params)


# ---------------------------------------------------------------- how the report, studies and the zoo run spectrum
# and weights (their records in geolens.analyses.registry point here)


def capture_sites(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The site :func:`spectrum` measures with ``options`` (what a study's cell captures once for it).

    Example:
        >>> capture_sites({})
        ('resid_post',)
    """
    return (options.get("site", RESIDUAL_SITE),)


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[SpectrumResult, list[Any]]:
    """The report's spectra of the run's shared states; next to PGA z (at CCR-1 when swept) when pga ran."""
    s = run.settings
    # the default range is an upper bound: cut to each layer's eigenvalues and numerical rank
    result = spectrum(run.adapter, run.states(), site=RESIDUAL_SITE, seed=s.seed, progress=s.progress,
                      alpha_fit_range=s.alpha_fit_range or ALPHA_FIT_RANGE)
    figures = [result.plot()]
    pga_result = needed.get("pga")
    if pga_result is not None:
        swept = 1 in pga_result.to_pandas().ccr.values
        figures.append(compare(pga_result, result, ccr=1 if swept else None).plot())
    return result, figures


def weights_report_section(run: Any, needed: Mapping[str, Result]) -> tuple[WeightGeometryResult, list[Any]]:
    """The report's spectra of the weights."""
    s = run.settings
    result = weight_geometry(run.adapter, progress=s.progress, alpha_fit_range=s.alpha_fit_range or ALPHA_FIT_RANGE)
    return result, [result.plot()]


def zoo_options(settings: Any, *, width: int, lens_texts: Sequence[str]) -> dict[str, Any]:
    """Spectrum's options on a zoo member: its defaults."""
    return {}
