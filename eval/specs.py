"""The one dataset-spec type: a benchmark split (or file) a command reads, and how its closed
corpus is made. `kair eval` (`datasets:`), `kair datagen` (`datasets:` of generate and silver)
and `kair demo` (`train_sets`, `dev_sets`) all read it; `NAME[:SPLIT|:FILE]` strings on every
command line and in the demo's lists go through `parse_dataset_arg`.

Only the split a spec names when none is given differs: the dev split for evaluation
(`DatasetSpec`), the train split for training data (`TrainSet`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kair_runtime.config import ConfigError


@dataclass
class DatasetSpec:
    name: str  # a loader in eval.datasets: hotpotqa, musique, 2wikimultihopqa, bamboogle, flashrag
    split: str = "dev"
    path: str | None = None  # a file in the benchmark's schema; None: the shared data's file for `split`
    limit: int | None = None  # the first N questions
    corpus: str | None = None  # a jsonl corpus; None: the closed corpus built from `corpus_from`
    corpus_from: list[str] = field(default_factory=list)  # "name:split" sources; [] = this dataset
    extra_corpus: list[str] = field(default_factory=list)  # extra corpus files (e.g. 2Wiki corpus_6119.json)

    @property
    def source(self) -> str:
        """What eval.corpus.load_source takes: the file, or the split."""
        return self.path or self.split

    @property
    def label(self) -> str:
        return self.name if self.split in ("dev", "test") else f"{self.name}-{self.split}"

    def capped(self, limit: int | None) -> int | None:
        """The questions to read when a run-wide limit applies too: the smaller of the two."""
        return min((n for n in (self.limit, limit) if n is not None), default=None)

    def corpus_sources(self) -> list[tuple[str, str]]:
        """The (name, split or file) pairs its closed corpus is the union of: `corpus_from`, else
        the file this spec reads."""
        if not self.corpus_from:
            return [(self.name, self.source)]
        return [parse_dataset_arg(s, "dev") for s in self.corpus_from]

    @classmethod
    def from_arg(cls, text: str, strict: bool = False) -> "DatasetSpec":
        """`musique` (this class's split), `musique:train`, or `musique:path/to/file.json`.
        strict: the part after the colon is required (the demo's lists)."""
        name, where = parse_dataset_arg(text, None if strict else cls.split)
        if is_split(name, where):
            return cls(name, split=where)
        if not Path(where).is_file():
            from eval.datasets import get_spec

            splits = ", ".join(sorted(get_spec(name).files)) or "none"
            raise ConfigError(f"dataset {text!r}: {where!r} is neither a {get_spec(name).name} split ({splits}) "
                              f"nor an existing file")
        return cls(name, path=where)


@dataclass
class TrainSet(DatasetSpec):
    """A training set: the same spec, the train split by default."""

    split: str = "train"


def parse_dataset_arg(text: str, default_split: str | None) -> tuple[str, str]:
    """`musique` -> (musique, default_split); `musique:train` or `musique:path/to/file.jsonl` as
    given. default_split None: the `:SPLIT` part is required."""
    name, _, where = text.strip().partition(":")
    if default_split is None and not (name and where):
        raise ConfigError(f"dataset {text!r} must look like name:split (e.g. musique:dev)")
    return name, where or default_split


def dataset_entries(arg: str, cls: type[DatasetSpec] = DatasetSpec, configured: list[dict] = ()) -> list[dict]:
    """A `--datasets a,b:SPLIT,c:FILE` flag as config entries: a bare name keeps the configured
    entry of that name (its corpus settings) or names the class's split; `:SPLIT` or `:FILE`
    sets that entry's split or file."""
    by_name = {d.get("name"): d for d in configured}
    entries = []
    for item in arg.split(","):
        name, where = parse_dataset_arg(item, "")
        entry = dict(by_name.get(name, {"name": name}))
        if where:
            spec = cls.from_arg(item)
            entry.update({"split": spec.split, "path": None} if spec.path is None else {"path": spec.path})
        entries.append(entry)
    return entries


def is_split(name: str, where: str) -> bool:
    """Whether `where` names one of the loader's local splits (else it is a file)."""
    from eval.datasets import SPLIT_ALIASES, get_spec

    return SPLIT_ALIASES.get(where, where) in get_spec(name).files
