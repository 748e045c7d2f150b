"""Resuming a killed training run: `resume_from_checkpoint: last` picks the newest checkpoint the
Trainer finished saving, removes the unfinished ones, trains no step past max_steps, and logs
token counts that go on from the checkpoint's. (tests/test_faults.py kills real runs.)"""

from __future__ import annotations

import json
import shutil

import pytest
from sft_helpers import TINY_CONFIG, tiny_args

from train.sft import complete_checkpoint, last_checkpoint, main, resume_point


def fake_checkpoint(path, state: str | None):
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if state is not None:
        (path / "trainer_state.json").write_text(state)
    return path


def test_the_last_checkpoint_is_the_newest_whole_one(tmp_path):
    whole = json.dumps({"global_step": 4, "log_history": []})
    fake_checkpoint(tmp_path / "checkpoint-4", whole)
    fake_checkpoint(tmp_path / "checkpoint-10", whole)
    fake_checkpoint(tmp_path / "checkpoint-12", whole[:9])  # killed while writing its state
    fake_checkpoint(tmp_path / "checkpoint-14", None)  # killed before its state
    fake_checkpoint(tmp_path / "checkpoint-best", whole)  # not a step
    assert [complete_checkpoint(tmp_path / f"checkpoint-{n}") for n in (4, 10, 12, 14)] == [True, True, False, False]
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    assert last_checkpoint(tmp_path / "none") is None

    assert resume_point(None, str(tmp_path), tidy=True) is None
    assert (tmp_path / "checkpoint-12").exists()  # a run that does not resume leaves the folder alone
    assert resume_point("last", str(tmp_path), tidy=False) == str(tmp_path / "checkpoint-10")
    assert (tmp_path / "checkpoint-12").exists()  # only the main process removes
    with pytest.raises(ValueError, match=r"checkpoint-12: not a complete checkpoint .*use 'last'"):
        resume_point(str(tmp_path / "checkpoint-12"), str(tmp_path), tidy=True)
    assert resume_point("last", str(tmp_path), tidy=True) == str(tmp_path / "checkpoint-10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-4", "checkpoint-best"]
    assert resume_point("last", str(tmp_path / "empty"), tidy=True) is None  # nothing yet: from step 0


def state(out) -> dict:
    return json.loads((out / "trainer_state.json").read_text())


def test_a_run_killed_while_saving_its_final_model_resumes_without_a_step_more(qwen_real_dir, sft_data_dir, tmp_path):
    args = ("--max_steps", "4", "--save_steps", "2", "--eval_steps", "2", "--logging_steps", "1",
            "--per_device_train_batch_size", "2", "--resume_from_checkpoint", "last")
    main(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, *args))
    final = (tmp_path / "adapter_model.safetensors").read_bytes()
    tokens = [r["num_tokens"] for r in state(tmp_path)["log_history"] if "num_tokens" in r]
    # Killed while saving the final model: checkpoint-4 is whole, the output dir's state is not.
    (tmp_path / "trainer_state.json").write_text("{")
    (tmp_path / "adapter_model.safetensors").unlink()

    trainer = main(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, *args))
    assert trainer.state.global_step == 4 and not (tmp_path / "checkpoint-5").exists()
    assert (tmp_path / "adapter_model.safetensors").read_bytes() == final
    assert [r["num_tokens"] for r in state(tmp_path)["log_history"] if "num_tokens" in r] == tokens

    # Killed in the middle of checkpoint-4 instead: training goes on from checkpoint-2, and the
    # logged token counts go on from its (TRL would count from 0 again).
    shutil.rmtree(tmp_path / "checkpoint-4")
    fake_checkpoint(tmp_path / "checkpoint-4", None)
    trainer = main(*tiny_args(qwen_real_dir, sft_data_dir, tmp_path, *args))
    assert trainer.state.global_step == 4
    assert (tmp_path / "adapter_model.safetensors").read_bytes() == final
    assert [r["num_tokens"] for r in state(tmp_path)["log_history"] if "num_tokens" in r] == tokens


def kair_train(*flags: str):
    import typer
    from typer.testing import CliRunner

    from train.cli import train_command

    app = typer.Typer()
    app.command("train")(train_command)
    app.command("noop")(lambda: None)  # two commands, so "train" is a subcommand as under `kair`
    return CliRunner().invoke(app, ["train", "--config", str(TINY_CONFIG), *flags])


def test_data_and_resume_mistakes_are_one_line_from_kair_train(qwen_real_dir, sft_data_dir, tmp_path):
    from datasets import load_from_disk

    common = ["--set", f"model_name_or_path={qwen_real_dir}", "--set", f"output_dir={tmp_path / 'out'}",
              "--set", "max_steps=1"]
    # to-sft --validation-fraction 0 writes no validation split.
    only_train = tmp_path / "only-train"
    data = load_from_disk(str(sft_data_dir))
    del data["validation"]
    data.save_to_disk(str(only_train))
    res = kair_train("--set", f"dataset_path={only_train}", *common)
    assert res.exit_code == 2 and res.output.strip() == (
        f"error: {only_train}: no split 'validation'; it has ['train']: hold out some questions (kair datagen "
        "to-sft --validation-fraction), or set eval_strategy: no")
    # Every chat longer than max_length: none left to train on.
    res = kair_train("--set", f"dataset_path={sft_data_dir}", *common, "--set", "max_length=8")
    assert res.exit_code == 2 and "none of its 50 training chats is left after tokenization" in res.output
    res = kair_train("--set", f"dataset_path={sft_data_dir}", *common,
                     "--set", f"resume_from_checkpoint={tmp_path / 'checkpoint-3'}")
    assert res.exit_code == 2 and "checkpoint-3: not a complete checkpoint" in res.output
