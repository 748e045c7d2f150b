"""The demo's settings: DemoConfig (what `kair demo --config configs/demo/*.yaml` reads), the
student's training settings, the checks run before any stage, and the claim on OUT/traces/."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.specs import DatasetSpec, TrainSet
from kair_runtime.config import AT_LEAST_1, NON_NEGATIVE, POSITIVE, ConfigError, LLMConfig, LoopConfig, Range, \
    RetrieverConfig, RuntimeConfig, check_ranges, load_config, to_dict
from kair_runtime.rundir import claim

QUESTIONS_FILE = "demo_questions.jsonl"
CORPUS_FILE = "demo_corpus.jsonl"


def _smoke_runtime() -> RuntimeConfig:
    # Compact prompts keep a CPU step to seconds: 3 passages of at most 40 words, short outputs.
    return RuntimeConfig(
        llm=LLMConfig(backend="hf", model="smollm2-135m", device="cpu", dtype="float32", batch_size=8),
        retriever=RetrieverConfig(kind="dense", encoder="minilm"),
        loop=LoopConfig(index_format="kr", max_steps=2, top_k=3, step_max_tokens=96, answer_max_tokens=16,
                        max_passage_words=40))


@dataclass
class TrainSettings:
    """The student's SFT run. The named settings below are the recipe's: the demo derives
    train/sft.py keys from them (steps -> max_steps and the logging cadence, save_steps -> the
    checkpoint and validation cadence, precision -> bf16 and the base's dtype). Every other
    train/sft.py key (TRL's SFTConfig and ModelConfig, KairSFTArguments) goes in `sft` and passes
    through to OUT/train.yaml as it is, so a training option needs no change here. The default is
    a handful of LoRA steps at a high rate: enough for the adapter to pick up the output layout,
    not to learn the task."""

    steps: int = 12
    learning_rate: float = 1.0e-3
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    batch_size: int = 4
    use_peft: bool = True  # false: full fine-tuning (a 135M model fits in CPU memory)
    lora_r: int = 16
    lora_alpha: int = 32
    max_length: int = 1024
    save_steps: int = 0  # > 0: a checkpoint and a validation loss every N steps
    seed: int = 0
    # float32 | bfloat16. bfloat16: the matmuls run in bf16 under autocast (AMX on recent Xeons);
    # with LoRA the frozen base is stored in bf16 and the adapter, its gradients and Adam states
    # stay float32; full fine-tuning keeps float32 weights (see pipeline/demo_train.train_yaml).
    precision: str = "float32"
    # A checkpoint dir of an earlier run with the same data: its weights, optimizer, scheduler step
    # and data position are restored and training goes on to `steps` (the schedule is over `steps`).
    resume_from_checkpoint: str | None = None
    # Any other train/sft.py key, e.g. {gradient_accumulation_steps: 2, lora_dropout: 0.05}; it wins
    # over what the demo derives. Its names are checked at load, its values when training parses them.
    sft: dict[str, Any] = field(default_factory=dict)

    def validate(self, where: str = "train") -> None:
        check_ranges(self, {"steps": AT_LEAST_1, "learning_rate": POSITIVE, "warmup_steps": NON_NEGATIVE,
                            "batch_size": AT_LEAST_1, "lora_r": AT_LEAST_1, "lora_alpha": AT_LEAST_1,
                            "max_length": AT_LEAST_1, "save_steps": NON_NEGATIVE}, where)
        if self.precision not in TRAIN_PRECISIONS:
            raise ConfigError(f"{where}.precision: {self.precision!r}; choose one of {', '.join(TRAIN_PRECISIONS)}")
        if self.sft:
            check_sft_keys(self.sft, f"{where}.sft")


# Where the demo keeps a run's files: set by the demo, never by a config.
DEMO_OWNED_SFT_KEYS = ("dataset_path", "eval_dataset_path", "output_dir", "model_name_or_path",
                       "training_chat_template", "init_adapter")


def check_sft_keys(keys: dict[str, Any], where: str) -> None:
    """Each key must be one train/sft.py takes (its three argument dataclasses) and not one the
    demo sets itself."""
    import dataclasses as dc

    from train.sft import KairSFTArguments
    from trl import ModelConfig, SFTConfig

    known = {f.name for cls in (KairSFTArguments, SFTConfig, ModelConfig) for f in dc.fields(cls)}
    for key in keys:
        if key in DEMO_OWNED_SFT_KEYS:
            raise ConfigError(f"{where}.{key}: the demo sets it (its run folder's layout); remove it")
        if key not in known:
            raise ConfigError(f"{where}.{key}: not a train/sft.py key (TRL's SFTConfig, ModelConfig or "
                              "KairSFTArguments)")


TRAIN_PRECISIONS = ("float32", "bfloat16")


@dataclass
class RoundSettings:
    """Rounds of expert iteration after the silver student (STaR, ReST-EM): round r's teacher is
    round r-1's student (round 0: the silver one) in the same loop; its greedy and sampled
    trajectories over the train questions pass the same answer-F1 filter, join the silver ones
    (one trajectory per question and retrieval path), and a new student is trained on them (from
    the base, or going on from round r-1's student), then evaluated like the first
    (pipeline/demo_rounds.py)."""

    count: int = 0  # rounds after the silver student; 0: silver only
    questions: int | None = None  # train questions a round's teacher runs on (seed train.seed + r); None: all
    samples: int = 2  # sampled trajectories per question, besides the greedy one
    temperature: float = 0.7
    backend: str | None = None  # the teacher's backend; None: runtime.llm's (vllm: the student merged first)
    # base: each round's student is a new one (train.steps from the base); continue: it goes on from
    # round r-1's student for train.steps more (a fresh schedule), so round r has trained r+1 times as long
    init: str = "base"
    steps: int | None = None  # training steps of each round's student; None: train.steps
    # all: the round's questions are drawn from every train question; unchained: only from those no
    # silver trajectory was kept for (the student's trajectories are then the only ones they have)
    focus: str = "all"
    # Also train on every step of the teacher's trajectories, each with the step its gold chain implies
    # for what that step had retrieved (data_gen/relabel.py, DAgger): the states the student reaches
    # itself, with the judgment and next query it should have written there.
    relabel: bool = False

    def validate(self, where: str = "rounds") -> None:
        check_ranges(self, {"count": NON_NEGATIVE, "questions": AT_LEAST_1, "samples": NON_NEGATIVE, "steps": AT_LEAST_1,
                            "temperature": Range(low=0, low_open=True)}, where)
        if self.backend not in (None, "hf", "vllm"):
            raise ConfigError(f"{where}.backend={self.backend!r}: the student teaches on hf or vllm (or null: "
                              "runtime.llm.backend)")
        if self.focus not in ("all", "unchained"):
            raise ConfigError(f"{where}.focus={self.focus!r}: all (every train question) or unchained (those "
                              "without a kept silver trajectory)")
        if self.init not in ("base", "continue"):
            raise ConfigError(f"{where}.init={self.init!r}: base (a new student each round) or continue (from "
                              "the previous round's student)")

# The runs stage 4 can compare, by name: (row label, method, tuned student?)
EVAL_RUNS: dict[str, tuple[str, str, bool]] = {"prompted-kair": ("prompted", "kair", False),
                                               "prompted-vanilla": ("prompted", "vanilla", False),
                                               "tuned-kair": ("tuned", "kair", True)}


def _dev_sets() -> list[DatasetSpec | str]:
    # A 2Wiki dev question's own paragraphs are a small corpus; the benchmark folder also ships the
    # paragraphs of a 1,000-question dev sample, which the closed corpus of 2Wiki dev includes.
    return ["hotpotqa:dev", "musique:dev",
            DatasetSpec("2wikimultihopqa", "dev", extra_corpus=["2wikimultihopqa/corpus_6119.json"])]


@dataclass
class DemoConfig:
    runtime: RuntimeConfig = field(default_factory=_smoke_runtime)  # llm.model is the student
    out_dir: str = "runs/demo"
    data_dir: str | None = None  # None: the embedded demo; else a demo-layout or benchmark folder
    # With a benchmark folder only: `name:split` strings or eval.specs mappings ({name, split, path, limit,
    # extra_corpus}); a split's file and relative extra_corpus paths are under data_dir. A string
    # naming the set of a mapping below takes its settings (2Wiki dev: its extra paragraphs).
    train_sets: list[TrainSet | str] = field(
        default_factory=lambda: ["hotpotqa:train", "musique:train", "2wikimultihopqa:train"])
    dev_sets: list[DatasetSpec | str] = field(default_factory=_dev_sets)
    teacher: LLMConfig | None = None  # an LLM whose KAIR trajectories join the silver ones
    min_f1: float = 1.0  # answer F1 a trajectory needs to become training data
    # Silver's final index also states an A-or-B question's outcome (data_gen.silver.SilverConfig.outcomes)
    silver_outcomes: bool = False
    train: TrainSettings = field(default_factory=TrainSettings)
    rounds: RoundSettings = field(default_factory=RoundSettings)
    validation_fraction: float = 0.1  # of the train questions, held out for the SFT validation split
    dev_limit: int | None = None  # the first N questions of each dev set (None: all)
    # Which EVAL_RUNS stage 4 runs; e.g. [tuned-kair] to measure the student alone (after a change to
    # the loop settings, in a new out_dir: OUT/traces/ refuses to resume under other settings).
    eval_runs: list[str] = field(default_factory=lambda: list(EVAL_RUNS))

    def validate(self, where: str = "") -> None:
        check_ranges(self, {"min_f1": Range(low=0, high=1), "validation_fraction": Range(low=0, high=1, high_open=True),
                            "dev_limit": AT_LEAST_1}, where)


# ---------------------------------------------------------------- checks, the traces' owner, loading


def check_config(cfg: DemoConfig) -> None:
    """The settings that would otherwise fail only at the training stage, after the index and data stages."""
    unknown = [name for name in cfg.eval_runs if name not in EVAL_RUNS]
    if unknown or not cfg.eval_runs:
        raise ConfigError(f"eval_runs: {unknown or 'empty'}; choose among {', '.join(EVAL_RUNS)}")
    if cfg.runtime.retriever.corpus:
        raise ConfigError("runtime.retriever.corpus: the demo searches each question set's own corpus; "
                          "use runtime.retriever.index_dir for one prebuilt index")
    t = cfg.train
    t.validate()  # a config built in code, not loaded (from_dict validates what it loads)
    if t.resume_from_checkpoint and not (Path(t.resume_from_checkpoint) / "trainer_state.json").is_file():
        raise ConfigError(f"train.resume_from_checkpoint: {t.resume_from_checkpoint} is not a trainer "
                          "checkpoint (no trainer_state.json)")


# Settings that may change between runs into one out_dir without invalidating its traces.
TRACE_NEUTRAL = ("out_dir", "dev_limit", "dev_sets", "eval_runs", "rounds")  # rounds: each claims its own folder
# How prompts are grouped into generate() calls. Neutral in float32, where greedy batched decoding
# equals one at a time (tests/kair_runtime/llm); not in bfloat16, where a row's rounding depends on
# the shape of the batch it is computed in, so another grouping can flip a near-tie token
# (docs/results.md, "bfloat16 on the CPU").
BATCHING = ("runtime.llm.batch_size", "runtime.loop.round_size")
# Merging the adapter into the weights: float32 traces are the unmerged model's (tests/kair_runtime/
# llm); bf16 ones are not, the merged weights being rounded once. Reusing a repeated step's output:
# in float32 the very output a fresh call writes; in bf16 a fresh call in another batch may differ.
FLOAT32_NEUTRAL = BATCHING + ("runtime.llm.merge_adapter", "runtime.loop.reuse_repeated_steps")


def trace_neutral(cfg: DemoConfig) -> tuple[str, ...]:
    return TRACE_NEUTRAL + (FLOAT32_NEUTRAL if cfg.runtime.llm.dtype == "float32" else ())


def claim_traces(cfg: DemoConfig, out: Path) -> None:
    """OUT/traces/ belongs to the settings that made it: resuming them under another loop, model or
    training setting would mix two runs in one table, so that is an error, not a resume."""
    claim(out / "traces", to_dict(cfg), DemoConfig, file="settings.yaml", neutral=trace_neutral(cfg),
          holds="traces made with other settings", hint="use another --out, or delete that folder to regenerate them")



def load_demo_config(config: str | None, overrides: list[str], **flags) -> DemoConfig:
    """YAML (optional), then `--set a.b=v`, then the explicit flags that were given."""
    keys = {"out": "out_dir", "data": "data_dir", "train_steps": "train.steps", "max_steps": "runtime.loop.max_steps",
            "model": "runtime.llm.model", "dev_limit": "dev_limit"}
    cfg = load_config(DemoConfig, config, overrides, {keys[k]: v for k, v in flags.items()})
    check_config(cfg)
    return cfg
