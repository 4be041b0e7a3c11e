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
    res = geolens.convergence(neox_bridge, neox_bridge, list(texts) * 3, layer_a=1, layer_b=1, k=4, n_null=5,
                              n_positions=None, progress=False)
    row = res.to_pandas().iloc[0]
    assert row.rho_full == pytest.approx(1.0, abs=1e-9) and row.rho_readout == pytest.approx(1.0, abs=1e-9)
    assert row.rho_random_mean < 1.0
    grid = geolens.convergence(neox_bridge, neox_bridge, list(texts) * 3, k=4, grid=True, n_positions=None,
                               progress=False)
    table = grid.to_pandas()
    assert len(table) == (neox_bridge.cfg.n_layers + 1) ** 2
    diagonal = table[table.layer_a == table.layer_b]
    assert (diagonal.rho_full - 1.0).abs().max() < 1e-9
    assert len(grid.plot().data) == 1 and len(res.plot().data) == 1


def test_convergence_errors(neox_bridge, texts):
    with pytest.raises(ValueError, match="n_positions = 10000"):
        geolens.convergence(neox_bridge, neox_bridge, list(texts), k=4, n_positions=10_000, progress=False)
    with pytest.raises(ValueError, match="non-empty list"):
        geolens.convergence(neox_bridge, neox_bridge, [], k=4, progress=False)
    with pytest.raises(ValueError, match="k must be <"):
        geolens.convergence(neox_bridge, neox_bridge, list(texts), k=999, progress=False)
