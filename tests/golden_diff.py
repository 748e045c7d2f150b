"""python tests/golden_diff.py [--write-files] [g1 g5 ...]

Runs the golden observations of tests/test_golden.py outside pytest and prints, per pin, what
differs from it: a unified diff of the values pinned inline in pins.json (pytest truncates large
ones) and every differing record of each golden file (tests/golden.py, record_diff; a failed test
shows only the first few). Without --write-files it writes nothing.

--write-files also writes each differing golden file of the named pins (every pin when none is
named) from the observation, for a stated behaviour fix; read `git diff tests/golden/` before
committing it. It never writes pins.json: its inline values change only by hand. Needs the
project environment (torch, transformers) and, for g2 g4 g5 g6, the benchmark samples
($KAIR_SHARED_DATA).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import test_golden as tg  # noqa: E402
from golden import GOLDEN_DIR, file_text, record_diff, split_files  # noqa: E402


def main(wanted: list[str], write_files: bool = False) -> int:
    from train.tiny_model import build_tiny_chat_model

    root = Path(tempfile.mkdtemp(prefix="golden-"))
    tiny = build_tiny_chat_model(root / "tiny", family="qwen2")
    g1_dir = root / "g1"
    g1_dir.mkdir()
    here = os.getcwd()

    def g7(r: Path):
        os.chdir(r)  # the test runs it in its tmp folder (see observe_g7)
        try:
            return tg.observe_g7(r, tiny)
        finally:
            os.chdir(here)

    runs = {"g1_silver_demo_bm25": lambda r: tg.observe_g1(g1_dir),
            "g2_silver_shared_kr": tg.observe_g2,
            "g3_sft": lambda r: tg.observe_g3(r, g1_dir / "silver-kr.jsonl"),
            "g4_teacher": tg.observe_g4, "g5_eval_scripted": tg.observe_g5,
            "g6_eval_tiny": lambda r: tg.observe_g6(r, tiny), "g7_demo_tiny": g7,
            "g8_ask": lambda r: tg.observe_g8()}
    failed = 0
    for name, run in runs.items():
        group = name.split("_")[0]
        named = not wanted or group in wanted
        if not named and not (group == "g1" and "g3" in wanted):  # g3 reads g1's kr silver
            continue
        d = root / group
        d.mkdir(exist_ok=True)
        observed = run(d)
        pinned = tg.PINS[name]
        rest, files = split_files(observed, pinned)
        differs = False
        for where, path, text in files:
            rel = path.relative_to(GOLDEN_DIR.parent.parent)
            label = f"{name}.{where}" if where else name
            diff = record_diff(text, file_text(path), None, None) if path.exists() else ["no such file"]
            if not diff:
                continue
            differs = True
            print(f"{label}: observed != {rel}")
            print("\n".join(diff))
            if write_files and named:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(text.encode("utf-8"))
                print(f"{label}: WROTE {rel}")
        if rest != pinned:
            differs = True
            a = json.dumps(pinned, indent=1, ensure_ascii=False).replace("\\n", "\n").splitlines()
            b = json.dumps(rest, indent=1, ensure_ascii=False).replace("\\n", "\n").splitlines()
            print(f"{name}: inline values differ from pins.json")
            print("\n".join(difflib.unified_diff(a, b, "pinned", "observed", lineterm="")))
        print(f"{name}: {'DIFFERS' if differs else 'same'}")
        failed += differs
    print(f"outputs under {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = [a for a in args if a.startswith("-")]
    if set(flags) - {"--write-files"}:
        sys.exit(f"usage: python tests/golden_diff.py [--write-files] [g1 g5 ...]; unknown {flags}")
    sys.exit(main([a for a in args if not a.startswith("-")], write_files="--write-files" in flags))
