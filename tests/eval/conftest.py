import pytest

from lexical import WordOverlap


@pytest.fixture
def word_overlap():
    return WordOverlap()
