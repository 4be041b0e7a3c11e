"""The ranking engine's one pool of worker threads, and the per-thread buffers its tasks reuse.

The compiled kernels release the GIL, so rows run in parallel. One worker a torch thread: the
workers take the cores the BLAS products use between their turns. A job submitted from inside a
worker runs inline (:func:`in_worker`): waiting on the pool from the pool could leave no worker to run it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import torch

__all__ = ["KEPT_SCRATCH_VALUES", "Scratch", "in_worker", "inline", "n_workers", "rank_pool", "scratch_for", "start_all"]

_PREFIX = "geolens-rank"


@lru_cache(maxsize=1)
def _made() -> tuple[ThreadPoolExecutor, int]:
    workers = max(1, torch.get_num_threads())
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_PREFIX), workers


def rank_pool() -> ThreadPoolExecutor:
    """The pool (made on first use, with as many workers as torch had threads then)."""
    return _made()[0]


def n_workers() -> int:
    """How many workers :func:`rank_pool` has."""
    return _made()[1]


def in_worker() -> bool:
    """Whether the calling thread is one of :func:`rank_pool`'s workers, or runs the pool's jobs itself
    (:func:`inline`): either way its jobs run inline."""
    return threading.current_thread().name.startswith(_PREFIX) or getattr(_inline, "on", False)


_inline = threading.local()


@contextmanager
def inline() -> Iterator[None]:
    """Within it, the calling thread runs the jobs it would give the pool itself: for callers that already
    keep every core busy with threads of their own (one thread a job, no hand-offs).

    Example:
        >>> with inline():
        ...     in_worker()
        True
        >>> in_worker()
        False
    """
    before = getattr(_inline, "on", False)
    _inline.on = True
    try:
        yield
    finally:
        _inline.on = before


def start_all(job: Callable[[int], object], n: int) -> Callable[[], None]:
    """Start ``job(0), ..., job(n - 1)`` in the pool, or run them now in the calling thread where its jobs run
    inline (:func:`in_worker`; waiting on the pool from the pool could leave no worker to run them); returns a
    function that waits until all are done (raising what a job raised).

    Example:
        >>> done = []
        >>> wait = start_all(done.append, 3)
        >>> wait(); sorted(done)
        [0, 1, 2]
    """
    if in_worker():
        for i in range(n):
            job(i)
        return lambda: None
    futures = [rank_pool().submit(job, i) for i in range(n)]

    def wait() -> None:
        for future in futures:
            future.result()

    return wait


class Scratch(threading.local):
    """Per-thread buffers, reused row after row (fresh large arrays cost page faults).

    Each task of the rank pool uses its thread's buffers only until it returns, so calls that
    share the pool can share the buffers.

    Example:
        >>> s = Scratch()
        >>> s.array("keys", 4, np.int64) is s.array("keys", 4, np.int64)
        True
    """

    def array(self, name: str, m: int, dtype: type) -> np.ndarray:
        """This thread's ``[m]`` buffer ``name`` of ``dtype``, made anew only when ``m`` or ``dtype`` changes."""
        buffers = self.__dict__.setdefault("buffers", {})
        if name not in buffers or buffers[name].shape[0] != m or buffers[name].dtype != dtype:
            buffers[name] = np.empty(m, dtype=dtype)
        return buffers[name]


# Rows of up to this many values share buffers kept from call to call (PGA comes in hundreds of calls,
# layer after layer, and the fresh pages of a small call's buffers are a visible part of its cost). Rows
# of more values get buffers that live for one call, so a large N holds no memory afterwards.
KEPT_SCRATCH_VALUES = 2**21
_kept_scratch = Scratch()


def scratch_for(m: int) -> Scratch:
    """The per-thread buffers for rows of ``m`` values: kept between calls when ``m`` is small, else fresh.

    Example:
        >>> scratch_for(10) is scratch_for(20), scratch_for(2**22) is scratch_for(2**22)
        (True, False)
    """
    return _kept_scratch if m <= KEPT_SCRATCH_VALUES else Scratch()
