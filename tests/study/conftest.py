"""Tiny local models for the study tests: GPT-NeoX folders of several widths and depths (one tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import save_neox as save_tiny_neox

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song",
         "a fish swam under the bridge", "my friend reads a book every night"]
# Small budgets shared by the tests: every cell takes well under a second.
PGA = {"k": 4, "n_null": 6, "ccr": [0, 1]}
SPECTRUM = {"alpha_fit_range": (1, 8)}  # the embedding layer of these models has few distinct states
BUDGET = dict(n_tokens=20, seed=0)


def save_neox(path: Path, *, d_model: int = 16, n_layers: int = 2, seed: int = 0) -> Path:
    """A seeded GPT-NeoX (parallel residual) of the given width and depth, with the test tokenizer."""
    return save_tiny_neox(path, d_model=d_model, n_layers=n_layers, n_heads=max(1, d_model // 8), seed=seed)


@pytest.fixture(scope="session")
def family(tmp_path_factory) -> dict[str, Path]:
    """Four models: widths 16, 24, 32, 40 at depth 2 (different seeds), saved as Hugging Face folders."""
    root = tmp_path_factory.mktemp("study_family")
    return {f"w{d}": save_neox(root / f"w{d}", d_model=d, n_layers=2, seed=i) for i, d in enumerate((16, 24, 32, 40))}


@pytest.fixture(scope="session")
def depths(tmp_path_factory) -> dict[str, Path]:
    """One width (16) at depths 2, 3, 4."""
    root = tmp_path_factory.mktemp("study_depths")
    return {f"L{n}": save_neox(root / f"L{n}", d_model=16, n_layers=n, seed=n) for n in (2, 3, 4)}
