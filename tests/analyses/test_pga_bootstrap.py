"""geolens.pga(n_resamples=B): z over the token sample, a bootstrap over texts (docs/methods.md §A.10).

Checked against an independent reference (numpy/scipy on the resampled rows), against the metric
function where a resample has no duplicated rows, and on planted states whose population z is known.
"""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

import geolens
import geolens.report
from geolens.analyses.pga import _score_states
from geolens.metrics.resampling import resample_pairs, resampled_z, text_resamples
from geolens.capture import States
from geolens.metrics import random_subspaces, readout_basis, subspace_pga
from geolens.model import as_adapter

K, N_NULL = 4, 6


def reference_z(rows: np.ndarray, source: np.ndarray, readout: np.ndarray, nulls: np.ndarray, m: int) -> float:
    """PGA z of resampled rows by numpy and scipy: centre, CCR-m by SVD, cosine pdist, pairs of a row with
    its own copy left out, scipy's Spearman (average ranks for the duplicated pairs' ties)."""
    c = rows - rows.mean(0)
    if m:
        vt = np.linalg.svd(c, full_matrices=False)[2][:m]
        c = c - c @ vt.T @ vt
    # Equal states are one row (copies, and texts that open alike): BLAS may round two equal rows of a product
    # apart, which would split the ties between their pairs that the statistic has; two equal states are at
    # distance 0.
    _, first_copy, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    c = c[first_copy][inverse]
    i, j = np.triu_indices(len(rows), 1)  # pdist order
    keep = source[i] != source[j]
    same = (inverse[i] == inverse[j])[keep]

    def distances(y):
        d = pdist(y, "cosine")[keep]
        d[same] = 0.0
        return d

    full = distances(c)
    rhos = np.array([spearmanr(full, distances(c @ q)).statistic for q in [readout, *nulls]])
    return float((rhos[0] - rhos[1:].mean()) / rhos[1:].std(ddof=1))


def test_resampled_z_equals_an_independent_reference_on_the_resampled_rows(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (12, 8), generator=torch.Generator().manual_seed(1))
    states = geolens.capture(native_bridge, tokens, sites=("resid_post", "final"), dtype=torch.float64,
                             progress=False)
    result = geolens.pga(native_bridge, states, k=K, n_null=N_NULL, ccr=[0, 2], n_resamples=20, progress=False)
    readout = readout_basis(adapter.unembed_matrix("raw"), K).double().numpy()
    nulls = random_subspaces(adapter.d_model, K, N_NULL, seed=0, dtype=torch.float64).numpy()
    resamples = text_resamples(states.batch_index, 20, seed=0)[:3]  # three of them checked against the reference
    assert any(len(set(r.tolist())) < len(r) for r in resamples)  # some rows drawn twice
    resampled = {(r["site"], r["layer"], r["ccr"]): r["z"] for r in result.resampled_z}
    checked = 0
    for site, layer in (("resid_post", 0), ("resid_post", adapter.n_layers), ("final", adapter.n_layers)):
        h = states.layer(site, layer).numpy()
        for m in (0, 2):
            for b, picked in enumerate(resamples):
                expected = reference_z(h[picked.numpy()], picked.numpy(), readout, nulls, m)
                assert resampled[(site, layer, m)][b] == pytest.approx(expected, abs=1e-7)
                checked += 1
    assert checked == 18
    table = result.to_pandas()
    z = np.array([resampled[(s, l, c)] for s, l, c in zip(table.site, table.layer, table.ccr)])
    # Symmetric about z: z +- t(B - 1) sqrt(T / (T - 1)) sd, T = 12 texts (the plug-in spread made unbiased).
    half = scipy.stats.t.ppf(0.975, 19) * np.sqrt(12 / 11) * z.std(axis=1, ddof=1)
    np.testing.assert_allclose(table.z_low, table.z - half)
    np.testing.assert_allclose(table.z_high, table.z + half)
    assert bool(((table.z_low <= table.z) & (table.z <= table.z_high)).all())
    np.testing.assert_allclose(table.z_end_error, half / np.sqrt(2 * 19))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 2e-3)])
