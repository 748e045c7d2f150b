"""SFT data -> tiny LoRA SFT -> loss goes down -> checkpoints are adapters -> the runtime's hf
backend loads one -> the KAIR loop runs with it; and the merged model agrees with the adapter."""

from __future__ import annotations

import json

import pytest
import typer
from lexical import WordOverlap
from sft_helpers import ROOT, TINY_CONFIG, real_template, tiny_args
from typer.testing import CliRunner

from kair_runtime.config import LLMConfig, LoopConfig
from kair_runtime.llm.hf import HFBackend
from kair_runtime.loop import KairLoop
from kair_runtime.records import Question
from train.checks import check_adapter


def losses(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_loss_goes_down_and_validation_loss_is_logged(tiny_run):
    trainer, _ = tiny_run
    train_loss, eval_loss = losses(trainer, "loss"), losses(trainer, "eval_loss")
    print(f"tiny run: train loss {train_loss[0]:.3f} -> {train_loss[-1]:.3f}; "
          f"eval loss {eval_loss[0]:.3f} -> {eval_loss[-1]:.3f}")
    assert len(train_loss) == 10 and len(eval_loss) == 2  # logging every 2 steps, eval every 10
    assert train_loss[-1] < 0.9 * train_loss[0]
    assert eval_loss[-1] < eval_loss[0]


def test_a_resumed_run_keeps_its_own_save_and_eval_steps(tiny_run, qwen_real_dir, sft_data_dir, tmp_path):
    from train.sft import main

    _, first = tiny_run  # saved and evaluated every 10 steps
    args = tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--max_steps", "24", "--save_steps", "7",
                     "--eval_steps", "7", "--logging_steps", "7", "--per_device_train_batch_size", "2",
                     "--save_total_limit", "5", "--resume_from_checkpoint", str(first / "checkpoint-10"))
    trainer = main(*args)
    # Every 7 steps, then the final step; without the callback it would be every 10 (20, 24).
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-14", "checkpoint-21",
                                                                     "checkpoint-24"]
    evals = [e["step"] for e in trainer.state.log_history if "eval_loss" in e]
    assert evals[:3] == [10, 14, 21]  # step 10's came with the checkpoint
    assert trainer.state.global_step == 24


def test_init_adapter_goes_on_from_the_given_weights(tiny_run, qwen_real_dir, sft_data_dir, tmp_path):
    from safetensors.torch import load_file

    from train.sft import main

    trainer, first = tiny_run
    args = tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--init_adapter", str(first), "--max_steps", "2",
                     "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", "1")
    continued = main(*args)
    before, after = load_file(str(first / "adapter_model.safetensors")), load_file(str(tmp_path / "adapter_model.safetensors"))
    assert sorted(before) == sorted(after)
    # Two small steps from the trained weights: close to them, far from a fresh adapter (lora_B = 0).
    drift = max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
    scale = max(float(before[k].float().abs().max()) for k in before if "lora_B" in k)
    assert 0 < drift < scale
    # and the loss starts where the first run ended, not where it began
    start = losses(continued, "loss")[0]
    assert start < 0.9 * losses(trainer, "loss")[0]


def test_init_adapter_with_another_rank_is_an_error(tiny_run, qwen_real_dir, sft_data_dir, tmp_path):
    from train.sft import main

    _, first = tiny_run
    args = tiny_args(qwen_real_dir, sft_data_dir, tmp_path, "--init_adapter", str(first), "--lora_r", "8")
    with pytest.raises(ValueError, match=r"init_adapter .*: r=16 but the config has 8"):
        main(*args)


def test_every_checkpoint_is_a_checked_adapter_with_the_models_own_template(tiny_run, qwen_real_dir):
    _, out = tiny_run
    for ckpt in (out / "checkpoint-10", out / "checkpoint-20", out):
        report = check_adapter(ckpt)
        assert report.lora_b_max_abs > 0
        config = json.loads((ckpt / "adapter_config.json").read_text())
        assert sorted(config["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"])
        assert config["r"] == 16
        # the tokenizer saved with the adapter renders with the model's template, not the training one
        assert (ckpt / "chat_template.jinja").read_text() == real_template("qwen2")


def test_checkpoint_runs_the_kair_loop_through_the_hf_backend(tiny_run, qwen_real_dir):
    _, out = tiny_run
    llm = HFBackend.from_config(LLMConfig(backend="hf", model=str(qwen_real_dir), adapter=str(out / "checkpoint-20"),
                                          device="cpu", dtype="float32"))
    assert type(llm.model).__name__ == "Qwen2ForCausalLM"  # the adapter folded into the base weights
    assert llm.tokenizer.convert_ids_to_tokens(sorted(llm.eos_ids)) == ["<|im_end|>"]
    questions = [Question(id="q1", question="Lost! is a song by a British rock band formed in what year?"),
                 Question(id="q2", question="Which city was Oasis formed in?")]
    loop = KairLoop(llm, WordOverlap(), LoopConfig(max_steps=2, top_k=2, step_max_tokens=24, answer_max_tokens=8))
    traces = loop.run(questions)
    assert [t.question.id for t in traces] == ["q1", "q2"]
    for t in traces:
        assert t.error is None and 1 <= len(t.steps) <= 2 and t.stop_reason in ("sufficient", "max_steps")
        assert t.steps[0].retrieved and t.steps[0].completion_tokens > 0 and t.final_prompt


