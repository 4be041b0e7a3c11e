"""Defaults are upper bounds in studies and the report: short texts and low-rank layers use what there is.

The alpha-ReQ fits are checked against a direct numpy weighted least-squares fit on the range each layer was
cut to, and against planted spectra (exact power laws of known rank).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import geolens
from geolens.capture import States, capture
from geolens.metrics.spectral import fit_range_within, numerical_rank, spectral_summary
from geolens.model import boot_bridge
from geolens.study import Study, load_errors, load_provenance, load_results, run_study
from tests.study.conftest import PGA, TEXTS, save_neox

PHASES = {"lens_tokens": TEXTS, "lens_budget": {"max_steps": 2, "tokens_per_step": 32, "seq_len": 8}}


def _numpy_fit(x: np.ndarray, start: int, stop: int) -> tuple[float, float]:
    """alpha-ReQ by hand: covariance eigenvalues of the centred rows, weighted (1/i) least squares of log lambda_i on
    log i over the 1-based ranks start+1..stop; alpha = -slope, with the weighted R^2."""
    centred = x - x.mean(axis=0)
    lam = np.linalg.svd(centred, compute_uv=False) ** 2 / (x.shape[0] - 1)
    i = np.arange(start + 1, stop + 1, dtype=float)
    design, y, w = np.stack([np.ones_like(i), np.log(i)], axis=1), np.log(lam[start:stop]), 1.0 / i
    coef, *_ = np.linalg.lstsq(design * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)
    fitted = design @ coef
    y_bar = np.sum(w * y) / np.sum(w)
    r2 = 1.0 - np.sum(w * (y - fitted) ** 2) / np.sum(w * (y - y_bar) ** 2)
    return -float(coef[1]), float(r2)


def _planted(n: int, d: int, rank: int, alpha: float, seed: int) -> torch.Tensor:
    """``n`` states of width ``d`` whose centred covariance spectrum is exactly ``i^-alpha`` for ``i <= rank``, 0 after."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, rank, generator=g, dtype=torch.float64)
    u, _ = torch.linalg.qr(z - z.mean(dim=0))  # orthonormal columns orthogonal to the ones vector: centred
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    s = torch.arange(1, rank + 1, dtype=torch.float64) ** (-alpha / 2) * math.sqrt(n - 1)
    offset = torch.randn(d, generator=g, dtype=torch.float64)
    return ((u * s) @ q[:, :rank].T + offset).float()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A GPT-NeoX of width 64 (two layers): its embedding layer on short texts has few distinct states."""
    path = save_neox(tmp_path_factory.mktemp("wide") / "w64", d_model=64, n_layers=2, seed=3)
    return path, boot_bridge(str(path))


def test_planted_low_rank_layers_are_fitted_up_to_their_rank(wide):
    _, model = wide
    n, ranks, alpha = 200, (33, 64, 3), 1.3
    layers = torch.stack([_planted(n, 64, r, alpha, seed=i) for i, r in enumerate(ranks)])
    states = States(tensors={"resid_post": layers}, layers={"resid_post": (0, 1, 2)},
                    hook_names={"resid_post": ("hook_embed", "blocks.0", "blocks.1")},
                    token_ids=torch.zeros(n, dtype=torch.long), batch_index=torch.zeros(n, dtype=torch.long),
                    position=torch.arange(1, n + 1), n_layers=2)
    with pytest.warns(UserWarning, match=r"numerical rank of 2 of 3 spectra"):
        res = geolens.spectrum(model, states, progress=False)
    table = res.to_pandas().set_index("layer")
    # 199 centred eigenvalues of width 64: the default (5, 100) is first cut to (5, 64), then to each rank
    assert res.params["alpha_fit_range"] == [5, 64]
    assert res.params["alpha_fit_clipped"] == [["resid_post", 0, 5, 33], ["resid_post", 2, 1, 3]]
    assert table["numerical_rank"].tolist() == list(ranks)
    assert table[["alpha_fit_start", "alpha_fit_stop"]].values.tolist() == [[5, 33], [5, 64], [1, 3]]
    for layer, (start, stop) in enumerate([(5, 33), (5, 64), (1, 3)]):
        ref_alpha, ref_r2 = _numpy_fit(layers[layer].double().numpy(), start, stop)
        assert table.loc[layer, "alpha_req"] == pytest.approx(ref_alpha, rel=1e-4)
        assert table.loc[layer, "alpha_req_r2"] == pytest.approx(ref_r2, abs=1e-4)
        assert table.loc[layer, "alpha_req"] == pytest.approx(alpha, rel=1e-3)  # the planted exponent
    with pytest.raises(ValueError, match="layer 0: alpha-ReQ fit range 5..63 reaches past the numerical rank 33"):
        geolens.spectrum(model, states, alpha_fit_range=(5, 64), progress=False)  # explicit: exact


def test_fit_range_within_and_rank_one():
    assert fit_range_within((5, 100), 64) == (5, 64) and fit_range_within((5, 100), 6) == (4, 6)
    assert fit_range_within((0, 8), 100) == (0, 8) and fit_range_within((5, 100), 1) is None
    x = _planted(50, 8, 1, 1.0, seed=0)
    out = spectral_summary(x, clip_fit_range=True)
    assert math.isnan(out["alpha_req"]) and (out["alpha_fit_start"], out["alpha_fit_stop"]) == (0, 1)
    assert "alpha_fit_stop" not in spectral_summary(_planted(50, 8, 8, 1.0, seed=0), alpha_fit_range=(1, 8))
    with pytest.raises(ValueError, match="needs 100 covariance eigenvalues"):
        spectral_summary(x)  # the metric's own default stays exact


def test_a_study_fits_low_rank_layers_like_numpy(wide, tmp_path):
    path, model = wide
    study = Study(models={"w64": str(path)}, texts=TEXTS, analyses={"spectrum": {}})
    with pytest.warns(UserWarning):
        result = run_study(study, tmp_path / "out", progress=False)
    assert result.params["failed"] == {}
    table = load_results(tmp_path / "out")
    states = capture(model, TEXTS, n_tokens=None, progress=False)  # every position: the default's upper bound
    assert load_provenance(tmp_path / "out")["w64/main"]["params"]["spectrum"]["n_tokens"] == states.n_tokens < 1024
    n_values = min(states.n_tokens - 1, 64)
    cut = []
    for layer in range(3):
        x = states.layer("resid_post", layer)
        rank = numerical_rank(x, centre=True)
        start, stop = fit_range_within((5, 100), min(n_values, rank))
        cut.append(stop < n_values)
        rows = table[(table.layer == layer) & (table.site == "resid_post")].set_index("metric")["value"]
        assert (rows["spectrum.alpha_fit_start"], rows["spectrum.alpha_fit_stop"]) == (start, stop)
        assert rows["spectrum.numerical_rank"] == rank
        assert rows["spectrum.alpha_req"] == pytest.approx(_numpy_fit(x.double().numpy(), start, stop)[0], rel=1e-4)
    assert cut[0]  # the embedding layer of these few texts is the low-rank one


def test_a_study_on_short_texts_runs_every_analysis_on_the_positions_there_are(family, tmp_path):
    model = boot_bridge(str(family["w16"]))
    available = capture(model, TEXTS, n_tokens=None, progress=False).n_tokens
    assert available < 1024
    analyses = {"pga": PGA, "spectrum": {}, "weights": {}, "updates": {},
                "phases": {**PHASES, "cache_dir": str(tmp_path / "lenses")}}
    study = Study(models={"m": str(family["w16"])}, texts=TEXTS, analyses=analyses)  # n_tokens left at 1024
    with pytest.warns(UserWarning, match="n_tokens: the default of 1024"):
        result = run_study(study, tmp_path / "bound", progress=False)
    assert result.params["failed"] == {} and result.params["computed"] == ["m/main"]
    manifest = json.loads((tmp_path / "bound" / "study.json").read_text())
    assert manifest["settings"]["n_tokens"] == 1024 and manifest["settings"]["n_tokens_upper_bound"] is True
    params = load_provenance(tmp_path / "bound")["m/main"]["params"]
    assert {name: params[name]["n_tokens"] for name in ("pga", "spectrum", "updates")} == dict.fromkeys(
        ("pga", "spectrum", "updates"), available)
    assert set(load_results(tmp_path / "bound").analysis) == set(analyses)
    # the same numbers as a direct call with the analysis's own default
    with pytest.warns(UserWarning, match="n_tokens"):
        direct = geolens.pga(model, TEXTS, progress=False, **PGA)
    mine = load_results(tmp_path / "bound").query("metric == 'pga.z'")
    assert sorted(mine["value"].tolist()) == pytest.approx(sorted(direct.to_pandas()["z"].tolist()), abs=1e-12)

    # an n_tokens given by hand is exact: every analysis that samples tokens fails, saying so; weights stands
    exact = Study(models={"m": str(family["w16"])}, texts=TEXTS, analyses=analyses, n_tokens=1024)
    with pytest.warns(UserWarning, match="1 of 1 cells failed"):
        run_study(exact, tmp_path / "exact", progress=False)
    errors = load_errors(tmp_path / "exact")
    assert sorted(errors.analysis) == ["pga", "phases", "spectrum", "updates"]
    assert errors.error.str.contains(f"n_tokens = 1024 but only {available}").all()
    assert set(load_results(tmp_path / "exact").analysis) == {"weights"}


def test_the_report_on_short_texts_uses_the_positions_there_are(wide, tmp_path, monkeypatch):
    from geolens.report import report

    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    _, model = wide
    available = capture(model, TEXTS, n_tokens=None, progress=False).n_tokens
    budget = {"max_steps": 2, "n_tokens": 256, "n_train_texts": 20}
    with pytest.warns(UserWarning, match="n_tokens: the default of 1024"):
        report(model, TEXTS, tmp_path / "r", progress=False, lens_budget=budget, probe_n_texts=40, probe_folds=2)
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["errors"] == {} and set(meta["sections"]) == set(geolens.report.DEFAULT_SECTIONS)
    assert meta["n_tokens_used"] == available and meta["settings"]["n_tokens"] == 1024
    saved = {name: json.loads((tmp_path / "r" / f"{name}.json").read_text())["params"]
             for name in ("pga", "spectrum", "updates")}
    assert {name: p["n_tokens"] for name, p in saved.items()} == dict.fromkeys(saved, available)
    assert saved["spectrum"]["alpha_fit_clipped"]  # the low-rank embedding layer, fitted up to its rank
    report(model, TEXTS, tmp_path / "x", progress=False, sections=["pga", "spectrum"], n_tokens=1024)  # exact
    meta = json.loads((tmp_path / "x" / "meta.json").read_text())
    assert set(meta["errors"]) == {"pga", "spectrum"}
    assert all(f"n_tokens = 1024 but only {available}" in error for error in meta["errors"].values())


def test_the_study_report_says_how_many_positions_were_used(family, tmp_path):
    from geolens.study import study_report

    study = Study(models={"m": str(family["w16"])}, texts=TEXTS, analyses={"pga": PGA})
    with pytest.warns(UserWarning, match="n_tokens"):
        run_study(study, tmp_path / "out", progress=False)
    used = load_provenance(tmp_path / "out")["m/main"]["params"]["pga"]["n_tokens"]
    page = study_report(tmp_path / "out").read_text()
    assert "token positions used" in page and f">{used}<" in page
