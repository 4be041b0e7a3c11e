"""The zoo's offline corpus: BBC News split into train / held-out texts, a BPE tokenizer trained on it, token windows.

The zoo trains on the same 2,225 BBC News articles as the default text
(:func:`geolens.data.default_texts`), split once by a fixed seeded permutation:
:data:`HELD_OUT_FRACTION` of the articles are never trained on and serve the
analyses (and the tuned lenses) of :mod:`geolens.zoo.width_study`.

The tokenizer is a byte-level BPE (the GPT-2 / Pythia kind) trained with the
``tokenizers`` package on the training split only; ``<|endoftext|>`` is BOS,
EOS and the separator between articles, ``<pad>`` pads.

Example:
    >>> import tempfile
    >>> train, held_out = zoo_split()
    >>> len(train), len(held_out)
    (1914, 213)
    >>> with tempfile.TemporaryDirectory() as tmp:   # the zoo trains on all of train, with 4096 tokens
    ...     tokenizer = train_tokenizer(train[:50], 300, tmp)
    >>> windows = token_windows(tokenizer, train[:50], seq_len=64)
    >>> windows.shape
    torch.Size([1032, 65])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from geolens._rng import rng
from geolens._validation import check_float
from geolens.data.texts import default_texts

__all__ = ["EOS", "HELD_OUT_FRACTION", "PAD", "token_windows", "train_tokenizer", "zoo_split"]

EOS = "<|endoftext|>"
PAD = "<pad>"
HELD_OUT_FRACTION = 0.1
_SPLIT_SEED = 0  # fixed: the split is part of the corpus, not of a training run


def zoo_split(held_out_fraction: float = HELD_OUT_FRACTION) -> tuple[list[str], list[str]]:
    """``(train_texts, held_out_texts)``: every BBC News article in exactly one of them.

    The held-out articles are a fixed seeded sample (the same on every
    machine), returned in corpus order, as are the training ones. The corpus
    repeats some articles verbatim; each distinct text is kept once, so no
    held-out text is also trained on.

    Example:
        >>> train, held_out = zoo_split()
        >>> set(train) & set(held_out)
        set()
    """
    held_out_fraction = check_float(held_out_fraction, "held_out_fraction", low=0, high=1, low_open=True,
                                    high_open=True)
    texts = list(dict.fromkeys(default_texts(n=None)))  # drop verbatim repeats, keep corpus order
    n_held = max(1, round(held_out_fraction * len(texts)))
    held = set(rng(_SPLIT_SEED, "held-out articles").sample(range(len(texts)), n_held))
    train = [t for i, t in enumerate(texts) if i not in held]
    held_out = [t for i, t in enumerate(texts) if i in held]
    return train, held_out


def train_tokenizer(texts: Sequence[str], vocab_size: int, path: str | Path) -> Any:
    """Train a byte-level BPE tokenizer of ``vocab_size`` tokens on ``texts``; save it to ``path`` and return it.

    The result is a ``transformers`` fast tokenizer (``AutoTokenizer`` loads
    ``path`` back), with ``<|endoftext|>`` as BOS/EOS and ``<pad>`` as padding;
    TransformerLens boots it from the model folder. Training is deterministic.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     tok = train_tokenizer(["a small corpus", "of two texts"], 300, tmp)
        >>> tok.convert_ids_to_tokens(tok("a small").input_ids)   # byte-level: "Ġ" is the space
        ['a', 'Ġsmall']
        >>> tok.bos_token, tok.pad_token
        ('<|endoftext|>', '<pad>')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be at least 260 (256 bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=PAD)
    fast.save_pretrained(str(path))
    return fast


def token_windows(tokenizer: Any, texts: Sequence[str], seq_len: int) -> Int[Tensor, "n_windows seq_plus_1"]:
    """The texts as one stream (``<|endoftext|>`` before each), cut into windows of ``seq_len + 1`` tokens.

    Window ``i`` holds stream tokens ``[i * seq_len, (i + 1) * seq_len]``: inputs
    are its first ``seq_len`` tokens and next-token targets its last ``seq_len``,
    so consecutive windows share one token and every stream token is a target
    once. The ragged tail is dropped.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     tok = train_tokenizer(["one text", "another"], 300, tmp)
        >>> windows = token_windows(tok, ["one text", "another"], seq_len=2)   # 5 stream tokens
        >>> windows.shape
        torch.Size([2, 3])
        >>> bool((windows[1:, 0] == windows[:-1, -1]).all())   # consecutive windows share one token
        True
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    stream = torch.tensor([t for row in ids for t in (eos, *row)], dtype=torch.long)
    n = (stream.numel() - 1) // seq_len
    if n < 1:
        raise ValueError(f"the texts hold {stream.numel()} tokens, too few for one window of {seq_len + 1}")
    return stream[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len).contiguous()
