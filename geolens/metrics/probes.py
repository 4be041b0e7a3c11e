"""Linear probes: held-out accuracy of a logistic-regression classifier on fixed features.

scikit-learn does the fitting (``StandardScaler`` + ``LogisticRegression``, lbfgs,
multinomial); folds are stratified and seeded (``StratifiedKFold``), so every fold
keeps the class proportions and a seed gives the same splits.

See docs/methods.md §E.5.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> x = torch.cat([torch.randn(20, 4) + 3, torch.randn(20, 4) - 3])
    >>> y = [0] * 20 + [1] * 20
    >>> probe_accuracy(x, y, folds=4)["accuracy_mean"]
    1.0
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from jaxtyping import Float

from geolens._rng import derived_seed
from geolens._validation import check_float_matrix, check_int

__all__ = ["probe_accuracy", "probe_folds"]


def probe_folds(labels: Sequence, folds: int = 5, seed: int | None = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified, shuffled, seeded ``(train_index, test_index)`` splits.

    See docs/methods.md §E.5.

    Example:
        >>> [len(test) for _, test in probe_folds([0, 0, 1, 1, 0, 1], folds=3)]
        [2, 2, 2]
    """
    from sklearn.model_selection import StratifiedKFold

    folds = check_int(folds, "folds", low=2)
    y = np.asarray(labels)
    _, counts = np.unique(y, return_counts=True)
    if counts.size < 2:
        raise ValueError("labels have a single class: nothing to probe")
    if counts.min() < folds:
        raise ValueError(f"the rarest class has {counts.min()} examples, fewer than folds = {folds}")
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=derived_seed(seed, "probe folds"))
    return list(splitter.split(np.zeros(len(y)), y))


def probe_accuracy(
    features: Float[torch.Tensor, "N d"],
    labels: Sequence,
    *,
    folds: int = 5,
    seed: int | None = 0,
    C: float = 1.0,
    max_iter: int = 2000,
) -> dict[str, object]:
    """Held-out accuracy of a linear probe over stratified folds.

    Returns ``accuracy_mean``, ``accuracy_std`` (over folds, ddof=0), the per-fold
    ``accuracies`` and ``chance`` (the majority-class rate).

    See docs/methods.md §E.5.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features = check_float_matrix(features, "features", min_rows=2)
    if len(labels) != features.shape[0]:
        raise ValueError(f"{len(labels)} labels for {features.shape[0]} feature rows")
    x = features.detach().to("cpu", torch.float64).numpy()
    y = np.asarray(labels)
    accuracies = []
    for train, test in probe_folds(y, folds, seed):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
        model.fit(x[train], y[train])
        accuracies.append(float((model.predict(x[test]) == y[test]).mean()))
    _, counts = np.unique(y, return_counts=True)
    return {
        "accuracy_mean": float(np.mean(accuracies)),
        "accuracy_std": float(np.std(accuracies)),
        "accuracies": accuracies,
        "chance": float(counts.max() / counts.sum()),
    }
