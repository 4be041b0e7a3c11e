"""Shared inputs for the lens tests."""

import pytest

from tests.conftest import CORPUS


@pytest.fixture(scope="session")
def train_texts():
    """The tiny tokenizer's corpus, repeated: enough windows for a few training steps."""
    return list(CORPUS) * 4