def test_a_resample_without_duplicates_is_the_metric_function_on_its_rows(dtype, tol):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(60, 10, generator=g, dtype=torch.float64) * torch.linspace(2, 0.5, 10, dtype=torch.float64))
    h = h.to(dtype)
    readout = torch.linalg.qr(torch.randn(10, 3, generator=g, dtype=torch.float64))[0].to(dtype)
    nulls = random_subspaces(10, 3, 8, seed=3, dtype=dtype)
    subspaces = torch.cat([readout[None], nulls])
    pairs = resample_pairs(torch.arange(60))
    assert pairs.n_pairs == pairs.total == 60 * 59 // 2
    got = resampled_z(h, subspaces, [0, 1, 3], pairs)
    # The rows of a larger capture, only 60 of them drawn: the capture's other rows change nothing.
    extra = torch.randn(25, 10, generator=g, dtype=torch.float64).to(dtype) * 3 + 1
    projected = resampled_z(torch.cat([extra[:10], h, extra[10:]]), subspaces, [0, 1, 3], pairs,
                            source=torch.arange(60) + 10)
    for m, value, again in zip((0, 1, 3), got, projected):
        direct = subspace_pga(h, readout, null_subspaces=nulls, ccr=m).z
        assert value == pytest.approx(direct, abs=tol) and again == pytest.approx(direct, abs=tol)


def test_a_resample_on_sampled_pairs_takes_their_noise_out_of_the_null_spread_as_the_point_estimate_does():
    g = torch.Generator().manual_seed(4)
    h = torch.randn(120, 10, generator=g) * torch.linspace(2, 0.5, 10)
    readout = torch.linalg.qr(torch.randn(10, 3, generator=g))[0]
    nulls = random_subspaces(10, 3, 12, seed=3)
    pairs = resample_pairs(torch.arange(120), 2000, seed=0)  # no row drawn twice: the point estimate's pairs
    assert pairs.n_pairs == 2000 and not pairs.exact
    got = resampled_z(h, torch.cat([readout[None], nulls]), [0, 1], pairs)
    for m, value in zip((0, 1), got):
        score = subspace_pga(h, readout, null_subspaces=nulls, ccr=m, n_pairs=2000, seed=0)
        assert score.pair_noise_std > 0 and value == pytest.approx(score.z, abs=1e-4)
        raw = (score.rho_readout - score.null_mean) / score.null_std_raw  # the spread as observed: nearer 0
        assert abs(value) > abs(raw)


