"""geolens.convergence: span alignment across two tokenizers, and self-convergence of a real (tiny) model."""

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import geolens
from geolens.analyses.convergence import aligned_positions, word_end_offsets

TEXTS = ["the cat sat, on the mat.", "a dog-ran home!"]


class _TextOnlyAdapter:
    """Just what alignment reads from an adapter: a fast tokenizer, BOS handling, and its own tokenisation."""

    def __init__(self, tokenizer, name, bos=None):
        self.tokenizer, self.name = tokenizer, name
        self.prepends_bos, self.bos_token_id, self.pad_token_id = bos is not None, bos, 0

    def tokenize(self, texts, max_length=None):
        ids = self.tokenizer(texts[0], add_special_tokens=False)["input_ids"]
        ids = ([self.bos_token_id] if self.prepends_bos else []) + ids
        return torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)


def _fast(pre_tokenizer, vocab):
    tok = Tokenizer(models.WordLevel(vocab={v: i for i, v in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_word_end_offsets():
    assert word_end_offsets("the cat.", [3, 7, 8]) == {3: 0, 7: 1}
    assert word_end_offsets("dog-ran", [3, 4, 7]) == {3: 0, 7: 2}


def test_alignment_across_word_and_character_tokenizers():
    chars = sorted(set("".join(TEXTS)))
    words = ["the", "cat", "sat", ",", "on", "mat", ".", "a", "dog", "-", "ran", "home", "!"]
    word_tok = _fast(pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]),
                     ["[UNK]"] + words)
    char_tok = _fast(pre_tokenizers.Split("", behavior="isolated"), ["[UNK]"] + chars)
    a, b = _TextOnlyAdapter(word_tok, "words", bos=None), _TextOnlyAdapter(char_tok, "chars", bos=len(chars) + 1)
    tokens, masks, positions, spans = aligned_positions([a, b], TEXTS)
    # Every word end except the very first token of a text (never used) is shared.
    expected = [(0, 7), (0, 11), (0, 15), (0, 19), (0, 23), (1, 5), (1, 9), (1, 14)]
    assert spans == expected
    for adapter, pos in ((a, positions[0]), (b, positions[1])):
        for (text_index, token_index), (_, end) in zip(pos.tolist(), spans):
            enc = adapter.tokenizer(TEXTS[text_index], add_special_tokens=False, return_offsets_mapping=True)
            shift = 1 if adapter.prepends_bos else 0
            assert enc["offset_mapping"][token_index - shift][1] == end  # that token ends at the word end
    assert masks[1][0].sum() == len(TEXTS[0]) + 1  # characters + BOS
    assert positions[0].shape == positions[1].shape == (8, 2)


def test_model_converges_with_itself(neox_bridge, texts):
    res = geolens.convergence(neox_bridge, list(texts) * 3, neox_bridge, layers=1, other_layers=1, k=4, n_null=5,
                              n_tokens=None, progress=False)
    row = res.to_pandas().iloc[0]
    assert row.spearman_full == pytest.approx(1.0, abs=1e-9) and row.spearman_readout == pytest.approx(1.0, abs=1e-9)
    assert row.spearman_random_mean < 1.0
    grid = geolens.convergence(neox_bridge, list(texts) * 3, neox_bridge, k=4, grid=True, n_tokens=None,
                               progress=False)
    table = grid.to_pandas()
    assert len(table) == (neox_bridge.cfg.n_layers + 1) ** 2
    diagonal = table[table.layer_a == table.layer_b]
    assert (diagonal.spearman_full - 1.0).abs().max() < 1e-9
    assert len(grid.plot().data) == 1 and len(res.plot().data) == 1


def test_convergence_errors(neox_bridge, texts):
    with pytest.raises(ValueError, match="n_tokens = 10000"):
        geolens.convergence(neox_bridge, list(texts), neox_bridge, k=4, n_tokens=10_000, progress=False)
    with pytest.raises(ValueError, match="non-empty list"):
        geolens.convergence(neox_bridge, [], neox_bridge, k=4, progress=False)
    with pytest.raises(ValueError, match="k must be <"):
        geolens.convergence(neox_bridge, list(texts), neox_bridge, k=999, progress=False)


# ---------------------------------------------------------------- CKA and mutual k-NN next to Spearman

from scipy.spatial.distance import pdist  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from geolens.analyses.convergence import MEASURES, depth_pairs  # noqa: E402
from geolens.metrics import distance_convergence, linear_cka, mutual_knn  # noqa: E402
from geolens.metrics.convergence import centred_unit_ranks  # noqa: E402
from geolens.metrics.grassmann import random_subspaces  # noqa: E402
from geolens.metrics.preprocess import remove_common_components  # noqa: E402
from geolens.metrics.readout import readout_basis  # noqa: E402
from tests.conftest import CORPUS  # noqa: E402

# Distinct sentences (no repeated positions, so no ties among neighbours): 37 shared word ends.
WORDS = list(CORPUS) + ["the dog sat on the bird", "a friend sang in the park every night"]


def _aligned_states(model_a, model_b, layers_a, layers_b):
    """The states convergence compares when it takes every aligned position (n_tokens=None)."""
    adapters = [geolens.as_adapter(model_a), geolens.as_adapter(model_b)]
    tokens, masks, positions, _ = aligned_positions(adapters, WORDS)
    out = []
    for adapter, tok, mask, pos, layers in zip(adapters, tokens, masks, positions, (layers_a, layers_b)):
        states = geolens.capture(adapter, tok, layers=layers, attention_mask=mask, positions=(pos[:, 0], pos[:, 1]),
                                 progress=False)
        out.append((adapter, states))
    return out


def test_every_measure_equals_direct_computation_in_each_space(neox_bridge, native_bridge):
    k, n_null, ccr = 4, 6, 1
    res = geolens.convergence(neox_bridge, WORDS, native_bridge, layers=[1, 2], other_layers=[2, 0], k=k, n_null=n_null,
                              n_neighbors=3, n_tokens=None, progress=False)
    table = res.to_pandas()
    assert res.params["measures"] == list(MEASURES) and res.params["knn_k"] == 3 and res.params["debiased"] is False
    assert list(table.columns[:4]) == ["layer_a", "layer_b", "depth_a", "depth_b"]
    (a, states_a), (b, states_b) = _aligned_states(neox_bridge, native_bridge, [1, 2], [0, 2])
    qa, qb = readout_basis(a.unembed_matrix(), k), readout_basis(b.unembed_matrix(), k)
    nulls_a = random_subspaces(a.d_model, k, n_null, seed=0, dtype=torch.float32)
    nulls_b = random_subspaces(b.d_model, k, n_null, seed=1, dtype=torch.float32)
    for row, (la, lb) in zip(table.itertuples(), [(1, 2), (2, 0)]):
        xa, xb = states_a.layer("resid_post", la), states_b.layer("resid_post", lb)
        assert (row.depth_a, row.depth_b) == (la / 2, lb / 2)
        spearman = distance_convergence(xa, xb, qa, qb, n_null=n_null, ccr=ccr, seed=0)
        assert row.spearman_full == pytest.approx(spearman["spearman_full"], abs=1e-12)
        assert row.spearman_readout_z == pytest.approx(spearman["spearman_readout_z"], abs=1e-9)
        pa, pb = remove_common_components(xa, ccr), remove_common_components(xb, ccr)
        for prefix, score in (("cka", linear_cka), ("mknn", lambda x, y: mutual_knn(x, y, k=3))):
            assert getattr(row, f"{prefix}_full") == pytest.approx(score(pa, pb), abs=1e-9)
            assert getattr(row, f"{prefix}_readout") == pytest.approx(score(pa @ qa, pb @ qb), abs=1e-9)
            null = torch.tensor([score(pa @ nulls_a[r], pb @ nulls_b[r]) for r in range(n_null)], dtype=torch.float64)
            assert getattr(row, f"{prefix}_random_mean") == pytest.approx(float(null.mean()), abs=1e-9)
            assert getattr(row, f"{prefix}_random_std") == pytest.approx(float(null.std()), abs=1e-9)
            z = (getattr(row, f"{prefix}_readout") - null.mean()) / null.std()
            assert getattr(row, f"{prefix}_readout_z") == pytest.approx(float(z), abs=1e-6)
    assert 0 <= table.cka_full.min() and table.mknn_full.max() <= 1


@pytest.mark.parametrize("debiased", [False, True])
def test_grid_of_every_measure_equals_direct_computation(neox_bridge, native_bridge, debiased):
    res = geolens.convergence(neox_bridge, WORDS, native_bridge, grid=True, k=4, n_neighbors=4, ccr=0, debiased=debiased,
                              n_tokens=None, progress=False)
    table = res.to_pandas()
    assert len(table) == 9 and "cka_random_mean" not in table and res.params["debiased"] is debiased
    (a, states_a), (b, states_b) = _aligned_states(neox_bridge, native_bridge, None, None)
    qa, qb = readout_basis(a.unembed_matrix(), 4), readout_basis(b.unembed_matrix(), 4)
    for row in table.itertuples():
        pa = remove_common_components(states_a.layer("resid_post", row.layer_a), 0)
        pb = remove_common_components(states_b.layer("resid_post", row.layer_b), 0)
        for space, (x, y) in (("full", (pa, pb)), ("readout", (pa @ qa, pb @ qb))):
            # Spearman of the float32 cosines as the metric ranks them (repeated tokens tie at layer 0)
            rho = float(centred_unit_ranks(x) @ centred_unit_ranks(y))
            assert getattr(row, f"spearman_{space}") == pytest.approx(rho, abs=1e-9)
            if row.layer_a > 0 and row.layer_b > 0:  # no exact ties: scipy on float64 agrees closely
                ref = spearmanr(pdist(x.double().numpy(), "cosine"), pdist(y.double().numpy(), "cosine")).statistic
                assert getattr(row, f"spearman_{space}") == pytest.approx(ref, abs=1e-4)
            assert getattr(row, f"cka_{space}") == pytest.approx(linear_cka(x, y, debiased=debiased), abs=1e-9)
            assert getattr(row, f"mknn_{space}") == pytest.approx(mutual_knn(x, y, k=4), abs=1e-12)
    assert len(res.plot(kind="cka_full").data) == 1 and len(res.plot(kind="mknn_readout").data) == 1


def test_self_grid_diagonal_is_one_for_every_measure(neox_bridge):
    table = geolens.convergence(neox_bridge, WORDS, grid=True, k=4, n_neighbors=3, debiased=True, n_tokens=None,
                                progress=False).to_pandas()
    diagonal = table[table.layer_a == table.layer_b]
    for column in ("spearman_full", "spearman_readout", "cka_full", "cka_readout", "mknn_full", "mknn_readout"):
        assert (diagonal[column] - 1.0).abs().max() < 1e-9, column


def test_measures_option_selects_columns_and_bad_names_raise(neox_bridge):
    table = geolens.convergence(neox_bridge, WORDS, measures="cka", k=4, n_null=3, n_tokens=None,
                                progress=False).to_pandas()
    assert [c for c in table.columns if c.startswith(("rho", "z_", "spearman", "cka", "mknn"))] == [
        "cka_full", "cka_readout", "cka_random_mean", "cka_random_std", "cka_readout_z"]
    with pytest.raises(ValueError, match=r"unknown measures \['pearson'\]"):
        geolens.convergence(neox_bridge, WORDS, measures=("spearman", "pearson"), k=4, progress=False)
    with pytest.raises(ValueError, match="measures is empty"):
        geolens.convergence(neox_bridge, WORDS, measures=(), k=4, progress=False)
    with pytest.raises(TypeError, match="measures must be"):
        geolens.convergence(neox_bridge, WORDS, measures=3, k=4, progress=False)
    with pytest.raises(ValueError, match="n_neighbors must be <"):
        geolens.convergence(neox_bridge, WORDS, n_neighbors=500, k=4, n_tokens=None, progress=False)
    with pytest.raises(TypeError, match="debiased must be a bool"):
        geolens.convergence(neox_bridge, WORDS, debiased="yes", k=4, progress=False)


def test_layer_pairs_and_relative_depth(neox_bridge, native_bridge):
    res = geolens.convergence(neox_bridge, WORDS, native_bridge, layers=[0, 1, 2], other_layers=1, k=4, n_null=3,
                              n_neighbors=3, n_tokens=None, progress=False)
    table = res.to_pandas()
    assert table[["layer_a", "layer_b"]].values.tolist() == [[0, 1], [1, 1], [2, 1]]
    assert len(res.plot(kind="mknn_full").data) == 3  # full, readout, random by relative depth
    with pytest.raises(ValueError, match="pairwise"):
        geolens.convergence(neox_bridge, WORDS, layers=[0, 1], other_layers=[0, 1, 2], k=4, progress=False)
    with pytest.raises(ValueError, match="layers"):
        geolens.convergence(neox_bridge, WORDS, layers=[5], k=4, progress=False)
    assert depth_pairs(30, 18) == (
        [0, 2, 3, 5, 7, 8, 10, 12, 13, 15, 17, 18, 20, 22, 23, 25, 27, 28, 30], list(range(19)))
    assert depth_pairs(2, 4) == ([0, 1, 2], [0, 2, 4]) and depth_pairs(3, 3) == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_default_n_positions_is_an_upper_bound(neox_bridge):
    with pytest.warns(UserWarning, match=r"only 37 aligned positions .* using all of them"):
        res = geolens.convergence(neox_bridge, WORDS, k=4, n_null=3, n_neighbors=3, progress=False)
    assert res.params["n_positions"] == res.params["n_positions_available"] == 37
    with pytest.raises(ValueError, match="n_tokens = 38 but the texts give only 37"):
        geolens.convergence(neox_bridge, WORDS, k=4, n_tokens=38, progress=False)
    with pytest.raises(ValueError, match="n_tokens = 1024 but"):  # an explicit 1024 is not the default bound
        geolens.convergence(neox_bridge, WORDS, k=4, n_tokens=1024, progress=False)
    assert geolens.convergence(neox_bridge, WORDS, k=4, n_null=3, n_neighbors=3, n_tokens=20,
                               progress=False).params["n_positions"] == 20


# ---------------------------------------------------------------- the steps of convergence(), one at a time

def test_sample_positions_is_seeded_bounded_and_sorted():
    from geolens._validation import UpperBound
    from geolens.analyses.convergence import _DEFAULT_POSITIONS, _sample_positions

    pick = _sample_positions(50, 10, seed=3)
    assert pick.tolist() == sorted(set(pick.tolist())) and len(pick) == 10 and 0 <= int(pick.min())
    assert int(pick.max()) < 50 and torch.equal(pick, _sample_positions(50, 10, seed=3))
    assert not torch.equal(pick, _sample_positions(50, 10, seed=4))
    reference = torch.randperm(50, generator=torch.Generator().manual_seed(3))[:10].sort().values
    assert torch.equal(pick, reference)  # the draw convergence() always made
    assert _sample_positions(50, None, seed=0) is None
    for bound in (_DEFAULT_POSITIONS, UpperBound(80)):  # an upper bound: fewer available -> all, with a warning
        with pytest.warns(UserWarning, match="only 50 aligned positions"):
            assert _sample_positions(50, bound, seed=0) is None
    assert len(_sample_positions(50, UpperBound(20), seed=0)) == 20
    with pytest.raises(ValueError, match="n_tokens = 60"):
        _sample_positions(50, 60, seed=0)
    with pytest.raises(ValueError, match="only 2 word ends"):
        _sample_positions(2, None, seed=0)


def test_layer_pairs_broadcast_an_int_and_refuse_unequal_lists(neox_bridge, native_bridge):
    from geolens.analyses.convergence import _layer_pairs

    a, b = geolens.as_adapter(neox_bridge), geolens.as_adapter(native_bridge)
    assert _layer_pairs(a, b, None, None) == ([a.n_layers // 2], [b.n_layers // 2])
    assert _layer_pairs(a, b, [0, 2], 1) == ([0, 2], [1, 1]) and _layer_pairs(a, b, 2, [0, 1]) == ([2, 2], [0, 1])
    with pytest.raises(ValueError, match="pairwise"):
        _layer_pairs(a, b, [0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match="other_layers"):
        _layer_pairs(a, b, 0, [])


def test_null_scores_and_columns_equal_a_direct_loop():
    import numpy as np

    from geolens.analyses.convergence import _null_columns, _null_scores, _scorer
    from geolens.metrics.distances import condensed_indices

    g = torch.Generator().manual_seed(0)
    pa, pb = torch.randn(12, 6, generator=g, dtype=torch.float64), torch.randn(12, 5, generator=g, dtype=torch.float64)
    nulls_a = random_subspaces(6, 2, 11, seed=0, dtype=torch.float64)  # 11: the last chunk of 8 is partial
    nulls_b = random_subspaces(5, 2, 11, seed=1, dtype=torch.float64)
    score = _scorer("spearman", {}, condensed_indices(12))
    null = _null_scores("spearman", score, pa, pb, nulls_a, nulls_b)
    reference = [spearmanr(pdist((pa @ nulls_a[r]).numpy(), "cosine"), pdist((pb @ nulls_b[r]).numpy(), "cosine"))
                 .statistic for r in range(11)]
    np.testing.assert_allclose(null.numpy(), reference, atol=1e-9)
    cka = _null_scores("cka", _scorer("cka", {"debiased": False}, None), pa, pb, nulls_a, nulls_b)
    np.testing.assert_allclose(cka.numpy(), [linear_cka(pa @ nulls_a[r], pb @ nulls_b[r]) for r in range(11)])
    columns = _null_columns("spearman", 0.5, null)
    assert list(columns) == ["spearman_random_mean", "spearman_random_std", "spearman_readout_z"]
    assert columns["spearman_random_std"] == pytest.approx(np.std(reference, ddof=1), abs=1e-9)
    assert columns["spearman_readout_z"] == pytest.approx((0.5 - np.mean(reference)) / np.std(reference, ddof=1),
                                                          abs=1e-6)


def test_every_column_follows_measure_space_statistic(neox_bridge, native_bridge):
    res = geolens.convergence(neox_bridge, WORDS, native_bridge, k=4, n_null=3, n_neighbors=3, n_tokens=None,
                              progress=False)
    measures = [c for c in res.to_pandas().columns if c not in ("layer_a", "layer_b", "depth_a", "depth_b")]
    expected = [f"{m}_{part}" for m in ("spearman", "cka", "mknn")
                for part in ("full", "readout", "random_mean", "random_std", "readout_z")]
    assert measures == expected


def test_results_saved_with_the_old_column_names_load_under_the_new_ones(tmp_path):
    from geolens.analyses.convergence import RENAMED_COLUMNS, ConvergenceResult

    old = {name: float(i) for i, name in enumerate(RENAMED_COLUMNS)}
    path = ConvergenceResult(rows=[{"layer_a": 0, "layer_b": 1, **old}], cross_rows=[{"layer_a": 2, **old}],
                             params={"grid": False}).save(tmp_path / "old.json")
    loaded = ConvergenceResult.load(path)
    new = {RENAMED_COLUMNS[name]: value for name, value in old.items()}
    assert loaded.rows == [{"layer_a": 0, "layer_b": 1, **new}] and loaded.cross_rows == [{"layer_a": 2, **new}]
    assert set(RENAMED_COLUMNS.values()) == {f"spearman_{p}" for p in ("full", "readout", "random_mean",
                                                                      "random_std", "readout_z")} | {
        "cka_readout_z", "mknn_readout_z"}
