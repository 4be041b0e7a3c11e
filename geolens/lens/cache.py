"""A small-budget tuned lens trained once per (model, texts, budget) and cached on disk.

See docs/methods.md §C.4.

The cache folder is keyed by the model's name and shape, the training budget,
the seed and a hash of the training texts, so a changed input trains a new lens
and a rerun loads the saved one.

Example:
    >>> import os, tempfile
    >>> budget = dict(method="reference", max_steps=2, tokens_per_step=16, seq_len=8, progress=False)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     lens = cached_tuned_lens(model, texts * 4, cache_dir=tmp, **budget)   # trains and saves
    ...     again = cached_tuned_lens(model, texts * 4, cache_dir=tmp, **budget)  # loads the saved lens
    ...     sorted(os.listdir(lens.cache_dir))
    ['config.json', 'translators.safetensors']
    >>> again.cache_dir == lens.cache_dir, torch.equal(again.linear_map(0), lens.linear_map(0))
    (True, True)
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Sequence

from geolens._renames import renamed_keywords
from geolens._cache import cache_root
from geolens._io import check_folder_target
from geolens._validation import DamagedFileError
from geolens.lens.fit import DEFAULT_RIDGE, FAST_BUDGET, fit_tuned_lens
from geolens.lens.train import DEFAULT_SEQ_LEN, dtype_name, resolve_matmul_dtype, train_tuned_lens
from geolens.lens.tuned_lens import TunedLens
from geolens.model import Model, ModelAdapter, as_adapter

__all__ = ["LENS_METHODS", "SMALL_BUDGET", "cached_tuned_lens", "longer_budget"]

LENS_METHODS = ("fast", "reference")
# The reference recipe's small CPU budget: far below its 250 x 2^18 tokens, see docs/limits.md.
SMALL_BUDGET = {"max_steps": 25, "tokens_per_step": 128, "seq_len": DEFAULT_SEQ_LEN}
_REFERENCE_KEYS, _FAST_KEYS = ("max_steps", "tokens_per_step"), ("n_tokens", "max_steps", "max_seconds")
# The cache key spells the reference recipe's step count as 0.3.0 did, so its cached lenses are found.
_KEY_NAMES = {"reference": {"max_steps": "steps"}, "fast": {}}


def _cache_key(adapter: ModelAdapter, plan: dict) -> str:
    shape = {"model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model,
             "d_vocab": adapter.d_vocab, **plan}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(adapter.name).name or adapter.name  # a local path names the model by its folder
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return f"{safe}-L{adapter.n_layers}-d{adapter.d_model}-V{adapter.d_vocab}-{digest}"


def longer_budget(budget: dict | None, *, factor: int, steps_taken: int | None = None) -> dict:
    """``budget`` (a :func:`cached_tuned_lens` budget, with or without ``method``) for a lens trained ``factor``
    times as many steps; the rest (texts, positions, seed) unchanged, so the longer lens differs from the first
    by its training alone. Keys left out take their method's default.

    ``steps_taken``: the steps the first lens took, where it stopped before its budget (the fast method's time
    limit): the longer lens then gets ``factor`` times those. Its time limit (fast method) is ``2 * factor``
    times the first's, a safeguard that leaves the steps, not the machine's speed, to set how long it trains.

    Example:
        >>> longer_budget({"method": "fast", "n_tokens": 8192, "max_steps": 20, "max_seconds": 30.0}, factor=4,
        ...               steps_taken=17)
        {'method': 'fast', 'n_tokens': 8192, 'max_steps': 68, 'max_seconds': 240.0}
        >>> longer_budget({"method": "reference", "tokens_per_step": 64}, factor=2)["max_steps"]   # of SMALL_BUDGET's 25
        50
    """
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor must be a positive integer (times the training), got {factor!r}")
    out = dict(budget or {})
    fast = out.get("method", "fast") == "fast"
    defaults = FAST_BUDGET if fast else SMALL_BUDGET
    steps = out["max_steps"] if out.get("max_steps") is not None else defaults["max_steps"]
    out["max_steps"] = factor * (steps if steps_taken is None else min(steps, steps_taken))
    if fast:
        seconds = out["max_seconds"] if out.get("max_seconds") is not None else defaults["max_seconds"]
        out["max_seconds"] = 2 * factor * seconds
    return out


@renamed_keywords(train_texts="tokens", steps="max_steps")
def cached_tuned_lens(
    model: Model,
    tokens: Sequence[str],
    *,
    method: str = "fast",
    cache_dir: str | Path | None = None,
    max_steps: int | None = None,
    tokens_per_step: int | None = None,
    max_seconds: float | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    halves: bool = False,
    n_tokens: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> TunedLens:
    """A tuned lens for ``model`` trained on ``tokens``: loaded from the cache, else trained once and saved.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: the training texts, a list of str (their hash is part of the cache key).
        method: ``"fast"`` (:func:`geolens.lens.fit_tuned_lens`: closed form on captured states, KL
            refinement; budget ``n_tokens`` (positions trained on), ``max_steps``, ``max_seconds``,
            default :data:`FAST_BUDGET`) or ``"reference"`` (:func:`geolens.lens.train_tuned_lens`, the
            tuned-lens recipe; budget ``max_steps``, ``tokens_per_step``, default :data:`SMALL_BUDGET`).
        max_steps: either method's optimiser steps (the fast method may stop earlier on a plateau).
        cache_dir: where lenses are kept; default ``<cache root>/tuned_lens``
            (``$GEOLENS_CACHE`` or ``~/.cache/geolens``).
        seq_len: tokens per training window (both methods).
        seed: part of the key; the fast method's position sample.
        halves: (fast method) also fit a lens on each half of the texts from the same capture
            (``lens.halves``, see :func:`geolens.lens.fit_tuned_lens`); part of the key.
        progress: show the training bar.

    Returns:
        The lens; ``lens.cache_dir`` says where it is saved. A damaged cache entry (unreadable or
        half-written files) is trained again and saved over, with a warning. A budget key of the other method raises
        ``TypeError``. The fast method's time limit makes a lens depend on the machine's speed where
        it stops on time rather than on a plateau (``lens.training_info["stopped"]`` says which).
    """
    adapter = as_adapter(model)
    if method not in LENS_METHODS:
        raise ValueError(f"method must be one of {LENS_METHODS}, got {method!r}")
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be a list of str (the texts' hash is part of the cache key)")
    texts = list(tokens)
    if not texts:
        raise ValueError("tokens is empty: a tuned lens needs text to train on")
    given = {"tokens_per_step": tokens_per_step, "n_tokens": n_tokens, "max_steps": max_steps,
             "max_seconds": max_seconds}
    own, other = (_REFERENCE_KEYS, _FAST_KEYS) if method == "reference" else (_FAST_KEYS, _REFERENCE_KEYS)
    foreign = [k for k in other if k not in own and given[k] is not None]
    if foreign:
        raise TypeError(f"{foreign} belong to the other lens method; method={method!r} takes "
                        f"{list(_REFERENCE_KEYS if method == 'reference' else _FAST_KEYS)}")
    defaults = SMALL_BUDGET if method == "reference" else FAST_BUDGET
    budget = {k: (given[k] if given[k] is not None else defaults[k])
              for k in (_REFERENCE_KEYS if method == "reference" else _FAST_KEYS)}
    plan = {"method": method, **{_KEY_NAMES[method].get(k, k): v for k, v in budget.items()}, "seq_len": seq_len,
            "seed": seed, "train_texts_sha": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:12]}
    if method == "fast":
        plan["ridge"] = DEFAULT_RIDGE
        # The refinement's product dtype follows the machine (bf16 where native): a lens refined in
        # another dtype is another lens.
        plan["refine_dtype"] = dtype_name(resolve_matmul_dtype("auto", adapter.unembed_matrix("raw").device))
    if halves:
        if method != "fast":
            raise ValueError("halves=True needs method='fast' (the reference recipe trains each lens on its own)")
        plan["halves"] = True  # a lens cached without its halves is not reused for a call that wants them
    if method == "reference":  # keeps the keys of lenses cached before the fast method existed
        plan.pop("method")
    folder = (Path(cache_dir) if cache_dir is not None else cache_root() / "tuned_lens") / _cache_key(adapter, plan)
    check_folder_target(folder, "a cached tuned lens")  # before training, not after
    try:
        lens = TunedLens.load(folder, adapter)
    except (FileNotFoundError, DamagedFileError) as err:
        if isinstance(err, DamagedFileError):  # a cache entry is rebuilt, not a reason to stop
            warnings.warn(f"the cached tuned lens is damaged ({err}); training it again", UserWarning, stacklevel=2)
        if method == "reference":
            lens = train_tuned_lens(adapter, texts, seq_len=seq_len, progress=progress, **budget)
        else:
            lens = fit_tuned_lens(adapter, texts, seq_len=seq_len, seed=seed, halves=halves, progress=progress,
                                  **budget)
        lens.check_finite("the trained tuned lens")  # a diverged fit is reported, not cached
        lens.save(folder)
    lens.cache_dir = str(folder)
    return lens
