"""What `kair eval` makes of its inputs: the corpus of the file evaluated, a prebuilt index, a
cached corpus that must match its sources, and bad files (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eval.corpus import build_corpus
from eval.datasets import DatasetError, load_dataset, shared_data_dir
from eval.cli import eval_app
from eval.run import DatasetSpec, EvalConfig, run_corpus, run_eval
from kair_runtime.config import LLMConfig, LoopConfig, RetrieverConfig, RuntimeConfig, save_config
from kair_runtime.jsonl import recover
from kair_runtime.retrieval import CorpusError
from kair_runtime.retrieval.cli import index_app

DATA = shared_data_dir()
pytestmark = pytest.mark.skipif(not (DATA / "hotpotqa").exists(), reason=f"benchmark samples not found at {DATA}")


def config(**kw) -> EvalConfig:
    runtime = RuntimeConfig(llm=LLMConfig(backend="scripted"), retriever=RetrieverConfig(kind="bm25"),
                            loop=LoopConfig(max_steps=2, top_k=3))
    base = dict(runtime=runtime, limit=3, methods=["vanilla"], datasets=[DatasetSpec("musique")])
    base.update(kw)
    return EvalConfig(**base)


def hotpot_lines(n: int) -> list[str]:
    return _lines(DATA / "hotpotqa" / "dev_distractor_500.jsonl", n)


# ---------------------------------------------------------------- 1. the corpus of the file evaluated


def test_a_dataset_given_by_path_is_retrieved_from_its_own_paragraphs(tmp_path):
    # HotpotQA train questions: none of their paragraphs is in the default (dev) file's corpus.
    spec = DatasetSpec("hotpotqa", path=str(DATA / "hotpotqa" / "train_100.json"))
    corpus = run_corpus(spec, tmp_path / "corpora")
    assert "train_100" in corpus.name
    rows = run_eval(config(datasets=[spec], limit=5), tmp_path / "run", progress=False)
    recall = rows[0]["summary"]["recall"]
    assert recall["questions_with_gold"] == 5
    # On the old code the gold paragraphs were all missing from the corpus: recall 0.
    assert recall["first_query"] > 30


# ---------------------------------------------------------------- 2. a prebuilt index


def test_eval_retrieves_from_a_prebuilt_index(tmp_path):
    corpus = tmp_path / "musique.jsonl"
    build_corpus([("musique", "dev")], out=corpus)
    index = tmp_path / "index"
    res = CliRunner().invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(index), "--retriever", "bm25"])
    assert res.exit_code == 0, res.output
    cfg = config()
    cfg.runtime.retriever.index_dir = str(index)
    run = tmp_path / "run"
    rows = run_eval(cfg, run, progress=False)
    assert not (run / "corpora").exists()  # no closed corpus was built
    assert yaml.safe_load((run / "config.yaml").read_text())["runtime"]["retriever"]["index_dir"] == str(index)
    indexed = {json.loads(line)["id"] for line in (index / "passages.jsonl").read_text().splitlines()}
    traces = recover(next(run.rglob("traces.jsonl")))
    retrieved = {p["id"] for t in traces for s in t["steps"] for p in s["retrieved"]}
    assert retrieved and retrieved <= indexed
    assert rows[0]["summary"]["recall"]["questions_with_gold"] == 3 and rows[0]["summary"]["recall"]["first_query"] > 0


def test_datasets_evaluated_over_one_index_load_it_once(tmp_path, monkeypatch):
    import kair_runtime.runtime as runtime

    corpus = tmp_path / "musique.jsonl"
    build_corpus([("musique", "dev")], out=corpus)
    index = tmp_path / "index"
    CliRunner().invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(index), "--retriever", "bm25"])
    built = []
    real = runtime.build_retriever
    monkeypatch.setattr(runtime, "build_retriever", lambda rc, **kw: built.append(rc) or real(rc, **kw))
    cfg = config(datasets=[DatasetSpec("musique"), DatasetSpec("hotpotqa"), DatasetSpec("2wikimultihopqa")])
    cfg.runtime.retriever.index_dir = str(index)
    rows = run_eval(cfg, tmp_path / "run", progress=False)
    assert len(rows) == 3 and len(built) == 1  # it was one copy of the whole index per dataset


def test_an_index_and_a_dataset_corpus_together_are_refused(tmp_path):
    cfg = config(datasets=[DatasetSpec("musique", corpus_from=["hotpotqa:dev"])])
    cfg.runtime.retriever.index_dir = str(tmp_path / "index")
    with pytest.raises(ValueError, match="set one of the two"):
        run_eval(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_configured_retriever_corpus_wins_over_the_dataset_corpus(tmp_path):
    # runtime.retriever_over's rule, as in ask, the teacher, silver and serve: index_dir, then
    # retriever.corpus, then the dataset's closed corpus (not built when not used).
    corpus = tmp_path / "musique.jsonl"
    build_corpus([("musique", "dev")], out=corpus)
    cfg = config()
    cfg.runtime.retriever.corpus = str(corpus)
    run = tmp_path / "run"
    rows = run_eval(cfg, run, progress=False)
    assert not (run / "corpora").exists()
    given = {json.loads(line)["id"] for line in corpus.read_text().splitlines()}
    traces = recover(next(run.rglob("traces.jsonl")))
    assert {p["id"] for t in traces for s in t["steps"] for p in s["retrieved"]} <= given
    assert rows[0]["summary"]["recall"]["questions_with_gold"] == 3
    cfg.datasets = [DatasetSpec("musique", corpus_from=["hotpotqa:dev"])]
    with pytest.raises(ValueError, match="runtime.retriever.corpus names a corpus to retrieve from; set one of the two"):
        run_eval(cfg, tmp_path / "run2", progress=False)


def test_eval_flags_override_the_file_and_set(tmp_path):
    from eval.cli import load_eval_config

    path = tmp_path / "e.yaml"
    path.write_text("runtime: {llm: {model: from-yaml}}\nmethods: [kair]\n"
                    "datasets: [{name: musique, split: dev, corpus_from: ['hotpotqa:dev']}]\n", encoding="utf-8")
    cfg = load_eval_config(str(path), ["runtime.llm.model=from-set", "limit=4"], model="from-flag", adapter=None,
                           checkpoints=None, datasets="musique,hotpotqa", methods="kair,vanilla", limit=None,
                           run_name="r", out_dir=None)
    assert (cfg.runtime.llm.model, cfg.limit, cfg.run_name, cfg.methods) == ("from-flag", 4, "r", ["kair", "vanilla"])
    # a bare name keeps the configured entry (with its corpus settings); a new one gets the dev split
    assert [(d.name, d.split, d.corpus_from) for d in cfg.datasets] == [("musique", "dev", ["hotpotqa:dev"]),
                                                                        ("hotpotqa", "dev", [])]


def test_the_demo_retrieves_from_a_prebuilt_index(tmp_path):
    from pipeline.demo_config import DemoConfig
    from pipeline.demo_sets import benchmark_sets

    index = tmp_path / "index"
    corpus = tmp_path / "c.jsonl"
    build_corpus([("musique", "dev")], out=corpus)
    CliRunner().invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(index), "--retriever", "bm25"])
    cfg = DemoConfig(data_dir=str(DATA), train_sets=["musique:train"], dev_sets=["musique:dev"], dev_limit=2)
    cfg.runtime.retriever = RetrieverConfig(kind="bm25", index_dir=str(index))
    train, dev = benchmark_sets(cfg, tmp_path / "out")
    assert train.corpus == dev[0].corpus == index / "passages.jsonl"
    assert not (tmp_path / "out" / "corpora").exists()
    assert all(not i.startswith("missing:") for ids in dev[0].gold.values() for i in ids)


# ---------------------------------------------------------------- 3. derived files: atomic, and tied to their sources


def test_an_interrupted_write_leaves_no_file(tmp_path):
    from kair_runtime.jsonl import atomic_write

    path = tmp_path / "corpus.jsonl"
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path) as f:
            f.write('{"id": "1"}\n')
            raise KeyboardInterrupt  # as if killed halfway
    assert list(tmp_path.iterdir()) == []


def test_a_cached_corpus_is_reused_only_for_the_same_sources(tmp_path):
    from eval.corpus import cached_corpus

    data = tmp_path / "h.jsonl"
    data.write_text("\n".join(hotpot_lines(3)) + "\n", encoding="utf-8")
    out = tmp_path / "cache" / "h.jsonl"
    cached_corpus([("hotpotqa", str(data))], [], out)
    built = out.read_text()
    assert cached_corpus([("hotpotqa", str(data))], [], out) == out and out.read_text() == built
    data.write_text("\n".join(hotpot_lines(4)) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"built from other sources \(changed since: .*h\.jsonl\)"):
        cached_corpus([("hotpotqa", str(data))], [], out)


def test_a_resumed_eval_refuses_a_corpus_left_by_a_killed_build(tmp_path):
    # The reproduction: a kill left a few paragraphs of the corpus, and the rerun used them.
    from eval.corpus import SOURCES_SUFFIX

    cfg = config()
    run_eval(cfg, tmp_path / "run", progress=False)
    corpus = next((tmp_path / "run" / "corpora").glob("*.jsonl"))
    lines = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[:26]))
    Path(str(corpus) + SOURCES_SUFFIX).unlink()  # an older build kept no record of its sources
    with pytest.raises(CorpusError, match="has no record of its sources; delete it"):
        run_eval(cfg, tmp_path / "run", progress=False)


# ---------------------------------------------------------------- 4. bad input files, through the CLI

IRCOT = json.dumps({"question_id": "q1", "question_text": "Who?", "answers_objects": [{"spans": ["x"]}],
                    "contexts": []})
BAD_CASES = ["truncated line", "missing field", "an IRCoT record", "non-UTF-8", "an empty file", "a duplicate id",
             "HotpotQA read as Bamboogle", "2Wiki read as HotpotQA"]


def bad_file(case: str) -> tuple[bytes, str, str]:
    """(file bytes, dataset named, message fragment); read here, not at import, so a machine
    without the samples skips instead of failing collection."""
    good = hotpot_lines(3)
    first = json.loads(good[0])
    return {
        "truncated line": ("\n".join([good[0], good[1][:200], good[2]]).encode(), "hotpotqa",
                           "h.jsonl:2: malformed hotpotqa record: not valid JSON"),
        "missing field": ("\n".join([good[0], json.dumps({k: v for k, v in first.items() if k != "answer"}
                                                         | {"_id": "x"})]).encode(),
                          "hotpotqa", "h.jsonl:2: malformed hotpotqa record: missing key 'answer'"),
        "an IRCoT record": (IRCOT.encode(), "hotpotqa", "h.jsonl:1: malformed hotpotqa record: has 'answers_objects'"),
        "non-UTF-8": ("\n".join(good[:2]).encode() + b"\n" + good[2].encode("utf-8").replace(b"a", b"\xe9", 1),
                      "hotpotqa", "h.jsonl:3: not UTF-8 text (byte 0xe9"),
        "an empty file": (b"", "hotpotqa", "h.jsonl: no records"),
        "a duplicate id": ("\n".join([good[0], good[1], good[0]]).encode(), "hotpotqa",
                           f"h.jsonl:3: duplicate hotpotqa id '{first['_id']}' (first at "),
        "HotpotQA read as Bamboogle": ("\n".join(good).encode(), "bamboogle",
                                       "h.jsonl:1: malformed bamboogle record: has '_id', 'context', 'supporting_facts'"),
        "2Wiki read as HotpotQA": ("\n".join(_lines(DATA / "2wikimultihopqa" / "dev_164.jsonl", 3))
                                   .encode(), "hotpotqa", "keys of the 2wikimultihopqa schema"),
    }[case]


def _lines(path: Path, n: int) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def run_cli(tmp_path: Path, dataset: DatasetSpec, *args: str, **cfg_kw):
    cfg_path = tmp_path / "eval.yaml"
    save_config(config(datasets=[dataset], out_dir=str(tmp_path / "runs"), **cfg_kw), cfg_path)
    return CliRunner().invoke(eval_app, ["--config", str(cfg_path), "--run-name", "r", *args])


def assert_user_error(res, fragment: str, tmp_path: Path) -> None:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no traceback
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.output
    assert not (tmp_path / "runs").exists()  # nothing a resume would trust


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_dataset_file_is_one_line_and_exit_2(tmp_path, case):
    content, name, fragment = bad_file(case)
    path = tmp_path / "h.jsonl"
    path.write_bytes(content)
    res = run_cli(tmp_path, DatasetSpec(name, split="test" if name == "bamboogle" else "dev", path=str(path)))
    assert_user_error(res, fragment, tmp_path)


@pytest.mark.parametrize("args, cfg_kw, fragment", [
    (["--limit", "-1"], {}, "limit=-1 is out of range; allowed: >= 1"),
    (["--set", "runtime.loop.top_k=0"], {}, "runtime.loop.top_k=0 is out of range; allowed: >= 1"),
    (["--set", "chunk_size=0"], {}, "chunk_size=0 is out of range; allowed: >= 1"),
])
def test_out_of_range_settings_are_one_line_and_exit_2(tmp_path, args, cfg_kw, fragment):
    assert_user_error(run_cli(tmp_path, DatasetSpec("musique"), *args, **cfg_kw), fragment, tmp_path)


@pytest.mark.parametrize("kind", ["jsonl", "array"])  # an array is told apart from jsonl despite the BOM
def test_a_utf8_bom_is_read_as_what_it_is(tmp_path, kind):
    good = hotpot_lines(3)
    text = "\n".join(good) + "\n" if kind == "jsonl" else json.dumps([json.loads(line) for line in good])
    path = tmp_path / ("h.jsonl" if kind == "jsonl" else "h.json")
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert [q.id for q in load_dataset("hotpotqa", path=path)] == [json.loads(line)["_id"] for line in good]
    res = run_cli(tmp_path, DatasetSpec("hotpotqa", path=str(path)))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())[0]["summary"]["n"] == 3


def test_a_corrupt_traces_line_on_resume_is_one_line_and_exit_2(tmp_path):
    assert run_cli(tmp_path, DatasetSpec("musique")).exit_code == 0
    traces = next((tmp_path / "runs").rglob("traces.jsonl"))
    lines = traces.read_text().splitlines(keepends=True)
    traces.write_text(lines[0] + "{oops\n" + "".join(lines[1:]))
    res = run_cli(tmp_path, DatasetSpec("musique"))
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]  # after the progress bar
    assert len(errors) == 1 and "traces.jsonl:2: corrupt line" in errors[0], res.output


def test_every_reader_names_the_file_and_line_of_a_non_utf8_byte(tmp_path):
    from kair_runtime.cli import app
    from kair_runtime.jsonl import iter_json_records

    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"id": "1", "title": "A", "text": "ok"}\n{"id": "2", "title": "B", "text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not UTF-8 text \(byte 0xe9 at column 39\)"):
        list(iter_json_records(corpus))
    res = CliRunner().invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                                         "--retriever", "bm25"])
    assert res.exit_code == 2 and "c.jsonl:2: not UTF-8 text" in res.output, res.output
    res = CliRunner().invoke(app, ["ask", "Who?", "--backend", "scripted", "--retriever", "bm25", "--corpus", str(corpus)])
    assert res.exit_code == 2 and "c.jsonl:2: not UTF-8 text" in res.output, res.output
    with pytest.raises(DatasetError, match=r"h\.json:2: not UTF-8"):
        (tmp_path / "h.json").write_bytes(b'[\n{"caf\xe9": 1}]')
        load_dataset("hotpotqa", path=tmp_path / "h.json")


def test_datagen_refuses_an_empty_dataset_file(tmp_path):
    from data_gen.cli import datagen_app

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = CliRunner().invoke(datagen_app, ["silver", "--out", str(tmp_path / "s"), "--set",
                                           f"datasets=[{{name: hotpotqa, path: {empty}}}]"])
    assert res.exit_code == 2 and "empty.jsonl: no records" in res.output, res.output
    assert not (tmp_path / "s" / "trajectories").exists()

