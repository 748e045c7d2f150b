"""Average LoRA adapters of one base into one adapter, exactly: a uniform model soup.

    python -m train.soup --adapters runs/demo/round-1/adapter runs/demo/round-2/adapter --out runs/soup
    kair soup runs/demo/round-1/adapter runs/demo/round-2/adapter --out runs/soup

Students trained on from one adapter (rounds.init continue) differ by as much as a retraining
moves them (docs/results.md); averaging their weights keeps what they share and cancels part of
what each drew at random (Wortsman et al., 2022, "Model soups").

Averaging the A and the B matrices separately would not average the adapters: (sum B)(sum A) has
cross terms. Stacking them along the rank does, exactly: with A = [A_1; ...; A_n] and
B = [B_1, ..., B_n] / n, B A = (1/n) sum B_i A_i. The soup is an ordinary LoRA adapter of rank n*r
whose lora_alpha is n times the members' (PEFT scales by alpha / r, which stays the same), so every
backend loads it like any adapter (vLLM: `llm.max_lora_rank` >= n*r, or merge it first with
train.merge). The members must share the base, the target modules, r and lora_alpha.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
# What must be equal across members for the stacked adapter to be their average.
SHARED = ("base_model_name_or_path", "peft_type", "target_modules", "r", "lora_alpha", "use_rslora", "use_dora",
          "modules_to_save", "rank_pattern", "alpha_pattern", "bias", "fan_in_fan_out")


class SoupError(ValueError):
    pass


def _config(adapter: Path) -> dict:
    path = adapter / CONFIG
    if not path.is_file() or not (adapter / WEIGHTS).is_file():
        raise SoupError(f"{adapter}: not a LoRA adapter folder (needs {CONFIG} and {WEIGHTS})")
    return json.loads(path.read_text())


def soup(adapters: list[str | Path], out: str | Path) -> Path:
    """Write the average of `adapters` to `out` (a new folder); return it."""
    import torch
    from safetensors.torch import load_file, save_file

    paths = [Path(a) for a in adapters]
    if len(paths) < 2:
        raise SoupError("a soup needs at least two adapters")
    dest = Path(out)
    if dest.exists():  # before reading any weights
        raise SoupError(f"{dest} exists: choose a new --out")
    configs = [_config(p) for p in paths]
    for p, c in zip(paths[1:], configs[1:]):
        differ = [k for k in SHARED if _norm(c.get(k)) != _norm(configs[0].get(k))]
        if differ:
            raise SoupError(f"{p} differs from {paths[0]} in {', '.join(differ)}: only adapters of one base "
                            "and one LoRA shape average exactly")
    if configs[0].get("peft_type") != "LORA" or configs[0].get("use_dora") or configs[0].get("modules_to_save") \
            or configs[0].get("rank_pattern") or configs[0].get("alpha_pattern"):
        raise SoupError(f"{paths[0]}: only plain LoRA adapters (no DoRA, modules_to_save, rank or alpha "
                        "patterns) can be stacked")
    states = [load_file(str(p / WEIGHTS)) for p in paths]
    keys = sorted(states[0])
    for p, s in zip(paths[1:], states[1:]):
        if sorted(s) != keys:
            raise SoupError(f"{p}: its weights are not the same modules as {paths[0]}'s")
    n = len(paths)
    merged = {}
    for k in keys:
        if ".lora_A." in k:  # (r, in): stacked along the rank
            merged[k] = torch.cat([s[k] for s in states], dim=0).contiguous()
        elif ".lora_B." in k:  # (out, r): stacked along the rank, each 1/n
            merged[k] = (torch.cat([s[k].float() for s in states], dim=1) / n).to(states[0][k].dtype).contiguous()
        else:
            raise SoupError(f"{paths[0]}: weight {k} is neither a lora_A nor a lora_B")
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # The tokenizer and chat template files travel with the adapter: the first member's.
    shutil.copytree(paths[0], tmp, ignore=lambda d, names: [x for x in names if x.startswith("checkpoint-")
                                                            or x in (WEIGHTS, CONFIG, "training_args.bin",
                                                                     "trainer_state.json", "README.md")])
    config = dict(configs[0], r=configs[0]["r"] * n, lora_alpha=configs[0]["lora_alpha"] * n)
    (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(merged, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / "soup.json").write_text(json.dumps({"members": [str(p) for p in paths], "weights": [1 / n] * n},
                                              indent=2) + "\n")
    tmp.replace(dest)
    return dest


def _norm(v):
    return sorted(v) if isinstance(v, list) else v


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", nargs="+", required=True, help="LoRA adapter folders of one base")
    ap.add_argument("--out", required=True, help="the soup's folder (must not exist)")
    args = ap.parse_args(argv)
    try:
        dest = soup(args.adapters, args.out)
    except (SoupError, OSError) as e:
        raise SystemExit(f"error: {e}")
    print(f"soup of {len(args.adapters)} adapters -> {dest}")


if __name__ == "__main__":
    main()
