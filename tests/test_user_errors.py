"""USER_ERRORS (kair_runtime.errors): which errors every command reports as one line with exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from data_gen.cli import datagen_app
from data_gen.sft import SFTError
from eval.cli import corpus_app
from eval.datasets import DatasetError
from kair_runtime.config import ConfigError
from kair_runtime.errors import USER_ERRORS
from kair_runtime.jsonl import JsonlError
from kair_runtime.llm.base import BackendError
from kair_runtime.retrieval.base import CorpusError
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
