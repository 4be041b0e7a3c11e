"""Every seeded random stream of the package, in one registry (:data:`STREAMS`), and the one door to them.

A stream is named for what it draws (``"positions"``, ``"pairs"``, ...). :func:`rng` gives its
generator for a ``seed`` (``None`` seeds 0), of the library the stream is registered with: a NumPy
``Generator``, a ``torch.Generator`` (CPU) or a ``random.Random``. :func:`seeded_torch` seeds
torch's global generator for code that draws from it (a model's initialisation), and
:func:`derived_seed` gives the integer seed of a stream for a library that takes one
(scikit-learn's ``random_state``).

Each stream's generator is exactly the one its site made before the registry existed, so a seed
gives the same numbers as it always did. That is why the mixing differs by library: a NumPy stream
is ``default_rng([salt, seed * stride + part])``; a torch, Python or integer stream is seeded with
``seed * stride + part + salt``. ``part`` numbers the sub-streams of one seed (the second model of a
pair, an epoch, a resample). Streams with the same library, salt and stride draw the same numbers for
the same seed; :data:`SHARED_DRAWS` lists the ones that do, from before the registry (``"zoo batches"``
meets them at seed 0 only). A new stream takes a salt of its own.

Example:
    >>> rng(0, "pairs").integers(0, 100, size=3).tolist() == (
    ...     np.random.default_rng([0x9A17, 0]).integers(0, 100, size=3).tolist())
    True
    >>> torch.equal(torch.randperm(5, generator=rng(3, "positions")),
    ...             torch.randperm(5, generator=torch.Generator().manual_seed(3)))
    True
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from geolens._validation import check_int

__all__ = ["STREAMS", "SHARED_DRAWS", "Stream", "derived_seed", "rng", "seeded_torch"]

LIBRARIES = ("numpy", "torch", "python", "int")


@dataclass(frozen=True)
class Stream:
    """One seeded stream: the library of its generator, how its seed is mixed, what it draws.

    Attributes:
        library: ``"numpy"``, ``"torch"``, ``"python"`` (``random.Random``) or ``"int"`` (an integer seed
            for a library that takes one, through :func:`derived_seed`).
        draws: what the stream draws, and where.
        salt: NumPy: the first word of the seed sequence; otherwise added to the seed.
        stride: the seed is multiplied by it before ``part`` is added (sub-streams of one seed apart).
    """

    library: str
    draws: str
    salt: int = 0
    stride: int = 1

    def __post_init__(self) -> None:
        if self.library not in LIBRARIES:
            raise ValueError(f"a stream's library is one of {LIBRARIES}, got {self.library!r}")


# The one list of seeded streams. Salts and strides are those each site used before the registry
# (the same seed must give the same samples, study cells and test numbers): never change one.
STREAMS: dict[str, Stream] = {
    "positions": Stream("torch", "rows of a sample: token positions, aligned positions, lens rows "
                                 "(geolens._sampling.seeded_subset)"),
    "null subspaces": Stream("torch", "Haar-random subspaces of a null (geolens.metrics.grassmann); "
                                      "part 1: the second model's of a pair"),
    "pairs": Stream("numpy", "a uniform sample of point pairs (geolens.metrics._ranking.pairs)", salt=0x9A17),
    "text resamples": Stream("numpy", "the texts drawn by each bootstrap resample of PGA", salt=0xB007),
    "resample pairs": Stream("numpy", "the pair sample of PGA's bootstrap resample b, part b + 1", salt=0x9A17,
                             stride=1_000_003),
    "pair blocks": Stream("torch", "the permutation that deals sampled pairs into jackknife blocks "
                                   "(geolens.metrics.pga)", salt=0x5EED),
    "lens batches": Stream("torch", "the rows of each tuned-lens training batch (geolens.lens.fit)"),
    "articles": Stream("python", "a topic-stratified sample of the default texts (geolens.data.texts)"),
    "report texts": Stream("python", "the order of the report's text pool (geolens.report)"),
    "held-out articles": Stream("python", "the zoo's held-out articles, a fixed split (geolens.zoo.corpus)"),
    "zoo initialisation": Stream("torch", "a zoo model's initial weights, from torch's global generator "
                                          "(geolens.zoo.train)"),
    "zoo batches": Stream("torch", "the window order of training epoch e, part e (geolens.zoo.train)",
                          stride=100_003),
    "probe folds": Stream("int", "scikit-learn's shuffle of the stratified probe folds (geolens.metrics.probes)"),
}

# Streams that draw the same numbers for the same seed (same library, salt and stride): kept from
# before the registry, so that stored samples do not move. tests/test_rng.py checks this list.
SHARED_DRAWS: tuple[tuple[str, ...], ...] = (
    ("positions", "null subspaces", "lens batches", "zoo initialisation"),
    ("articles", "report texts", "held-out articles"),
)


def _stream(name: str, library: str | tuple[str, ...]) -> Stream:
    """The registered stream ``name``, checked to be of ``library`` (or one of them)."""
    if name not in STREAMS:
        raise KeyError(f"unknown random stream {name!r}; register it in geolens._rng.STREAMS "
                       f"(known: {', '.join(STREAMS)})")
    stream = STREAMS[name]
    wanted = (library,) if isinstance(library, str) else library
    if stream.library not in wanted:
        raise ValueError(f"the random stream {name!r} is a {stream.library} stream, not {' or '.join(wanted)}")
    return stream


def _mixed(seed: int | None, stream: Stream, part: int) -> int:
    """``seed * stride + part`` (``None`` seeds 0)."""
    seed = 0 if seed is None else check_int(seed, "seed", low=0)
    return seed * stream.stride + check_int(part, "part", low=0)


def derived_seed(seed: int | None, stream: str, part: int = 0) -> int:
    """The integer seed of a torch, Python or integer ``stream``: ``seed * stride + part + salt``.

    Example:
        >>> derived_seed(2, "zoo batches", part=1)
        200007
    """
    spec = _stream(stream, ("torch", "python", "int"))
    return _mixed(seed, spec, part) + spec.salt


def rng(seed: int | None, stream: str, part: int = 0) -> np.random.Generator | torch.Generator | random.Random:
    """The generator of ``stream`` for ``seed`` (and sub-stream ``part``), of the stream's library.

    NumPy: ``default_rng([salt, seed * stride + part])``; torch: a CPU ``torch.Generator`` seeded with
    :func:`derived_seed`; Python: ``random.Random`` of :func:`derived_seed`.

    Example:
        >>> rng(0, "articles").sample(range(10), 2) == random.Random(0).sample(range(10), 2)
        True
    """
    spec = _stream(stream, ("numpy", "torch", "python"))
    if spec.library == "numpy":
        return np.random.default_rng([spec.salt, _mixed(seed, spec, part)])
    if spec.library == "torch":
        return torch.Generator().manual_seed(derived_seed(seed, stream, part))
    return random.Random(derived_seed(seed, stream, part))


@contextlib.contextmanager
def seeded_torch(seed: int | None, stream: str) -> Iterator[None]:
    """Seed torch's global CPU generator with ``stream``'s seed for the block, then restore its state.

    For code that draws from the global generator and takes no ``generator`` (a model's
    ``__init__``); the caller's own random state is untouched afterwards.

    Example:
        >>> with seeded_torch(0, "zoo initialisation"):
        ...     a = torch.rand(2)
        >>> torch.equal(a, torch.rand(2, generator=torch.Generator().manual_seed(0)))
        True
    """
    _stream(stream, "torch")
    value = derived_seed(seed, stream)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(value)
        yield
