import pytest

from eval.datasets import shared_data_dir
from lexical import WordOverlap


@pytest.fixture
def shared_env(monkeypatch):
    """KAIR_SHARED_DATA pointing at the benchmark samples, as a user sets it."""
    monkeypatch.setenv("KAIR_SHARED_DATA", str(shared_data_dir()))


@pytest.fixture
def word_overlap():
    return WordOverlap()
