"""geolens.phases on a planted tuned lens: the RSS trajectory is the planted one, and the phases are found."""

import math

import pytest
import torch

import geolens
from geolens.lens import TunedLens, evaluate
from geolens.metrics.phases import PHASE_NAMES
from tests.conftest import make_native_bridge

# Radians between consecutive readout subspaces: fast rotation, a still plateau (RSS points 2..10), fast again.
ANGLES = (1.4, 0.8, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 1.4)
K = 2


@pytest.fixture(scope="module")
def deep_bridge(tiny_tokenizer):
    return make_native_bridge(tiny_tokenizer, n_layers=len(ANGLES) + 1)


def _planted_lens(model, angles=ANGLES):
    """Translators whose maps I + A_l have top-K right singular subspace Q_l, rotating by ``angles``."""
    lens = TunedLens(model)
    d = lens.d_model
    eye = torch.eye(d)
    current, fresh = eye[:, :K], K
    with torch.no_grad():
        for layer in range(lens.n_layers):
            projector = current @ current.T
            linear_map = 10.0 * projector + 0.1 * (eye - projector)
            lens.translators[layer].weight.copy_(linear_map - eye)
            if layer < len(angles):
                theta = angles[layer]
                current = math.cos(theta) * current + math.sin(theta) * eye[:, fresh : fresh + K]
                fresh += K
    return lens


