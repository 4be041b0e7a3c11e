"""geolens.probes on a tiny model: pooled features equal a direct computation; the result is usable."""

import pytest
import torch

import geolens
from geolens.analyses.probes import pooled_states
from geolens.sites import RESIDUAL_SITE


def test_mean_and_last_pooling_equal_direct_computation(neox_bridge, texts):
    texts = list(texts)
    layers, pooled = pooled_states(neox_bridge, texts, pooling="mean", batch_size=2, progress=False)
    _, last = pooled_states(neox_bridge, texts, pooling="last", batch_size=3, progress=False)
    states = geolens.capture(neox_bridge, texts, progress=False)  # every real token after the first
    for t in range(len(texts)):
        rows = states.batch_index == t
        torch.testing.assert_close(pooled[:, t], states[RESIDUAL_SITE][:, rows].mean(1))
        last_row = rows.nonzero()[-1, 0]
        torch.testing.assert_close(last[:, t], states[RESIDUAL_SITE][:, last_row])
    assert layers == list(range(neox_bridge.cfg.n_layers + 1))


def test_probes_on_tiny_model(neox_bridge, texts):
    texts = list(texts) * 4
    labels = [i % 2 for i in range(len(texts))]
    res = geolens.probes(neox_bridge, texts, labels, folds=2, progress=False)
    table = res.to_pandas()
    assert list(table.columns) == ["layer", "accuracy_mean", "accuracy_std", "chance"]
    assert len(table) == neox_bridge.cfg.n_layers + 1
    assert ((table.accuracy_mean >= 0) & (table.accuracy_mean <= 1)).all()
    pga = geolens.pga(neox_bridge, texts, k=4, n_null=4, n_tokens=None, progress=False)
    assert len(res.plot(pga_result=pga).data) == 4


def test_probe_argument_errors(neox_bridge, texts):
    with pytest.raises(ValueError, match="labels for"):
        geolens.probes(neox_bridge, list(texts), [0], progress=False)
    with pytest.raises(ValueError, match="pooling"):
        geolens.probes(neox_bridge, list(texts), [0, 1, 0], pooling="max", progress=False)
