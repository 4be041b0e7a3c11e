"""Doctest namespace for ``pytest --doctest-modules geolens`` (lives at the repository root, not in the wheel).

Every docstring example in ``geolens/`` runs against these names:

* ``torch``, ``geolens``;
* ``model`` — a tiny seeded GPT-NeoX ``TransformerBridge`` (d_model 64, 2 layers,
  4 heads, vocabulary 200) saved to a temp folder and booted with
  ``boot_transformers``, with the word-level test tokenizer (built from
  ``tests.conftest.CORPUS``: no hub access);
* ``model_path`` — the folder ``model`` was booted from (``str``);
* ``adapter`` — ``geolens.as_adapter(model)``;
* ``texts`` — five short sentences the tokenizer knows;
* ``tokens`` — a ``[1, 6]`` id tensor ("the cat sat on the mat");
* ``states`` — ``geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=16)``;
* ``other_model`` — a second tiny GPT-NeoX bridge (d_model 32, another seed, same tokenizer);
* ``zoo`` — only in ``geolens.zoo`` doctests: a tiny trained zoo family
  (:data:`DOCTEST_ZOO`) in a temp folder.

The models are built once per session and only when a doctest runs: the fixture
is autouse but does nothing for ordinary tests. Examples must not edit the
models. ``GEOLENS_CACHE`` points to a temp folder during doctests, so no example
writes into the user's cache.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path
from typing import Any

import pytest

DOCTEST_D_MODEL = 64  # the examples' expected shapes (e.g. torch.Size([3, 4, 64])) depend on it
# The zoo of the geolens.zoo examples: one width, one layer, four steps (seconds on a CPU).
DOCTEST_ZOO = dict(widths=(16,), n_layers=1, d_head=8, vocab_size=260, seq_len=8, batch_size=2, steps=4)


def _save_doctest_neox(path: Path, d_model: int = DOCTEST_D_MODEL, seed: int = 0) -> Path:
    """A seeded GPT-NeoX (parallel residual, 2 layers, vocab 200) and the test tokenizer in ``path``."""
    from tests.conftest import save_neox

    return save_neox(path, d_model=d_model, seed=seed)


@pytest.fixture(scope="session")
def _doctest_objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The names every geolens doctest sees (built once per session)."""
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    import geolens
    from tests.conftest import CORPUS, warm_up

    path = _save_doctest_neox(tmp_path_factory.mktemp("doctest_neox"))
    model = warm_up(TransformerBridge.boot_transformers(str(path), device="cpu").eval())
    other_path = _save_doctest_neox(tmp_path_factory.mktemp("doctest_neox_other"), d_model=32, seed=1)
    other_model = warm_up(TransformerBridge.boot_transformers(str(other_path), device="cpu").eval())
    texts = list(CORPUS)
    tokens = model.to_tokens("the cat sat on the mat")
    torch.manual_seed(0)
    states = geolens.capture(model, texts, sites=("resid_post", "final"), n_tokens=16, progress=False)
    return {
        "torch": torch,
        "geolens": geolens,
        "model": model,
        "model_path": str(path),
        "adapter": geolens.as_adapter(model),
        "texts": texts,
        "tokens": tokens,
        "states": states,
        "other_model": other_model,
    }


@pytest.fixture(scope="session")
def _doctest_zoo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny trained zoo family (``DOCTEST_ZOO``) for the ``geolens.zoo`` examples."""
    from geolens.zoo import ZooConfig, train_zoo

    return train_zoo(ZooConfig(**DOCTEST_ZOO), tmp_path_factory.mktemp("doctest_zoo") / "family", progress=False)


@pytest.fixture(autouse=True)
def _geolens_doctest_namespace(request: pytest.FixtureRequest) -> None:
    """Fill pytest's ``doctest_namespace`` for doctest items; a no-op for ordinary tests."""
    from _pytest.doctest import DoctestItem

    if not isinstance(request.node, DoctestItem):
        return
    cache = request.getfixturevalue("tmp_path_factory").getbasetemp() / "geolens_cache"
    request.getfixturevalue("monkeypatch").setenv("GEOLENS_CACHE", str(cache))
    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(request.getfixturevalue("_doctest_objects"))
    if request.node.dtest.name.startswith("geolens.zoo"):
        namespace["zoo"] = request.getfixturevalue("_doctest_zoo")
