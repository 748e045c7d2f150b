"""`kair index build` through typer's CliRunner on the index sub-app."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kair_runtime.retrieval.cli import index_app
from kair_runtime.retrieval.indexing import open_index

runner = CliRunner()


def test_build_bm25_index_dir(corpus_file, tmp_path, obvious):
    out = tmp_path / "bm25"
    result = runner.invoke(index_app, ["build", "--corpus", str(corpus_file), "--out", str(out), "--retriever", "bm25"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["kind"] == "bm25" and '"count": 20' in result.output
    assert open_index(out).search([obvious[0][0]], 1)[0][0].id == obvious[0][1]


@pytest.mark.slow
def test_build_dense_index_dir(corpus_file, tmp_path, obvious):
    out = tmp_path / "dense"
    result = runner.invoke(index_app, ["build", "--corpus", str(corpus_file), "--out", str(out), "--retriever", "dense",
                                       "--encoder", "minilm", "--index-factory", "Flat", "--shard-size", "8",
                                       "--no-keep-shards"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["kind"], manifest["encoder"], manifest["dim"], manifest["count"]) == ("dense", "minilm", 384, 20)
    assert (out / "index.faiss").exists() and not (out / "shards").exists()
    assert open_index(out).search([obvious[1][0]], 1)[0][0].id == obvious[1][1]


@pytest.mark.parametrize("args, message", [
    (["--retriever", "splade"], "unknown index kind 'splade'"),
    (["--retriever", "bm25", "--encoder", "minilm"], "option(s) encoder do not apply to a bm25 index"),
])
def test_bad_options_exit_1_with_one_line(corpus_file, tmp_path, args, message):
    result = runner.invoke(index_app, ["build", "--corpus", str(corpus_file), "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_missing_corpus_exits_1(tmp_path):
    result = runner.invoke(index_app, ["build", "--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x"),
                                       "--retriever", "bm25"])
    assert result.exit_code == 2 and "corpus not found" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_failed_rebuild_leaves_the_good_index_as_it_was(corpus_file, tmp_path, obvious):
    out = tmp_path / "idx"
    build = ["build", "--out", str(out), "--retriever", "bm25", "--corpus"]
    assert runner.invoke(index_app, [*build, str(corpus_file)]).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(corpus_file.read_text() + "{not json\n")
    result = runner.invoke(index_app, [*build, str(bad)])
    assert result.exit_code == 2 and "bad.jsonl" in result.output
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert open_index(out).search([obvious[0][0]], 1)[0][0].id == obvious[0][1]
    # a good rebuild then replaces it whole, leaving no staging folder behind
    assert runner.invoke(index_app, [*build, str(corpus_file)]).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "idx"]


def test_index_build_never_replaces_a_folder_of_other_files(corpus_file, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(index_app, ["build", "--corpus", str(corpus_file), "--out", str(tmp_path),
                                       "--retriever", "bm25"])
    assert result.exit_code == 2 and "holds files that are not this command's output" in result.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_serve_refuses_a_dir_that_is_not_an_index(tmp_path):
    result = runner.invoke(index_app, ["serve", "--index", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2 and "not an index dir" in result.output and "Traceback" not in result.output


def test_serve_on_port_0_names_the_port_it_got_and_a_taken_port_is_one_line(corpus_file, tmp_path, obvious):
    import subprocess
    import sys

    import httpx

    out = tmp_path / "bm25"
    assert runner.invoke(index_app, ["build", "--corpus", str(corpus_file), "--out", str(out),
                                     "--retriever", "bm25"]).exit_code == 0
    kair = [sys.executable, "-c", "from kair_runtime.cli import main; main()", "index", "serve", "--index", str(out)]
    proc = subprocess.Popen([*kair, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving bm25 index") and ":0/" not in line, line
        url = line.split(" on ")[1].split()[0]
        hits = httpx.post(url, json={"queries": [obvious[0][0]], "k": 1}, timeout=30).json()
        assert hits["results"][0][0]["id"] == obvious[0][1]
        port = url.rsplit(":", 1)[1].split("/")[0]
        taken = subprocess.run([*kair, "--port", port], capture_output=True, text=True, timeout=120)
        assert taken.returncode == 2 and taken.stderr.strip() == f"error: cannot serve on 127.0.0.1:{port}: " \
                                                                 "Address already in use", taken.stderr
    finally:
        proc.kill()
        proc.wait()
