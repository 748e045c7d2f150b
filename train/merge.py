"""Merge a LoRA adapter into its base model and check that nothing changed but the packaging.

    python -m train.merge --base Qwen/Qwen2.5-7B-Instruct --adapter runs/train/qwen2.5-7b-lora/checkpoint-400 --out runs/merged
    kair merge --base ... --adapter ... --out ...

The adapter is applied with `merge_and_unload` (W + B A * alpha/r folded into W), then the merged
model's logits are compared with the unmerged PeftModel's on a few KAIR prompts (rendered with
the chat template, as the runtime sends them). The largest absolute difference is printed and
must stay within a tolerance relative to the largest logit; otherwise nothing is saved. The
adapted logits must also differ from the base's, or the comparison would prove nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

# Relative tolerance on max |merged - unmerged| / max(1, max |logit|), by dtype: fp32 merging
# only reorders float sums; 16-bit merging rounds the merged weight once.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MergeError(RuntimeError):
    pass


@dataclass
class MergeReport:
    out: str
    prompts: int
    max_abs_diff: float  # merged vs unmerged logits
    max_abs_logit: float
    adapter_effect: float  # max |adapted - base| logits: > 0 means the adapter does something
    tolerance: float  # relative, see TOLERANCE

    def summary(self) -> str:
        return (f"merged -> {self.out}: max |merged - unmerged| logit = {self.max_abs_diff:.3g} over "
                f"{self.prompts} prompts (max |logit| {self.max_abs_logit:.3g}, relative tolerance "
                f"{self.tolerance:g}); the adapter moves logits by up to {self.adapter_effect:.3g}")


def default_prompts(n: int = 3) -> list[list[dict[str, str]]]:
    """KAIR init prompts over the demo questions' supporting passages: what the student sees."""
    from kair_runtime.demo_data import load_demo_corpus, load_demo_questions
    from kair_runtime.prompts import PromptSet
    from kair_runtime.records import ScoredPassage

    prompts = PromptSet.load("kr")
    corpus = {p.id: ScoredPassage(id=p.id, title=p.title, text=p.text, score=1.0) for p in load_demo_corpus()}
    out = []
    for q in load_demo_questions("dev")[:n]:
        docs = [corpus[i] for i in q.metadata.get("supporting_ids", []) if i in corpus]
        out.append(prompts.init(q.question, docs))
    return out


def _batch(tokenizer, prompts, device):
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(e) for e in enc)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(enc):  # right padding; padded positions are excluded from the comparison
        ids[row, :len(e)] = torch.tensor(e)
        mask[row, :len(e)] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def _logits(model, ids, mask) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask).logits.float()[mask.bool()]


def merge_adapter(base: str, adapter: str | Path, out: str | Path, *, dtype: str = "float32",
                  device: str = "cpu", prompts: list[list[dict[str, str]]] | None = None,
                  tolerance: float | None = None) -> MergeReport:
    """Merge `adapter` into `base`, verify logits on `prompts`, save model + tokenizer to `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kair_runtime.llm.hf import resolve_model

    base = resolve_model(base)  # an embedded name (smollm2-135m) as the runtime and train.sft read it
    if dtype not in DTYPES:
        raise MergeError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    adapter = Path(adapter)
    tok_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype]).to(device)
    model = PeftModel.from_pretrained(model, adapter).eval()
    ids, mask = _batch(tokenizer, prompts or default_prompts(), device)

    adapted = _logits(model, ids, mask)
    with model.disable_adapter():
        plain = _logits(model, ids, mask)
    merged_model = model.merge_and_unload()
    merged = _logits(merged_model, ids, mask)

    tol = TOLERANCE[dtype] if tolerance is None else tolerance
    report = MergeReport(out=str(out), prompts=int(ids.shape[0]),
                         max_abs_diff=float((merged - adapted).abs().max()),
                         max_abs_logit=float(adapted.abs().max()),
                         adapter_effect=float((adapted - plain).abs().max()), tolerance=tol)
    print(report.summary())
    if report.max_abs_diff > tol * max(1.0, report.max_abs_logit):
        raise MergeError(f"merged and unmerged logits differ by {report.max_abs_diff:.3g}, over the tolerance "
                         f"{tol:g} x {max(1.0, report.max_abs_logit):.3g}; nothing was saved")
    if report.adapter_effect == 0.0:
        raise MergeError(f"{adapter}: the adapter does not change the base model's logits (untrained?); "
                         "nothing was saved")
    out = Path(out)
    merged_model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return report


def main(argv: list[str] | None = None) -> MergeReport:
    p = argparse.ArgumentParser(description="Merge a LoRA adapter into its base and verify the logits.")
    p.add_argument("--base", required=True, help="base model: hub name or local path")
    p.add_argument("--adapter", required=True, help="PEFT adapter dir (a training checkpoint dir works)")
    p.add_argument("--out", required=True, help="where to save the merged model and tokenizer")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerance", type=float, default=None, help="relative tolerance (default by dtype)")
    a = p.parse_args(argv)
    return merge_adapter(a.base, a.adapter, a.out, dtype=a.dtype, device=a.device, tolerance=a.tolerance)


if __name__ == "__main__":
    main()
