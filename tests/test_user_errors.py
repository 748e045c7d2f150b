"""USER_ERRORS (kair_runtime.errors): which errors every command reports as one line with exit 2."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from data_gen.cli import datagen_app
from data_gen.sft import SFTError
from eval.cli import corpus_app
from eval.datasets import DatasetError
from eval.cli import eval_app
from kair_runtime.cli import app
from kair_runtime.config import ConfigError, Range
from kair_runtime.errors import USER_ERRORS
from kair_runtime.jsonl import JsonlError
from kair_runtime.llm.base import BackendError
from kair_runtime.retrieval.base import CorpusError
from kair_runtime.retrieval.cli import index_app
from kair_runtime.retrieval.encoders import EncoderError
from kair_runtime.retrieval.remote import RemoteRetrievalError
from kair_runtime.retrieval.store import IndexDirError

runner = CliRunner()


@pytest.mark.parametrize("error", [ConfigError, JsonlError, BackendError, CorpusError, IndexDirError, DatasetError,
                                   KeyError, FileNotFoundError])
def test_the_errors_eval_always_caught_are_user_errors(error):
    assert issubclass(error, USER_ERRORS)


@pytest.mark.parametrize("error", [ValueError, RuntimeError, OSError, EncoderError, RemoteRetrievalError, SFTError])
def test_other_errors_are_left_to_the_command_or_keep_their_traceback(error):
    assert not issubclass(error, USER_ERRORS)


def test_user_errors_keep_their_old_bases():
    # Code elsewhere catches them as the builtins they were (a backend's RuntimeError, ValueError).
    assert issubclass(BackendError, RuntimeError)
    assert all(issubclass(c, ValueError) for c in (ConfigError, JsonlError, CorpusError, IndexDirError, DatasetError))


def test_datagen_still_reports_a_plain_value_error_as_a_user_error(tmp_path):
    # SFTError is a plain ValueError, not a UserError: datagen's extra ValueError is what catches it.
    (tmp_path / "kept.jsonl").write_text("")
    res = runner.invoke(datagen_app, ["to-sft", str(tmp_path), "--out", str(tmp_path / "sft")])
    assert res.exit_code == 2 and res.output == "error: no trajectories to convert\n"


def test_corpus_build_reports_a_missing_extra_file_in_one_line(tmp_path):
    missing = tmp_path / "none.json"
    res = runner.invoke(corpus_app, ["build", "--extra", str(missing), "--out", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 2 and res.output == f"error: [Errno 2] No such file or directory: '{missing}'\n"


# ---------------------------------------------------------------- issue 29: one line and exit 2, not a traceback
# Each case below was a traceback, or exit 0 with a wrong value, before the check it tests.

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
DEMO_CORPUS = ROOT / "kair_runtime" / "data" / "demo_corpus.jsonl"
SCRIPTED_BM25 = ["--backend", "scripted", "--retriever", "bm25", "--max-steps", "2"]


def one_error_line(res, fragment: str) -> str:
    """The command failed as a user error: exit 2, no traceback, and one `error: ` line (among
    progress bars) that holds `fragment`."""
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0], res.output
    return errors[0]


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_serve_refuses_a_port_outside_0_to_65535_before_loading_anything(port, monkeypatch):
    import kair_runtime.serve.cli as serve_cli

    monkeypatch.setattr(serve_cli, "run", lambda *a, **kw: pytest.fail("kair serve started with a bad port"))
    serve_app = typer.Typer()
    serve_app.command()(serve_cli.serve)
    res = runner.invoke(serve_app, ["--config", str(CONFIGS / "runtime" / "bm25.yaml"), "--port", port])
    assert res.output == f"config error: --port={port} is out of range; allowed: in [0, 65535]\n"
    assert res.exit_code == 2
    res = runner.invoke(index_app, ["serve", "--index", "nowhere", "--port", port])
    one_error_line(res, f"--port={port} is out of range; allowed: in [0, 65535]")


def eval_config(tmp_path: Path, questions: list[str]) -> Path:
    """An eval config over a tiny Bamboogle-format file (the scripted backend, BM25 over the demo corpus)."""
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"idx": str(i), "question": q, "answer": "1987"}) + "\n"
                            for i, q in enumerate(questions)))
    cfg = {"runtime": {"llm": {"backend": "scripted"}, "retriever": {"kind": "bm25", "corpus": str(DEMO_CORPUS)},
                       "loop": {"max_steps": 2, "top_k": 2}},
           "datasets": [{"name": "bamboogle", "split": "test", "path": str(data)}], "methods": ["vanilla"],
           "chunk_size": 1, "out_dir": str(tmp_path / "runs")}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


TWO_QUESTIONS = ["Where was Maren Volk born?", "Which river flows through Brennock?"]


@pytest.mark.parametrize("error, reason", [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "No space left on device"),  # a write names no file
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES), "TRACES"), "Permission denied"),
    (OSError(errno.EROFS, os.strerror(errno.EROFS), "TRACES"), "Read-only file system"),
])
def test_an_os_error_of_the_run_folder_is_one_line_and_the_run_resumes(tmp_path, monkeypatch, error, reason):
    from kair_runtime.jsonl import JsonlWriter

    config = eval_config(tmp_path, TWO_QUESTIONS)
    run = tmp_path / "runs" / "r"
    write = JsonlWriter.write

    def fail_second_chunk(self, records):
        if self.path.exists() and self.path.stat().st_size:  # the first question is on disk
            if error.filename == "TRACES":
                error.filename = str(self.path)
            raise error
        write(self, records)

    with monkeypatch.context() as m:
        m.setattr(JsonlWriter, "write", fail_second_chunk)
        res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "r"])
    one_error_line(res, f"run folder {run}: {reason}")
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "r"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "summary.json").read_text())[0]["summary"]["n"] == 2
    assert len(next(run.rglob("traces.jsonl")).read_text().splitlines()) == 2  # nothing lost, nothing twice


def test_a_run_folder_that_is_a_symlink_to_itself_or_under_a_file_is_one_line(tmp_path):
    config = eval_config(tmp_path, TWO_QUESTIONS)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "loop").symlink_to("loop")
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "loop"])
    one_error_line(res, f"run folder {tmp_path / 'runs' / 'loop'}: {tmp_path / 'runs' / 'loop'} is a symbolic link "
                        "that leads nowhere")
    (tmp_path / "afile").write_text("not a folder")
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "r", "--out-dir", str(tmp_path / "afile")])
    one_error_line(res, f"run folder {tmp_path / 'afile' / 'r'}: {tmp_path / 'afile'} is a file, not a folder")


def test_an_out_that_is_in_the_way_is_one_line_for_index_corpus_and_sft(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    res = runner.invoke(index_app, ["build", "--corpus", str(DEMO_CORPUS), "--out", str(afile), "--retriever", "bm25"])
    one_error_line(res, f"{afile} exists and is not a folder")
    res = runner.invoke(index_app, ["build", "--corpus", str(DEMO_CORPUS), "--out", str(afile / "i"),
                                    "--retriever", "bm25"])
    one_error_line(res, f"--out {afile / 'i'}: {afile} is a file, not a folder")
    extra = ["--extra", str(DEMO_CORPUS)]
    res = runner.invoke(corpus_app, ["build", *extra, "--out", str(tmp_path)])  # an existing folder
    one_error_line(res, f"--out {tmp_path}: Is a directory")
    res = runner.invoke(corpus_app, ["build", *extra, "--out", str(afile / "c.jsonl")])
    one_error_line(res, f"--out {afile / 'c.jsonl'}: {afile} is a file, not a folder")
    res = runner.invoke(datagen_app, ["to-sft", str(one_trajectory(tmp_path)), "--out", str(afile)])
    assert "not a folder" in one_error_line(res, str(afile))
    assert afile.read_text() == "not a folder"


def test_an_out_that_is_in_the_way_is_one_line_for_generate_silver_and_quality(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    scripted = ["--set", "runtime.llm.backend=scripted", "--set", "runtime.retriever.kind=bm25"]
    res = runner.invoke(datagen_app, ["generate", "--datasets", "musique", "--limit", "1", "--no-progress",
                                      "--out", str(afile / "t"), *scripted])
    one_error_line(res, f"--out {afile / 't'}: {afile} is a file, not a folder")
    res = runner.invoke(datagen_app, ["silver", "--datasets", "musique", "--limit", "1", "--out", str(afile / "s"),
                                      "--set", "runtime.retriever.kind=bm25"])
    one_error_line(res, f"--out {afile / 's'}: {afile} is a file, not a folder")
    res = runner.invoke(datagen_app, ["quality", str(one_trajectory(tmp_path)), "--out", str(afile / "q.json")])
    one_error_line(res, f"--out {afile / 'q.json'}: {afile} is a file, not a folder")
    assert afile.read_text() == "not a folder"


def one_trajectory(tmp_path: Path) -> Path:
    """A trajectories file of one scripted KAIR run over the demo corpus."""
    from kair_runtime.config import RuntimeConfig, load_config
    from kair_runtime.records import Question
    from kair_runtime.runtime import loop_from_config

    cfg = load_config(RuntimeConfig, None, ["llm.backend=scripted", "retriever.kind=bm25", "loop.max_steps=2"])
    trace = loop_from_config(cfg).run_one(Question(id="q1", question=TWO_QUESTIONS[0], answers=["Brennock"]))
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(trace.to_dict()) + "\n")
    return path


@pytest.mark.parametrize("name", ["../../escape", "../r", "a/b", "..", ".", "", "ABSOLUTE"])
def test_a_run_name_must_stay_inside_its_out_dir(tmp_path, name):
    name = str(tmp_path / "abs") if name == "ABSOLUTE" else name
    (tmp_path / "deep" / "er").mkdir(parents=True)
    config = eval_config(tmp_path / "deep" / "er", TWO_QUESTIONS)
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", name])
    one_error_line(res, f"run_name={name!r} must be a single folder name inside out_dir")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "er", "eval.yaml", "q.jsonl"]  # nothing written


@pytest.mark.parametrize("content, fragment", [
    ('[{"model": "m", "dat', "summary.json:1: not valid JSON (Unterminated string"),
    ("", "summary.json:1: not valid JSON (Expecting value)"),
    ('{"model": "m"}', "summary.json: not a kair eval summary"),
    ('[{"model": "m"}]', "summary.json: not a kair eval summary"),
])
def test_compare_over_a_corrupt_summary_names_the_file(tmp_path, content, fragment):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(content)
    res = runner.invoke(eval_app, ["compare", str(tmp_path / "run")])
    assert one_error_line(res, fragment) == res.output.strip()
    assert str(tmp_path / "run" / "summary.json") in res.output


@pytest.mark.parametrize("line, fragment", [
    ('{"id": 1, "title": ["x"], "text": 5}', "c.jsonl:2: passage 1: 'title' should be a string, got list"),
    ('{"id": 1, "title": "x", "text": 5}', "c.jsonl:2: passage 1: 'text' should be a string, got int"),
    ('{"id": 1, "title": "x", "text": null}', "c.jsonl:2: passage 1: 'text' should be a string, got null"),
    ('{"id": 1, "title": "x", "text": "  "}', "c.jsonl:2: passage 1: 'text' is blank"),
    ('{"id": 1, "contents": ""}', "c.jsonl:2: passage 1: 'contents' is blank"),
    ('{"id": [1], "title": "x", "text": "y"}', "c.jsonl:2: 'id' should be a string or an integer, got list"),
])
def test_index_build_names_the_corpus_line_and_field_of_a_bad_passage(tmp_path, line, fragment):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "ok", "title": "Brennock", "text": "A market town."}\n' + line + "\n")
    for kind in ("bm25", "dense"):  # refused while the corpus is read, before any model loads
        res = runner.invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(tmp_path / kind),
                                        "--retriever", kind])
        assert one_error_line(res, fragment) == res.output.strip()


def test_a_corpus_with_no_indexable_word_is_one_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "title": "", "text": "a"}\n{"id": "2", "title": "x", "text": "5 of the"}\n')
    res = runner.invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
                                    "--retriever", "bm25"])
    one_error_line(res, f"{corpus}: no passage has a word BM25 can index")


@pytest.mark.parametrize("args, fragment", [
    (["filter", "T", "--min-f1", "nan"], "min_f1=nan is not a finite number; allowed: in [0, 1]"),
    (["filter", "T", "--min-f1", "2"], "min_f1=2.0 is out of range; allowed: in [0, 1]"),
    (["filter", "T", "--min-f1", "-0.5"], "min_f1=-0.5 is out of range"),
    (["filter", "T", "--set", "max_step_tokens=0"], "max_step_tokens=0 is out of range; allowed: >= 1"),
    (["to-sft", "T", "--prompt-source", "bogus"], "prompt_source='bogus' is not one of canonical, recorded"),
    (["to-sft", "T", "--validation-fraction", "1"], "validation_fraction=1.0 is out of range; allowed: in [0, 1)"),
    (["to-sft", "T", "--validation-fraction", "nan"], "validation_fraction=nan is not a finite number"),
])
def test_datagen_settings_are_range_checked_where_the_config_is_read(tmp_path, args, fragment):
    (tmp_path / "kept.jsonl").write_text("")
    args = [str(tmp_path) if a == "T" else a for a in args]
    res = runner.invoke(datagen_app, [*args, "--out", str(tmp_path / "out")])
    assert one_error_line(res, fragment) == res.output.strip()
    assert not (tmp_path / "out").exists()


def test_nan_is_outside_every_range():
    assert not any(Range(**kw).allows(math.nan) for kw in ({}, {"low": 0}, {"high": 1}, {"low": 0, "high": 1}))


@pytest.mark.parametrize("question, fragment", [
    ("", "the question must not be empty"),
    (" \t\n ", "the question must not be empty"),
    # What Python makes of the bytes b"\xff\xfe what" on a UTF-8 command line (surrogateescape).
    (b"\xff\xfe what".decode("utf-8", "surrogateescape"), "the question is not UTF-8 text (byte 0xff at character 1)"),
])
def test_ask_refuses_a_question_it_cannot_ask_up_front(question, fragment):
    res = runner.invoke(app, ["ask", question, *SCRIPTED_BM25])
    assert res.output == f"error: {fragment}\n" and res.exit_code == 2


def test_an_empty_question_in_an_eval_dataset_is_refused_or_counted(tmp_path):
    config = eval_config(tmp_path, [TWO_QUESTIONS[0], "   ", TWO_QUESTIONS[1]])
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "r"])
    one_error_line(res, f"{tmp_path / 'q.jsonl'}:2: malformed bamboogle record: the question must not be empty")
    assert not (tmp_path / "runs").exists()
    res = runner.invoke(eval_app, ["--config", str(config), "--run-name", "r", "--set", "skip_malformed=true"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())[0]["summary"]
    assert (summary["n"], summary["skipped_malformed"]) == (2, 1)  # reported beside n, not silently gone