def test_phases_of_planted_lens(deep_bridge, texts):
    lens = _planted_lens(deep_bridge)
    before = {k: v.clone() for k, v in deep_bridge.state_dict().items()}
    res = geolens.phases(deep_bridge, list(texts) * 3, lens=lens, fractions=(K / 32, 0.5), k=K / 32,
                         smoothing=0.0, n_tokens=None, progress=False)
    table = res.to_pandas()
    rss = table.rss.iloc[: len(ANGLES)]
    torch.testing.assert_close(torch.tensor(rss.values), torch.tensor([math.cos(a) for a in ANGLES], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    assert res.params["k"] == K and res.params["found"], res.params["reason"]
    b1, b2 = res.params["b1"], res.params["b2"]
    assert b1 == 2 and b2 in (10, 11)
    assert table.phase.iloc[0] == PHASE_NAMES[0] and table.phase.iloc[b1] == PHASE_NAMES[1]
    assert table.phase.iloc[-1] == PHASE_NAMES[2]
    for column in ("erank_states", "orthogonality", "ffn_mha_ratio", "hit@1_tuned", "hit@5_logit"):
        assert column in table.columns
    assert math.isnan(table.orthogonality.iloc[0]) and not math.isnan(table.orthogonality.iloc[1])
    assert {row["k"] for row in res.params["sweep"]} == {K, 16}
    assert len(res.plot().data) == 2
    assert all(torch.equal(before[k], v) for k, v in deep_bridge.state_dict().items())


def test_flat_trajectory_reports_no_phases(deep_bridge, texts):
    lens = TunedLens(deep_bridge)  # untrained: every map is the identity, every RSS is 1
    with torch.no_grad():
        for translator in lens.translators:
            translator.weight.copy_(torch.diag(torch.linspace(2.0, 0.1, lens.d_model)) - torch.eye(lens.d_model))
    res = geolens.phases(deep_bridge, list(texts) * 3, lens=lens, n_tokens=None, progress=False)
    assert not res.params["found"] and res.params["reason"]
    assert res.to_pandas().phase.isna().all()


def test_lens_of_another_model_is_refused(deep_bridge, native_bridge, texts):
    with pytest.raises(ValueError, match="another shape"):
        geolens.phases(deep_bridge, list(texts), lens=TunedLens(native_bridge), progress=False)


def _nudged(lens, scale, seed):
    """The same translators plus seeded noise of relative size ``scale``."""
    other = TunedLens(lens.adapter)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mine, theirs in zip(lens.translators, other.translators):
            theirs.weight.copy_(mine.weight + scale * mine.weight.abs().max() * torch.randn(mine.weight.shape, generator=g))
    return other


def test_two_lenses_that_agree_are_stable_and_unrelated_ones_are_not(deep_bridge):
    from geolens.analyses.phases import phase_stability

    lens = _planted_lens(deep_bridge)
    fractions = (K / 32,)  # the planted structure lives at k = K
    close = phase_stability(lens, _nudged(lens, 1e-3, 1), fractions=fractions, smoothing=0.0)
    assert close["stable"], close["reason"]
    for row in close["per_k"]:
        assert row["pearson"] >= 0.9 and abs(row["b1"][0] - row["b1"][1]) <= 1 and abs(row["b2"][0] - row["b2"][1]) <= 1
    unrelated = phase_stability(lens, _nudged(TunedLens(deep_bridge), 1.0, 2), fractions=fractions, smoothing=0.0)
    assert not unrelated["stable"] and unrelated["reason"]


def test_unstable_phases_are_reported_as_such(deep_bridge, texts, monkeypatch):
    import geolens.analyses.phases as ph

    lens = _planted_lens(deep_bridge)

    def fitted(model, train_texts, *, halves=False, **kw):  # the halves disagree: one is unrelated
        assert halves and len(train_texts) > 4
        lens.halves = (_nudged(lens, 1e-3, 1), _nudged(TunedLens(deep_bridge), 1.0, 2))
        return lens

    monkeypatch.setattr(ph, "cached_tuned_lens", fitted)
    res = geolens.phases(deep_bridge, list(texts) * 2, lens_tokens=list(texts) * 2, fractions=(K / 32, 0.5),
                         k=K / 32, smoothing=0.0, n_tokens=None, progress=False)
    assert not res.params["found"] and res.params["reason"].startswith("no stable phases")
    assert res.params["unstable_breakpoints"][0] == 2 and res.params["stability"]["stable"] is False
    assert res.to_pandas().phase.isna().all()


def _kneedle_phases(curve):
    """The breakpoints of an unsmoothed RSS curve straight from kneed: the top plateau's middle splits it, the
    rising side's knee is b1, the falling side's b2 (docs/methods.md §C.9) — the reference of the per-k table."""
    import numpy as np
    from kneed import KneeLocator

    y = np.asarray(curve, dtype=np.float64)
    x = np.arange(y.size, dtype=np.float64)
    top = np.flatnonzero(y >= y.max() - 0.05 * (y.max() - y.min()))
    peak = int((top[0] + top[-1]) // 2)
    b1 = KneeLocator(x[: peak + 1], y[: peak + 1], S=1.0, curve="concave", direction="increasing").knee
    b2 = KneeLocator(x[peak:], y[peak:], S=1.0, curve="concave", direction="decreasing").knee
    return int(b1), int(b2)


def test_stability_table_per_k_against_kneedle_on_planted_halves(deep_bridge, texts, monkeypatch):
    """Half 0 is the planted three-phase lens, half 1 a lens whose readout subspaces turn ever faster (RSS only falls):
    at k = K the table gives half 0 the breakpoints kneed finds on the planted curve, half 1 none, and the
    rule fails there and only for that reason; the findings name the k and the halves."""
    import geolens.analyses.phases as ph
    from geolens.analyses.findings import phases_findings

    lens = _planted_lens(deep_bridge)
    settling = tuple(0.1 * (i + 1) for i in range(len(ANGLES)))  # RSS falls from the first layer: no rise
    monkeypatch.setattr(ph, "cached_tuned_lens", lambda model, train_texts, *, halves=False, **kw: (
        setattr(lens, "halves", (_planted_lens(deep_bridge), _planted_lens(deep_bridge, settling))) or lens))
    res = geolens.phases(deep_bridge, list(texts), lens_tokens=list(texts) * 2, fractions=(K / 32, 0.5),
                         k=K / 32, smoothing=0.0, n_tokens=None, progress=False)
    expected = _kneedle_phases([math.cos(a) for a in ANGLES])
    assert expected[0] == 2  # the planted rise ends where the angles reach the plateau's
    table = res.stability_table()
    assert table.k.tolist() == [round(f * 32) for f in ph.STABILITY_FRACTIONS] and table.k.iloc[0] == K
    at_k = table.iloc[0]
    assert at_k.lens == at_k.half_0 == f"({expected[0]}, {expected[1]})" and at_k.half_1 == "none"
    assert at_k.stable == "no" and at_k.why.startswith(f"lens A finds ({expected[0]}, {expected[1]}), lens B none")
    assert "no rising side" in at_k.why and not math.isnan(at_k.pearson)
    # The lens's phases at the chosen k are those of kneed too, set aside because the rule fails.
    assert not res.params["found"] and tuple(res.params["unstable_breakpoints"]) == expected
    assert res.params["stability"]["stable_k"] == table.k[table.stable == "yes"].tolist()
    assert set(res.tables()) == {"layers", "stability"} and res.tables()["stability"].equals(table)
    first, per_k = phases_findings(res)
    assert first.startswith(f"No stable phases: the lens finds breakpoints ({expected[0]}, {expected[1]}) at k = {K}")
    assert f"at k = {K} half 0 (even texts) finds ({expected[0]}, {expected[1]}), half 1 (odd texts) none" in per_k
    # Two identical halves agree at every k where they find phases; where neither does, the rule still fails.
    monkeypatch.setattr(ph, "cached_tuned_lens", lambda model, train_texts, *, halves=False, **kw: (
        setattr(lens, "halves", (lens, lens)) or lens))
    same = geolens.phases(deep_bridge, list(texts), lens_tokens=list(texts) * 2, fractions=(K / 32, 0.5),
                          k=K / 32, smoothing=0.0, n_tokens=None, progress=False).stability_table()
    assert same.iloc[0].half_0 == same.iloc[0].half_1 == f"({expected[0]}, {expected[1]})"
    assert same.pearson.tolist() == pytest.approx([1.0] * len(same)) and (same.half_0 == same.half_1).all()
    assert ((same.stable == "yes") == (same.half_0 != "none")).all()
    assert (same.why[same.half_0 == "none"] == "neither lens finds phases").all()


def test_lens_check_compares_two_planted_lenses_k_by_k(deep_bridge, texts, monkeypatch):
    """Two fits told apart by their budget: the shorter one's halves are both the planted three-phase lens, the
    longer one's second half only falls (no phases). lens_check finds the phases the same where both second halves
    find none, different at k = K, and the rule's verdict changed; the findings say so."""
    import geolens.analyses.phases as ph
    from geolens.analyses.findings import phases_findings
    from geolens.lens import longer_budget

    planted = _planted_lens(deep_bridge)
    settling = _planted_lens(deep_bridge, tuple(0.1 * (i + 1) for i in range(len(ANGLES))))

    def fitted(model, train_texts, *, halves=False, max_steps=None, **kw):
        lens = _planted_lens(deep_bridge)
        lens.halves = (planted, planted if max_steps == 3 else settling)
        lens.training_info = {"steps": max_steps, "stopped": "steps", "best_held_out_kl_mean": 3.0 / max_steps,
                              "halves_held_out_kl": [[1.0, 2.0], [3.0, 4.0]]}
        return lens

    monkeypatch.setattr(ph, "cached_tuned_lens", fitted)
    common = dict(lens_tokens=list(texts) * 2, fractions=(K / 32, 0.5), k=K / 32, smoothing=0.0, n_tokens=None,
                  progress=False)
    budget = {"method": "fast", "max_steps": 3, "max_seconds": 10.0}
    short = geolens.phases(deep_bridge, list(texts), lens_budget=budget, **common)
    longer = geolens.phases(deep_bridge, list(texts), lens_budget=longer_budget(budget, factor=2), **common)
    check = ph.lens_check(short, longer, factor=2)
    assert check["steps"] == [3, 6] and check["ratio"] == pytest.approx(2.0)
    assert check["halves_held_out_kl"] == [[1.5, 3.5], [1.5, 3.5]]
    a, b = short.stability_table(), longer.stability_table()
    assert [row["k"] for row in check["per_k"]] == a.k.tolist() == b.k.tolist()
    at_k = check["per_k"][0]
    assert at_k["k"] == K and at_k["this"]["half_1"] == at_k["this"]["half_0"] != "none"
    assert at_k["longer"]["half_1"] == "none" and at_k["this"]["stable"] == "yes" and at_k["longer"]["stable"] == "no"
    for row, (_, x), (_, y) in zip(check["per_k"], a.iterrows(), b.iterrows()):  # same: the lens and both halves
        assert row["same"] == (x.lens == y.lens and x.half_0 == y.half_0 and x.half_1 == y.half_1)
    assert not at_k["same"] and check["same_phases"] is False and check["same_verdict"] is False
    short.params["lens_check"] = check
    table = short.tables()["lens_check"]
    assert table.k.tolist() == a.k.tolist() and table.same.iloc[0] == "no"
    lines = phases_findings(short)
    assert lines[-2].startswith("Checked against a lens trained 2× longer on the same texts (6 steps against 3)")
    assert f"at k = {K} it differs: half 1 none against {at_k['this']['half_1']}" in lines[-1]
    assert lines[-1].endswith("this report's phases depend on how long its lens was trained.")
    # A check against the same lens: the same phases at every k, and the same verdict.
    same = ph.lens_check(short, short, factor=2)
    assert same["same_phases"] is True and same["same_verdict"] is True and same["ratio"] == pytest.approx(1.0)


def test_stability_lenses_come_from_the_halves_or_from_each_half_of_the_texts(deep_bridge, texts, monkeypatch):
    """The fast method: one fit with its halves; the reference recipe: a lens per half of the lens texts."""
    import geolens.analyses.phases as ph

    lens, calls = _planted_lens(deep_bridge), []

    def fitted(model, train_texts, *, halves=False, **kw):
        calls.append((list(train_texts), halves, kw.get("method")))
        lens.halves = (lens, lens) if halves else None
        return lens

    monkeypatch.setattr(ph, "cached_tuned_lens", fitted)
    lens_texts = [f"{t} {i}" for i, t in enumerate(list(texts) * 2)]
    common = dict(lens_tokens=lens_texts, fractions=(K / 32, 0.5), k=K / 32, smoothing=0.0, n_tokens=None,
                  progress=False)
    fast = geolens.phases(deep_bridge, list(texts), **common)
    assert calls == [(lens_texts, True, "fast")]
    assert all(row["pearson"] == pytest.approx(1.0) for row in fast.params["stability"]["per_k"])  # identical halves
    calls.clear()
    geolens.phases(deep_bridge, list(texts), lens_budget={"max_steps": 1, "tokens_per_step": 8}, **common)
    assert calls == [(lens_texts, False, "reference"), (lens_texts[0::2], False, "reference"),
                     (lens_texts[1::2], False, "reference")]


def test_a_given_lens_evaluation_gives_the_same_table(deep_bridge, texts):
    """The report hands its lens section's evaluation to phases: the same numbers as evaluating again."""
    lens = _planted_lens(deep_bridge)
    common = dict(lens=lens, n_tokens=None, progress=False, fractions=(K / 32, 0.5), k=K / 32, smoothing=0.0)
    own = geolens.phases(deep_bridge, list(texts), **common).to_pandas()
    evaluation = evaluate(deep_bridge, list(texts), lens=lens, n_tokens=None, progress=False)
    given = geolens.phases(deep_bridge, list(texts), lens_evaluation=evaluation, **common).to_pandas()
    assert own.equals(given)
    with pytest.raises(ValueError, match="lens_evaluation"):
        geolens.phases(deep_bridge, list(texts), lens_evaluation=evaluate(deep_bridge, list(texts), n_tokens=None,
                                                                          progress=False), **common)


def test_a_given_update_geometry_gives_the_same_table(deep_bridge, native_bridge, texts):
    """The report hands its updates section's result to phases: the same numbers as capturing them again;
    another model's result is refused."""
    lens = _planted_lens(deep_bridge)
    common = dict(lens=lens, n_tokens=None, progress=False, fractions=(K / 32, 0.5), k=K / 32, smoothing=0.0)
    own = geolens.phases(deep_bridge, list(texts), **common).to_pandas()
    geometry = geolens.updates(deep_bridge, list(texts), n_tokens=None, progress=False)
    given = geolens.phases(deep_bridge, list(texts), update_geometry=geometry, **common).to_pandas()
    assert own.equals(given) and own.update_norm.notna().sum() > 1
    for row in geometry.rows:  # what is given is what is reported: no second capture
        row["update_norm"] = 123.0
    marked = geolens.phases(deep_bridge, list(texts), update_geometry=geometry, **common).to_pandas()
    assert (marked.update_norm.dropna() == 123.0).all() and marked.update_norm.notna().sum() > 1
    other = geolens.updates(native_bridge, list(texts), n_tokens=None, progress=False)
    with pytest.raises(ValueError, match="update_geometry"):
        geolens.phases(deep_bridge, list(texts), update_geometry=other, **common)


# ---------------------------------------------------------------- the steps of phases(), one at a time

def test_lens_budget_names_the_recipe_its_keys_ask_for():
    from geolens.analyses.phases import _lens_budget

    assert _lens_budget(None) == {"method": "fast"}
    assert _lens_budget({"max_steps": 3, "tokens_per_step": 8}) == {"max_steps": 3, "tokens_per_step": 8,
                                                                     "method": "reference"}
    assert _lens_budget({"tokens_per_step": 64})["method"] == "reference"
    assert _lens_budget({"method": "fast", "tokens_per_step": 3})["method"] == "fast"  # an explicit method wins
    given = {"n_tokens": 64}
    _lens_budget(given)
    assert given == {"n_tokens": 64}  # the caller's dict is not changed


def test_resolution_takes_the_asked_fraction_or_the_front_choice(deep_bridge):
    from geolens.analyses.phases import _resolution
    from geolens.metrics.subspaces import choose_resolution

    lens = _planted_lens(deep_bridge)
    sweep, chosen = _resolution(lens, (0.25, 0.5), K / 32)
    assert [row["fraction"] for row in sweep] == [0.25, 0.5, K / 32] and chosen["k"] == K
    torch.testing.assert_close(chosen["rss"].double(), torch.tensor([math.cos(a) for a in ANGLES],
                                                                     dtype=torch.float64), atol=1e-6, rtol=0)
    sweep, chosen = _resolution(lens, (K / 32, 0.5), None)
    assert len(sweep) == 2 and chosen["k"] == choose_resolution(sweep)["k"]


def test_stable_split_sets_breakpoints_aside_only_when_the_halves_disagree():
    from geolens.analyses.phases import _split, _stable_split

    x = torch.arange(20.0)
    rss = torch.minimum(torch.minimum(x / 4, torch.ones(20)), (19 - x) / 4 + 0.2)  # rise, plateau 4..15, fall
    plain = _split(rss, 0.0, 1.0)
    assert plain.found
    for report in (None, {"stable": True, "reason": ""}):
        split, unstable = _stable_split(rss, 0.0, 1.0, report)
        assert split == plain and unstable is None
    split, unstable = _stable_split(rss, 0.0, 1.0, {"stable": False, "reason": "k = 3: breakpoints (2, 9) vs (5, 9)"})
    assert unstable == (plain.b1, plain.b2) and not split.found and split.b1 is None and split.b2 is None
    assert split.phases == [None] * 20 and split.peak == plain.peak and split.smoothed == plain.smoothed
    assert split.reason.endswith("(k = 3: breakpoints (2, 9) vs (5, 9))")
    flat = torch.ones(20)  # no phases to set aside: the stability report changes nothing
    assert _stable_split(flat, 0.0, 1.0, {"stable": False, "reason": "x"}) == (_split(flat, 0.0, 1.0), None)


def test_layer_rows_attribute_rss_points_and_read_the_diagnostics():
    import pandas as pd

    from geolens.analyses.phases import _layer_rows
    from geolens.metrics.phases import PhaseSplit

    chosen = {"k": 2, "rss": torch.tensor([0.9, 0.5, 0.7])}
    other = {"k": 4, "rss": torch.tensor([0.8, 0.6, 0.4])}
    split = PhaseSplit(True, 1, 2, 1, ["I", "II", "III"], [0.9, 0.5, 0.7], "")
    upd = pd.DataFrame({"layer": [1, 2, 3], "erank_states": [5.0, 6.0, 7.0], "orthogonality": [0.1, 0.2, 0.3],
                        "ffn_mha_ratio": [1.0, 2.0, 3.0], "update_norm": [4.0, 5.0, 6.0]}).set_index("layer")
    hits = {"tuned": pd.DataFrame({"layer": [0, 1, 2, 3], "hit@1": [0.1, 0.2, 0.3, 1.0],
                                   "hit@5": [0.5, 0.6, 0.7, 1.0]}).set_index("layer")}
    rows = pd.DataFrame(_layer_rows(3, chosen, [chosen, other], split, upd, hits))
    assert rows.layer.tolist() == [0, 1, 2, 3]
    assert rows.rss.tolist()[:3] == pytest.approx([0.9, 0.5, 0.7]) and math.isnan(rows.rss.iloc[3])
    assert rows["rss@k=4"].tolist()[:3] == pytest.approx([0.8, 0.6, 0.4]) and math.isnan(rows["rss@k=4"].iloc[3])
    assert rows.phase.tolist() == ["I", "II", "III", "III"]  # layer L takes the last point's phase
    assert math.isnan(rows.update_norm.iloc[0]) and rows.update_norm.tolist()[1:] == [4.0, 5.0, 6.0]
    assert rows["hit@1_tuned"].tolist() == [0.1, 0.2, 0.3, 1.0] and rows["hit@5_logit"].isna().all()


def test_fit_lens_records_how_many_texts_and_skips_stability_when_asked(deep_bridge, texts, monkeypatch):
    import geolens.analyses.phases as ph

    lens = _planted_lens(deep_bridge)

    def fitted(model, train_texts, *, halves=False, **kw):
        lens.halves = (lens, lens) if halves else None
        return lens

    monkeypatch.setattr(ph, "cached_tuned_lens", fitted)
    common = dict(cache_dir=None, seed=0, progress=False, smoothing=0.0, sensitivity=1.0)
    got, report, n = ph._fit_lens(deep_bridge, list(texts), None, stability=False, **common)
    assert got is lens and report is None and n == len(texts)
    got, report, n = ph._fit_lens(deep_bridge, "one text", None, stability=True, **common)
    assert report is None and n == 1  # fewer than 4 texts: no halves to compare
    with pytest.raises(TypeError, match="lens_tokens"):
        ph._fit_lens(deep_bridge, torch.zeros(2, 3, dtype=torch.long), None, stability=True, **common)
    res = geolens.phases(deep_bridge, list(texts), lens_tokens=list(texts) * 2, fractions=(K / 32,), smoothing=0.0,
                         n_tokens=None, progress=False)
    assert res.params["n_lens_texts"] == 2 * len(texts) and res.params["stability"] is not None
    given = geolens.phases(deep_bridge, list(texts), lens=lens, fractions=(K / 32,), n_tokens=None, progress=False)
    assert given.params["n_lens_texts"] is None and given.params["stability"] is None
