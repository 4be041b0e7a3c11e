"""Linear probes on planted features: separable -> ~100 %, shuffled labels -> ~chance; folds stratified and seeded."""

import collections

import numpy as np
import pytest
import torch

from geolens.metrics.probes import probe_accuracy, probe_folds


def _separable(n_per_class=40, d=8, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, d, generator=g) * 6.0
    x = torch.cat([centres[c] + torch.randn(n_per_class, d, generator=g) for c in range(classes)])
    y = [c for c in range(classes) for _ in range(n_per_class)]
    return x, y


def test_separable_states_give_near_perfect_accuracy():
    x, y = _separable()
    score = probe_accuracy(x, y, folds=5)
    assert score["accuracy_mean"] >= 0.97
    assert score["chance"] == pytest.approx(0.25)


def test_shuffled_labels_give_about_chance():
    x, y = _separable(n_per_class=60)
    shuffled = list(np.random.default_rng(0).permutation(y))
    score = probe_accuracy(x, shuffled, folds=5)
    assert abs(score["accuracy_mean"] - 0.25) < 0.12


def test_folds_are_stratified_and_seeded():
    labels = ["a"] * 30 + ["b"] * 20 + ["c"] * 10
    splits = probe_folds(labels, folds=5, seed=3)
    for _, test in splits:
        assert collections.Counter(np.asarray(labels)[test]) == {"a": 6, "b": 4, "c": 2}
    again = probe_folds(labels, folds=5, seed=3)
    assert all(np.array_equal(t1, t2) for (_, t1), (_, t2) in zip(splits, again))
    other = probe_folds(labels, folds=5, seed=4)
    assert not all(np.array_equal(t1, t2) for (_, t1), (_, t2) in zip(splits, other))
    covered = np.sort(np.concatenate([test for _, test in splits]))
    assert np.array_equal(covered, np.arange(60))


def test_probe_errors():
    x, y = _separable()
    with pytest.raises(ValueError, match="labels for"):
        probe_accuracy(x, y[:-1])
    with pytest.raises(ValueError, match="single class"):
        probe_folds([1] * 10)
    with pytest.raises(ValueError, match="rarest class"):
        probe_folds([0] * 10 + [1] * 2, folds=5)