def test_merged_model_agrees_with_the_adapter(tiny_run, qwen_real_dir, tmp_path):
    from train.merge import merge_adapter

    _, out = tiny_run
    report = merge_adapter(str(qwen_real_dir), out, tmp_path / "merged")
    assert report.max_abs_diff <= 1e-4 * max(1.0, report.max_abs_logit)
    assert report.adapter_effect > 100 * report.max_abs_diff  # the agreement is not trivial
    merged = HFBackend.from_config(LLMConfig(model=str(tmp_path / "merged"), device="cpu", dtype="float32"))
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert merged.encode([{"role": "user", "content": "hi"}])  # a plain model dir with its tokenizer


def test_kair_train_command_runs_the_config_with_overrides(qwen_real_dir, sft_data_dir, tmp_path):
    from train.cli import train_command

    app = typer.Typer()
    app.command("train")(train_command)  # how kair_runtime.cli mounts a plain-function plugin
    app.command("noop")(lambda: None)  # two commands, so "train" is a subcommand as under `kair`
    result = CliRunner().invoke(app, [
        "train", "--config", str(TINY_CONFIG), "--set", f"model_name_or_path={qwen_real_dir}",
        "--set", f"dataset_path={sft_data_dir}", "--set", f"output_dir={tmp_path}",
        "--", "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no"])
    assert result.exit_code == 0, result.output
    assert check_adapter(tmp_path).tensors == 28
    assert json.loads((tmp_path / "adapter_config.json").read_text())["base_model_name_or_path"] == str(qwen_real_dir)


def test_accelerate_command_is_the_documented_launch():
    from train.cli import accelerate_command

    cmd = accelerate_command("configs/train/qwen2.5-7b-lora.yaml", "configs/accelerate/deepspeed_zero2.yaml",
                             ["--learning_rate", "1e-4"])
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[cmd.index("--config_file") + 1].endswith("zero2.yaml")
    assert cmd[-5].endswith("train/sft.py") and cmd[-4:] == ["--config", "configs/train/qwen2.5-7b-lora.yaml",
                                                             "--learning_rate", "1e-4"]


def test_kair_train_starts_one_process_per_gpu_where_the_accelerate_config_sets_no_count():
    from train.cli import accelerate_command, processes_for

    accel = ROOT / "configs" / "accelerate"
    assert processes_for(str(accel / "deepspeed_zero2.yaml"), None) == 1  # no GPU here: one process
    assert processes_for(str(accel / "deepspeed_zero2.yaml"), 4) == 4
    assert processes_for(str(accel / "cpu_multi.yaml"), None) is None  # its own 2
    cmd = accelerate_command("c.yaml", str(accel / "deepspeed_zero2.yaml"), [], 4)
    assert cmd[cmd.index("--num_processes") + 1] == "4" and cmd.index("--num_processes") < cmd.index("--config")


def test_bad_sft_rows_are_errors_naming_the_line(tmp_path):
    from train.sft import SFTDataError, read_messages_jsonl

    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "dangling"}]}
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SFTDataError, match=r"sft.jsonl:2: the last message must be the assistant turn"):
        read_messages_jsonl(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(SFTDataError, match=r"sft.jsonl:2: not valid JSON"):
        read_messages_jsonl(path)
    path.write_text(json.dumps(good) + "\n")
    assert read_messages_jsonl(path)[0] == good


def test_answer_repeats_repeat_the_training_answers_only(sft_data_dir, tmp_path):
    from datasets import load_from_disk

    from train.sft import KairSFTArguments, SFTDataError, load_sft_splits

    data = load_from_disk(str(sft_data_dir))
    kinds = data["train"]["kind"]
    answers = [m for m, k in zip(data["train"]["messages"], kinds) if k == "answer"]
    assert answers and len(answers) < len(kinds)
    plain_train, plain_eval = load_sft_splits(KairSFTArguments(dataset_path=str(sft_data_dir)), need_eval=True)
    train, evaluation = load_sft_splits(KairSFTArguments(dataset_path=str(sft_data_dir), answer_repeats=3),
                                        need_eval=True)
    assert train.column_names == evaluation.column_names == ["messages"]
    assert len(train) == len(kinds) + 2 * len(answers)
    assert train["messages"][:len(kinds)] == plain_train["messages"]  # the data, then the repeats
    assert train["messages"][len(kinds):] == answers * 2
    assert evaluation["messages"] == plain_eval["messages"]
    # without the kind column there is no telling which chats are answers
    jsonl = sft_data_dir / "sft_train.jsonl"
    with pytest.raises(SFTDataError, match="answer_repeats=3 needs the 'kind' column"):
        load_sft_splits(KairSFTArguments(dataset_path=str(jsonl), answer_repeats=3), need_eval=False)
