"""python tests/golden_diff.py [g1 g5 ...]

Runs the golden observations of tests/test_golden.py outside pytest and prints, per pin, a
unified diff of pinned vs observed values (pytest truncates large ones). It never writes the
pins: a pin changes only by hand, with a stated behaviour fix. Needs the project environment
(torch, transformers) and, for g2 g4 g5 g6, the benchmark samples ($KAIR_SHARED_DATA).
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


def main(wanted: list[str]) -> int:
    from kair_runtime.llm.tiny import build_tiny_chat_model

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
        if wanted and name.split("_")[0] not in wanted and not (name.startswith("g1") and "g3" in wanted):
            continue
        d = root / name.split("_")[0]
        d.mkdir(exist_ok=True)
        observed = run(d)
        pinned = tg.PINS[name]
        if observed == pinned:
            print(f"{name}: same")
            continue
        failed += 1
        a = json.dumps(pinned, indent=1, ensure_ascii=False).replace("\\n", "\n").splitlines()
        b = json.dumps(observed, indent=1, ensure_ascii=False).replace("\\n", "\n").splitlines()
        print(f"{name}: DIFFERS")
        print("\n".join(difflib.unified_diff(a, b, "pinned", "observed", lineterm="")))
    print(f"outputs under {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
