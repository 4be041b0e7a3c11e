"""Ready-made models and texts that work offline (see :mod:`geolens.zoo.default`)."""

from geolens.zoo.default import TOPICS, default_model_path, default_texts, load_default_model

__all__ = ["TOPICS", "default_model_path", "default_texts", "load_default_model"]
