"""The metrics' one pool of worker threads (the compiled kernels release the GIL, so rows run in parallel).

One thread a torch thread: the workers take the cores the BLAS products use between their turns.
A job submitted from inside a worker runs inline (:func:`in_worker`): waiting on the pool from the
pool could leave no worker to run it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch

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
    """Whether the calling thread is one of :func:`rank_pool`'s workers."""
    return threading.current_thread().name.startswith(_PREFIX)
