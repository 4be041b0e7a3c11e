"""The width zoo: a family of small GPT-NeoX models that differ only in width, trained offline.

:mod:`geolens.zoo.train` trains the family on the offline corpus
(:mod:`geolens.zoo.corpus`, a split of :func:`geolens.data.default_texts`) with
deterministic, resumable checkpoints; :mod:`geolens.zoo.width_study` studies PGA,
spectra and phases across widths and checkpoints. The offline default model and
texts live in :mod:`geolens.data`.

Example:
    >>> zoo = geolens.zoo.train_zoo(geolens.zoo.ZooConfig(widths=(64, 128), steps=200))   # trains for minutes  # doctest: +SKIP

    Below, ``zoo`` is a tiny trained family (one width, one layer, four steps; as in
    :func:`~geolens.zoo.train.train_zoo`'s example):

    >>> res = geolens.zoo.zoo_report(zoo, None, analyses=("pga",), n_texts=4, n_tokens=32, n_null=5, ccr=(0,),
    ...                              progress=False)   # out_dir=None: write nothing
    >>> res.params["widths"], res.params["steps"]
    ([16], [0, 4])
    >>> fig = res.plot()
"""

from geolens.zoo.corpus import token_windows, train_tokenizer, zoo_split
from geolens.zoo.members import zoo_member
from geolens.zoo.width_study import ZooReportSettings, ZooResult, zoo_report, zoo_study
from geolens.zoo.train import Zoo, ZooConfig, default_checkpoints, train_zoo

__all__ = [
    "Zoo",
    "ZooConfig",
    "ZooReportSettings",
    "ZooResult",
    "default_checkpoints",
    "token_windows",
    "train_tokenizer",
    "train_zoo",
    "zoo_member",
    "zoo_report",
    "zoo_split",
    "zoo_study",
]