def test_resample_pairs_drop_exactly_the_pairs_of_a_row_with_its_own_copy():
    source = torch.tensor([5, 5, 5, 2, 9, 9, 4])  # row 5 drawn three times, row 9 twice
    pairs = resample_pairs(source)
    kept = set(zip(pairs.i.tolist(), pairs.j.tolist()))
    assert pairs.total == len(kept) == 21 - 3 - 1 and pairs.exact  # total: the pairs there are to rank
    assert all(int(source[a]) != int(source[b]) for a, b in kept)
    assert (0, 3) in kept and (1, 3) in kept and (4, 6) in kept  # copies of different rows keep their pairs
    sampled = resample_pairs(torch.arange(200) // 2, 5000, seed=1)  # 100 rows, each drawn twice
    assert sampled.n_pairs < 5000 and bool((sampled.i // 2 != sampled.j // 2).all())


def test_text_resamples_keep_a_texts_rows_together_and_are_seeded():
    index = torch.tensor([0, 0, 0, 3, 3, 7, 8, 8])  # texts 0, 3, 7, 8 (a text may have no rows: 1, 2, ...)
    rows = text_resamples(index, 50, seed=2)
    assert all(len({int(index[r]) for r in chunk}) >= 1 for chunk in rows)
    for picked in rows:
        counts = torch.bincount(index[picked], minlength=9)
        full = torch.bincount(index, minlength=9)
        drawn = counts[full > 0] / full[full > 0]  # every text comes whole, a whole number of times
        assert bool((drawn == drawn.round()).all()) and int(drawn.sum()) == 4
    assert [r.tolist() for r in rows] == [r.tolist() for r in text_resamples(index, 50, seed=2)]
    assert any(a.tolist() != b.tolist() for a, b in zip(rows, text_resamples(index, 50, seed=3)))


# --- planted states: a population of texts whose z is known --------------------------------------------
D, PER = 16, 4


def _population(n_texts: int, seed: int = 0) -> torch.Tensor:
    """Texts of PER positions: a text mean plus within-text noise, on a decaying spectrum (so random
    subspaces differ in how much of the geometry they keep, and z converges as texts grow)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.arange(1, D + 1, dtype=torch.float64).reciprocal()
    means = torch.randn(n_texts, 1, D, generator=g, dtype=torch.float64) * scale
    return (means + 0.7 * torch.randn(n_texts, PER, D, generator=g, dtype=torch.float64) * scale).float()


def _states(x: torch.Tensor) -> States:
    t = x.shape[0]
    return States(tensors={"resid_post": x.reshape(1, t * PER, D)}, layers={"resid_post": (0,)},
                  hook_names={"resid_post": ("planted",)}, token_ids=torch.zeros(t * PER, dtype=torch.long),
                  batch_index=torch.arange(t).repeat_interleave(PER), position=torch.arange(PER).repeat(t))


def _planted_readout() -> torch.Tensor:
    q = torch.zeros(D, 4)
    q[1, 0], q[2, 1], q[3, 2], q[9, 2], q[12, 3] = 1.0, 1.0, 0.6, 0.8, 1.0
    return torch.linalg.qr(q)[0]


def test_on_planted_texts_the_interval_covers_the_population_z_and_shrinks_with_more_texts():
    population, readout = _population(500), _planted_readout()
    true_z = _score_states(_states(population), readout, n_null=20, ccr=[1], progress=False).rows[0]["z"]
    assert 1.0 < true_z < 4.0  # a readout aligned a little better than chance: a z the interval must find
    widths, covered = {}, {}
    for n_texts, reps in ((10, 6), (40, 12)):
        w, c = [], 0
        for rep in range(reps):
            pick = torch.randperm(500, generator=torch.Generator().manual_seed(100 + rep))[:n_texts]
            with pytest.warns(UserWarning) if n_texts < 10 else _no_warning():
                row = _score_states(_states(population[pick]), readout, n_null=20, ccr=[1], progress=False,
                                    n_resamples=40, seed=rep).rows[0]
            assert row["z_low"] <= row["z_high"]
            w.append(row["z_high"] - row["z_low"])
            c += row["z_low"] <= true_z <= row["z_high"]
        widths[n_texts], covered[n_texts] = float(np.mean(w)), c / reps
    assert covered[40] >= 0.66  # nominal 0.95; generous for 12 replications of 40 resamples
    assert widths[40] < 0.8 * widths[10]  # four times the texts: a narrower interval


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- the analysis: columns, params, errors, no second forward pass --------------------------------------

def test_bootstrap_columns_params_and_round_trip(native_bridge, tmp_path):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (12, 10), generator=torch.Generator().manual_seed(0))
    plain = geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, ccr=[0, 1], n_tokens=80, progress=False)
    assert "z_low" not in plain.to_pandas() and plain.resampled_z == [] and "bootstrap" not in plain.params
    boot = geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, ccr=[0, 1], n_tokens=80, n_resamples=30,
                       progress=False)
    table = boot.to_pandas()
    assert list(table.columns) == ["layer", "site", "ccr", "rho_readout", "null_mean", "null_std", "z", "z_low",
                                   "z_high", "z_end_error", "p_value", "pc1_readout_energy", "random_energy"]
    pd.testing.assert_frame_equal(table.drop(columns=["z_low", "z_high", "z_end_error"]), plain.to_pandas())
    assert ((table.z_low <= table.z) & (table.z <= table.z_high)).all()  # the interval holds its estimate
    assert (table.z_low < table.z_high).all() and len(boot.resampled_z) == len(table)
    assert all(len(r["z"]) == 30 for r in boot.resampled_z)
    assert boot.params["bootstrap"]["n_texts"] == 12 and boot.params["n_resamples"] == 30
    assert boot.params["bootstrap"]["few_texts"] is False and boot.params["bootstrap"]["failed"] == 0
    again = geolens.PGAResult.load(boot.save(tmp_path / "pga.json"))
    pd.testing.assert_frame_equal(again.to_pandas(), table)
    assert again.resampled_z == boot.resampled_z
    figure = boot.plot()
    bands = [t for t in figure.data if t.name.endswith("95 % over texts")]
    assert len(bands) == 2 and all(t.fill == "toself" for t in bands)
    assert any(t.error_y.array is not None for t in figure.data if t.name.startswith("final"))


def test_bootstrap_reuses_the_captured_rows_without_a_forward_pass(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (12, 10), generator=torch.Generator().manual_seed(0))
    calls = []
    handle = native_bridge.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=60, progress=False)
        without = len(calls)
        geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=60, n_resamples=20, progress=False)
    finally:
        handle.remove()
    assert without >= 1 and len(calls) == 2 * without


def test_approximate_scores_bootstrap_with_their_pair_sample(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (16, 12), generator=torch.Generator().manual_seed(0))
    approx = geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=120, n_pairs=3000, n_resamples=20,
                         progress=False)
    columns = list(approx.to_pandas().columns)
    assert columns[columns.index("z"):columns.index("z") + 5] == ["z", "z_se", "z_low", "z_high", "z_end_error"]
    assert columns.index("null_std_raw") < columns.index("z")
    assert approx.params["bootstrap"]["pairs"].startswith("3000 sampled")
    exact = geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=120, n_resamples=20,
                        bootstrap_pairs=2000, progress=False)
    assert exact.params["bootstrap"]["pairs"].startswith("2000 sampled") and "n_pairs" not in exact.params
    # More pairs than a resample has: every pair, and recorded as all, not as a sample
    over = geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=60, n_resamples=20,
                       bootstrap_pairs=10**6, progress=False)
    assert over.params["bootstrap"]["pairs"].startswith("all")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"n_resamples": -1}, ValueError, "n_resamples"),
    ({"n_resamples": 2.0}, TypeError, "n_resamples"),
    ({"n_resamples": True}, TypeError, "n_resamples"),
    ({"n_resamples": "10"}, TypeError, "n_resamples"),
    ({"n_resamples": 20, "bootstrap_pairs": 100}, ValueError, "bootstrap_pairs"),
    ({"n_resamples": 1}, ValueError, "n_resamples = 1 cannot make an interval: pass at least 15"),
    ({"n_resamples": 14}, ValueError, "at least 15"),
    ({"n_resamples": 10**9}, ValueError, "more than the 10000 resamples"),
    ({"bootstrap_pairs": 5000}, ValueError, "bootstrap_pairs.*n_resamples"),
])
def test_bad_bootstrap_arguments_raise_naming_them(native_bridge, kwargs, error, match):
    tokens = torch.randint(0, as_adapter(native_bridge).d_vocab, (12, 10))
    with pytest.raises(error, match=match):
        geolens.pga(native_bridge, tokens, k=K, n_null=N_NULL, n_tokens=60, progress=False, **kwargs)



def test_the_fewest_resamples_follow_their_rule_and_the_report_uses_at_least_that_many():
    from geolens.analyses.pga import MIN_RESAMPLES
    from geolens.report.settings import QUICK, ReportSettings

    # The floor: the fewest B whose t(B - 1) quantile widens the interval by at most 10 % over the normal one.
    def widening(b):
        return scipy.stats.t.ppf(0.975, b - 1) / scipy.stats.norm.ppf(0.975)

    assert widening(MIN_RESAMPLES) <= 1.10 < widening(MIN_RESAMPLES - 1)
    assert ReportSettings().pga_n_resamples >= MIN_RESAMPLES and QUICK["pga_n_resamples"] >= MIN_RESAMPLES

def test_too_few_texts_raise_or_warn_and_say_so(native_bridge):
    adapter = as_adapter(native_bridge)
    one = torch.randint(0, adapter.d_vocab, (1, 40))
    with pytest.raises(ValueError, match="n_resamples.*1 text"):
        geolens.pga(native_bridge, one, k=K, n_null=N_NULL, n_tokens=30, n_resamples=20, progress=False)
    few = torch.randint(0, adapter.d_vocab, (4, 12))
    with pytest.warns(UserWarning, match="only 4 texts"):
        result = geolens.pga(native_bridge, few, k=K, n_null=N_NULL, n_tokens=40, n_resamples=20, progress=False)
    assert result.params["bootstrap"]["few_texts"] is True and result.params["bootstrap"]["n_texts"] == 4
    assert math.isfinite(result.to_pandas().z_low.iloc[0])


def test_report_pga_section_draws_the_intervals_and_words_its_findings_by_them(native_bridge, tmp_path):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (12, 10), generator=torch.Generator().manual_seed(0))
    texts = [" ".join(str(t) for t in row.tolist()) for row in tokens]  # 12 texts the tiny tokenizer splits
    paths = geolens.report.report(native_bridge, texts, tmp_path, sections=["pga"], n_tokens=80, k=K, n_null=N_NULL,
                                  ccr=[0, 1], pga_n_resamples=20, pga_bootstrap_pairs=None, progress=False)
    table = pd.read_csv(paths["pga.csv"])
    assert {"z_low", "z_high"} <= set(table.columns) and table.z_low.notna().all()
    page = paths["report.html"].read_text()
    assert "across the 95 % interval over resampled texts (20 resamples of" in page
    one = geolens.report.report(native_bridge, ["the cat sat on the mat " * 8], tmp_path / "one", sections=["pga"],
                                n_tokens=30, k=K, n_null=N_NULL, ccr=1, pga_n_resamples=20, progress=False)
    assert "z_low" not in pd.read_csv(one["pga.csv"]).columns
    assert "not run" in geolens.PGAResult.load(one["pga.json"]).params["bootstrap"]


# ---------------------------------------------------------------- the steps of _score_states, one at a time

def test_add_intervals_places_the_interval_after_z_se_and_counts_failed_resamples():
    import math
    import warnings

    import numpy as np

    from geolens.analyses.pga import _APPROX_COLUMNS, _add_intervals

    rng = np.random.default_rng(0)
    rows = [{"layer": l, "site": "resid_post", "ccr": 1, **{c: float(l) for c in _APPROX_COLUMNS}} for l in range(3)]
    rows[2]["z"] = math.nan  # a degenerate cell: its failed resamples are not counted
    rows[2]["degenerate"] = "one distinct state"
    zs = [rng.normal(size=50), np.r_[rng.normal(size=45), [np.nan] * 5], np.full(50, np.nan)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failed = _add_intervals(rows, [{"z": z} for z in zs], _APPROX_COLUMNS, 50, n_texts=16)
    assert failed == 5 and len(caught) == 1 and "5 of 100 resampled PGA scores" in str(caught[0].message)
    for row, z in zip(rows[:2], zs):
        # Symmetric about the row's z, from the finite resamples' spread (scipy's t), made unbiased for 16 texts.
        finite = z[np.isfinite(z)]
        half = scipy.stats.t.ppf(0.975, finite.size - 1) * np.std(finite, ddof=1) * np.sqrt(16 / 15)
        assert (row["z_low"], row["z_high"]) == pytest.approx((row["z"] - half, row["z"] + half), rel=1e-12)
    assert math.isnan(rows[2]["z_low"]) and math.isnan(rows[2]["z_high"])
    columns = list(rows[0])
    assert columns[columns.index("z_se") + 1: columns.index("z_se") + 4] == ["z_low", "z_high", "z_end_error"]
    assert list(rows[2])[-1] == "degenerate"  # columns outside the order keep their place at the end


def test_pair_params_say_whether_the_sample_was_exact():
    from geolens.analyses.pga import _pair_params

    assert _pair_params(10_000, None, 100) == {"n_pairs": 4950, "exact": True}
    sampled = _pair_params(1000, 1000, 100)
    assert sampled["n_pairs"] == 1000 and sampled["exact"] is False and "jackknife" in sampled["null_std"]
    assert _pair_params(1000, None, 10)["exact"] is True  # 45 pairs: all of them


def test_flag_degenerate_marks_every_row_and_refuses_all_degenerate():
    from geolens._validation import DegenerateError
    from geolens.analyses.pga import _flag_degenerate

    rows = [{"z": 1.0}, {"z": 2.0}]
    _flag_degenerate(rows, [])
    assert rows == [{"z": 1.0}, {"z": 2.0}]  # nothing degenerate: no column
    with pytest.raises(DegenerateError, match="every layer is degenerate, e.g. cell A"):
        _flag_degenerate([{"degenerate": "x"}], ["cell A"])
    with pytest.warns(UserWarning, match="1 of 2 PGA scores are undefined"):
        _flag_degenerate(rows, ["cell B"])
    assert [row["degenerate"] for row in rows] == ["", ""]
