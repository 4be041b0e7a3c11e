"""The on-disk format of the ``tuned-lens`` package (AlignmentResearch, Belrose et al. 2023), read and written.

See docs/methods.md §C.3.

A lens is a directory holding

* ``config.json`` — the fields of ``tuned_lens.nn.TunedLensConfig``:
  ``base_model_name_or_path``, ``d_model``, ``num_hidden_layers``, ``bias``,
  ``base_model_revision``, ``unembed_hash``, ``lens_type`` (``"linear_tuned_lens"``);
* ``params.pt`` — ``torch.save`` of ``layer_translators.state_dict()``, a ``ModuleList``
  of ``num_hidden_layers`` ``nn.Linear(d_model, d_model)``: keys ``"{i}.weight"``
  (``[d_model, d_model]``, ``[out, in]``) and ``"{i}.bias"``. A ``"layer_translators."``
  prefix is also accepted when reading.

Conventions (tuned-lens 0.2.0, ``nn/lenses.py`` and ``scripts/train_loop.py``):
``transform_hidden(h, i) = h + layer_translators[i](h)`` is applied to
``output_hidden_states[i]`` for ``i = 0..L-1`` (``0`` = the embedding output); the
last hidden state gets no translator (its logits are the model's own). That is
geolens's convention exactly: ``translators[l]`` maps layer ``l`` with
``T_l(h) = h + A_l h + b_l``, layer ``L`` is the identity, so weights copy over
index for index, unchanged.

``unembed_hash`` is tuned-lens's fingerprint of the unembedding: the SHA-256 of
numpy's ``array_str`` of ``W_U^T`` (``[V, d]``, float32) at one decimal.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from geolens._io import atomic_file, atomic_write_text, check_folder_target
from geolens._json import parse_json
from geolens._validation import DamagedFileError

__all__ = [
    "LENS_TYPE",
    "TL_CONFIG_FILE",
    "TL_PARAMS_FILE",
    "read_tuned_lens_dir",
    "unembed_hash",
    "write_tuned_lens_dir",
]

TL_CONFIG_FILE = "config.json"
TL_PARAMS_FILE = "params.pt"
LENS_TYPE = "linear_tuned_lens"
_PREFIX = "layer_translators."


def check_lens_shape(lens_shape: dict[str, Any], model_shape: dict[str, Any], what: str,
                     made_for: object = None) -> None:
    """Raise ``ValueError`` naming each size (``d_model``, layers, vocabulary) where a lens differs from the model.

    Example:
        >>> check_lens_shape({"d_model": 64, "n_layers": 2}, {"d_model": 64, "n_layers": 3}, "the lens", "tiny")
        Traceback (most recent call last):
        ...
        ValueError: the lens was made for another model shape (n_layers: lens 2 vs model 3); it was made for 'tiny'
    """
    mismatched = [f"{key}: lens {lens_shape.get(key)} vs model {expected}" for key, expected in model_shape.items()
                  if lens_shape.get(key) != expected]
    if mismatched:
        origin = "" if made_for is None else f"; it was made for {made_for!r}"
        raise ValueError(f"{what} was made for another model shape ({'; '.join(mismatched)}){origin}")


def unembed_hash(w_u: Tensor) -> str:
    """tuned-lens's fingerprint of an unembedding given as ``W_U`` ``[d_model, d_vocab]``.

    Example:
        >>> len(unembed_hash(torch.zeros(4, 10)))
        64
    """
    rows = w_u.detach().T.to(device="cpu", dtype=torch.float32).numpy()
    return hashlib.sha256(np.array_str(rows, precision=1).encode()).hexdigest()


def _config_int(config: dict[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {key} must be an int, got {value!r}")
    return value


def read_tuned_lens_dir(
    directory: str | Path, *, n_layers: int, d_model: int
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Read and check a tuned-lens directory for a model of ``n_layers`` blocks and width ``d_model``.

    Returns the config and the translator state as float32 CPU tensors keyed
    ``"{i}.weight"``/``"{i}.bias"`` (no bias keys when ``config["bias"]`` is false).

    Raises:
        FileNotFoundError: ``config.json`` or ``params.pt`` is missing.
        ValueError: naming the file: not a linear tuned lens, another ``d_model`` or
            layer count than the model's, missing/extra/misshapen/non-finite tensors;
            :class:`~geolens._validation.DamagedFileError` where a file is unreadable
            (not JSON, not a torch file, truncated).
    """
    directory = Path(directory)
    config_path, params_path = directory / TL_CONFIG_FILE, directory / TL_PARAMS_FILE
    if not config_path.is_file() or not params_path.is_file():
        raise FileNotFoundError(f"{directory} holds no tuned-lens lens (need {TL_CONFIG_FILE} and {TL_PARAMS_FILE})")
    remedy = f"the lens in {directory} is damaged: download or save it again"
    try:
        config = parse_json(config_path.read_text(), config_path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedFileError(f"{config_path} is not valid JSON ({err}); {remedy}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
    lens_type = config.get("lens_type", LENS_TYPE)
    if lens_type != LENS_TYPE:
        raise ValueError(f"{config_path}: lens_type is {lens_type!r}; only {LENS_TYPE!r} lenses can be read")
    check_lens_shape({key: _config_int(config, key, config_path) for key in ("d_model", "num_hidden_layers")},
                     {"d_model": d_model, "num_hidden_layers": n_layers}, f"the lens in {config_path}",
                     config.get("base_model_name_or_path"))
    bias = config.get("bias", True)
    if not isinstance(bias, bool):
        raise ValueError(f"{config_path}: bias must be true or false, got {bias!r}")
    for key in ("unembed_hash", "base_model_name_or_path", "base_model_revision"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ValueError(f"{config_path}: {key} must be a str or null, got {config[key]!r}")
    try:
        state = torch.load(params_path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip and OS errors of a truncated or foreign file
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DamagedFileError(f"{params_path} is not a readable torch state dict ({type(err).__name__}: "
                               f"{first[:200]}); {remedy}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{params_path} must hold a state dict, got {type(state).__name__}")
    state = {(k[len(_PREFIX):] if k.startswith(_PREFIX) else k): v for k, v in state.items()}
    shapes = {f"{i}.weight": (d_model, d_model) for i in range(n_layers)}
    if bias:
        shapes.update({f"{i}.bias": (d_model,) for i in range(n_layers)})
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"{params_path} does not hold the {n_layers} translators of its config "
                         f"(missing {missing[:4]}, unexpected {extra[:4]})")
    out = {}
    for key, shape in shapes.items():
        value = state[key]
        if not isinstance(value, Tensor) or not value.is_floating_point() or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{params_path}: {key} must be a float tensor of shape {shape}, got {got}")
        value = value.to(torch.float32)
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{params_path}: {key} has NaN or infinite entries")
        out[key] = value
    return config, out


def write_tuned_lens_dir(
    directory: str | Path,
    weights: list[Tensor],
    biases: list[Tensor],
    *,
    d_model: int,
    base_model_name_or_path: str,
    unembed_hash_value: str | None,
) -> Path:
    """Write ``config.json`` and ``params.pt`` as tuned-lens's ``TunedLens.save`` does (float32).

    ``weights[i]`` ``[d, d]`` (``[out, in]``) and ``biases[i]`` ``[d]`` are layer ``i``'s
    translator; ``bias`` is written as true. Each file is written atomically and nothing else in
    ``directory`` is touched; ``ValueError`` if ``directory`` is a file.
    """
    directory = check_folder_target(directory, "a tuned-lens lens")
    directory.mkdir(parents=True, exist_ok=True)
    state: dict[str, Tensor] = {}
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        state[f"{i}.weight"] = w.detach().to(device="cpu", dtype=torch.float32).contiguous()
        state[f"{i}.bias"] = b.detach().to(device="cpu", dtype=torch.float32).contiguous()
    with atomic_file(directory / TL_PARAMS_FILE) as tmp:
        torch.save(state, tmp)
    config = {
        "base_model_name_or_path": base_model_name_or_path,
        "d_model": int(d_model),
        "num_hidden_layers": len(weights),
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": unembed_hash_value,
        "lens_type": LENS_TYPE,
    }
    atomic_write_text(directory / TL_CONFIG_FILE, json.dumps(config, indent=1))
    return directory
