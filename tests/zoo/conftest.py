"""A tiny trained zoo family shared by the zoo tests (two widths, two layers, six steps)."""

from __future__ import annotations

import pytest

TINY = dict(widths=(16, 32), n_layers=2, d_head=8, vocab_size=300, seq_len=16, batch_size=4, steps=6,
            checkpoints=(0, 2, 4))


@pytest.fixture(scope="session")
def reference_zoo(tmp_path_factory):
    from geolens.zoo.train import ZooConfig, train_zoo

    return train_zoo(ZooConfig(**TINY), tmp_path_factory.mktemp("zoo") / "ref", progress=False)
