"""Offline models and texts: the default model and text (:mod:`geolens.zoo.default`), and the width zoo.

The width zoo (:mod:`geolens.zoo.train`, :mod:`geolens.zoo.report`) trains a
family of small GPT-NeoX models that differ only in width on the offline corpus
(:mod:`geolens.zoo.corpus`) and studies PGA, spectra and phases across widths
and checkpoints.

Example:
    >>> zoo = geolens.zoo.train_zoo(geolens.zoo.ZooConfig(widths=(64, 128), steps=200))   # doctest: +SKIP
    >>> geolens.zoo.zoo_report(zoo).plot()                                                # doctest: +SKIP
"""

from geolens.zoo.corpus import token_windows, train_tokenizer, zoo_split
from geolens.zoo.default import TOPICS, default_model_path, default_texts, load_default_model
from geolens.zoo.report import ZooReportSettings, ZooResult, zoo_report
from geolens.zoo.train import Zoo, ZooConfig, default_checkpoints, train_zoo

__all__ = [
    "TOPICS",
    "Zoo",
    "ZooConfig",
    "ZooReportSettings",
    "ZooResult",
    "default_checkpoints",
    "default_model_path",
    "default_texts",
    "load_default_model",
    "token_windows",
    "train_tokenizer",
    "train_zoo",
    "zoo_report",
    "zoo_split",
]
