"""train/soup.py: the stacked adapter is exactly the average of its members, on a tiny Qwen2."""

from __future__ import annotations

import json

import pytest

from train.soup import SoupError, main, soup


def lora(base_dir, out, seed, r=4):
    """A LoRA adapter with random A and B (a trained one in all that matters here)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(out)
    return out


def merged_weights(base_dir, adapter):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return {k: v.clone() for k, v in PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict().items()}


def test_the_soup_is_the_members_average(qwen_real_dir, tmp_path):
    members = [lora(qwen_real_dir, tmp_path / f"a{i}", seed=i) for i in range(3)]
    dest = soup(members, tmp_path / "soup")
    config = json.loads((dest / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (12, 24)  # rank stacked, alpha / r kept
    assert json.loads((dest / "soup.json").read_text())["members"] == [str(m) for m in members]
    import torch

    each = [merged_weights(qwen_real_dir, m) for m in members]
    got = merged_weights(qwen_real_dir, dest)
    changed = 0
    for k, w in got.items():
        want = sum(e[k] for e in each) / 3
        torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-6)
        changed += not torch.equal(each[0][k], each[1][k])
    assert changed > 0  # the members differ, so the average is a real test


def test_members_of_another_shape_are_refused(qwen_real_dir, tmp_path):
    a = lora(qwen_real_dir, tmp_path / "a", seed=0)
    b = lora(qwen_real_dir, tmp_path / "b", seed=1, r=8)
    with pytest.raises(SoupError, match=r"differs from .* in r, lora_alpha"):
        soup([a, b], tmp_path / "soup")
    with pytest.raises(SystemExit, match="a soup needs at least two adapters"):
        main(["--adapters", str(a), "--out", str(tmp_path / "one")])
    with pytest.raises(SoupError, match="not a LoRA adapter folder"):
        soup([a, tmp_path], tmp_path / "soup")


def test_kair_soup_writes_the_soup(qwen_real_dir, tmp_path):
    from typer.testing import CliRunner

    from kair_runtime.cli import app, mount_plugins

    a, b = (lora(qwen_real_dir, tmp_path / n, seed=i) for i, n in enumerate("ab"))
    mount_plugins(app)
    res = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(tmp_path / "soup")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "soup" / "adapter_config.json").read_text())["r"] == 8
    again = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(tmp_path / "soup")])
    assert again.exit_code == 2 and "exists: choose a new --out" in again.output
