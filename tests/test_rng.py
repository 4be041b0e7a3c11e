"""The one registry of seeded streams (geolens._rng): each stream is the generator its site made before
the registry (same seed, same numbers), and streams with salts of their own draw apart."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from geolens._rng import SHARED_DRAWS, STREAMS, Stream, derived_seed, rng, seeded_torch

SEEDS = (0, 1, 7, 123456)

# Each stream's generator as its site wrote it out before the registry: (seed, part) -> generator.
LEGACY_NUMPY = {
    "pairs": lambda seed, part: np.random.default_rng([0x9A17, int(seed)]),
    "text resamples": lambda seed, part: np.random.default_rng([0xB007, int(seed)]),
    "resample pairs": lambda seed, part: np.random.default_rng([0x9A17, seed * 1_000_003 + part]),
}
LEGACY_TORCH = {
    "positions": lambda seed, part: torch.Generator().manual_seed(seed),
    "null subspaces": lambda seed, part: torch.Generator(device="cpu").manual_seed(seed + part),
    "pair blocks": lambda seed, part: torch.Generator().manual_seed(int(seed) + 0x5EED),
    "lens batches": lambda seed, part: torch.Generator().manual_seed(seed),
    "zoo batches": lambda seed, part: torch.Generator().manual_seed(seed * 100_003 + part),
}
LEGACY_PYTHON = {
    "articles": lambda seed, part: random.Random(seed),
    "report texts": lambda seed, part: random.Random(seed),
    "held-out articles": lambda seed, part: random.Random(seed),
}
LEGACY_INT = {"probe folds": lambda seed, part: int(seed)}
PARTS = {"null subspaces": (0, 1), "zoo batches": (0, 1, 5), "resample pairs": (1, 2, 50)}


def test_every_stream_has_its_legacy_form_here():
    legacy = {**LEGACY_NUMPY, **LEGACY_TORCH, **LEGACY_PYTHON, **LEGACY_INT, "zoo initialisation": None}
    assert sorted(legacy) == sorted(STREAMS)


@pytest.mark.parametrize("name", sorted(LEGACY_NUMPY))
@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_streams_draw_as_before(name, seed):
    for part in PARTS.get(name, (0,)):
        got = rng(seed, name, part=part)
        assert isinstance(got, np.random.Generator)
        assert np.array_equal(got.integers(0, 2**40, size=64), LEGACY_NUMPY[name](seed, part).integers(0, 2**40, size=64))


@pytest.mark.parametrize("name", sorted(LEGACY_TORCH))
@pytest.mark.parametrize("seed", SEEDS)
def test_torch_streams_draw_as_before(name, seed):
    for part in PARTS.get(name, (0,)):
        got = rng(seed, name, part=part)
        assert isinstance(got, torch.Generator) and got.device.type == "cpu"
        want = LEGACY_TORCH[name](seed, part)
        assert torch.equal(torch.randperm(97, generator=got), torch.randperm(97, generator=want))
        assert torch.equal(torch.randn(5, 3, generator=got, dtype=torch.float64),
                           torch.randn(5, 3, generator=want, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(LEGACY_PYTHON))
@pytest.mark.parametrize("seed", SEEDS)
def test_python_streams_draw_as_before(name, seed):
    got, want = rng(seed, name), LEGACY_PYTHON[name](seed, 0)
    assert isinstance(got, random.Random)
    assert got.sample(range(1000), 20) == want.sample(range(1000), 20)


@pytest.mark.parametrize("seed", SEEDS)
def test_integer_streams_and_the_global_generator_as_before(seed):
    assert derived_seed(seed, "probe folds") == LEGACY_INT["probe folds"](seed, 0)
    outside = torch.get_rng_state()
    with seeded_torch(seed, "zoo initialisation"):
        inside = torch.rand(8)
    assert torch.equal(torch.get_rng_state(), outside)  # the caller's global state is restored
    torch.manual_seed(seed)
    expected = torch.rand(8)
    torch.set_rng_state(outside)
    assert torch.equal(inside, expected)


def test_none_seeds_zero():
    assert torch.equal(torch.randperm(20, generator=rng(None, "positions")),
                       torch.randperm(20, generator=rng(0, "positions")))
    assert np.array_equal(rng(None, "pairs").integers(0, 100, 10), rng(0, "pairs").integers(0, 100, 10))


def _fingerprint(name, seed, part=0):
    """Four draws of the stream (the global-generator stream through a generator of its seed)."""
    library = STREAMS[name].library
    if name == "zoo initialisation":
        generator = torch.Generator().manual_seed(derived_seed(seed, name, part))
    else:
        generator = rng(seed, name, part=part)
    if library == "numpy":
        return tuple(generator.integers(0, 2**62, size=4).tolist())
    if library == "torch":
        return tuple(torch.randint(0, 2**62, (4,), generator=generator).tolist())
    return tuple(generator.getrandbits(62) for _ in range(4))


@pytest.mark.parametrize("seed", (3, 12))
def test_streams_with_their_own_salt_draw_apart(seed):
    """For one seed, every stream of a library draws its own numbers, except those SHARED_DRAWS lists
    (kept from before the registry); a new stream without a salt of its own fails this test."""
    groups: dict = {}
    for name, stream in STREAMS.items():
        if stream.library != "int":  # an integer seed for another library's generator
            groups.setdefault((stream.library, _fingerprint(name, seed)), []).append(name)
    shared = {frozenset(group) for group in groups.values() if len(group) > 1}
    assert shared == {frozenset(group) for group in SHARED_DRAWS}


def test_parts_of_one_seed_draw_apart():
    assert _fingerprint("null subspaces", 3, 0) != _fingerprint("null subspaces", 3, 1)
    assert _fingerprint("zoo batches", 3, 0) != _fingerprint("zoo batches", 3, 1)
    assert _fingerprint("resample pairs", 3, 1) != _fingerprint("resample pairs", 3, 2)


def test_a_stream_is_of_one_library_and_must_be_registered():
    with pytest.raises(KeyError, match="unknown random stream 'nope'.*register it"):
        rng(0, "nope")
    with pytest.raises(ValueError, match="'pairs' is a numpy stream, not torch"):
        seeded_torch(0, "pairs").__enter__()
    with pytest.raises(ValueError, match="'pairs' is a numpy stream"):
        derived_seed(0, "pairs")
    with pytest.raises(ValueError, match="'probe folds' is a int stream"):
        rng(0, "probe folds")
    with pytest.raises(ValueError, match="seed must be >= 0"):
        rng(-1, "positions")
    with pytest.raises(TypeError, match="seed must be an int"):
        rng(1.5, "pairs")
    with pytest.raises(ValueError, match="a stream's library is one of"):
        Stream("jax", "keys")
