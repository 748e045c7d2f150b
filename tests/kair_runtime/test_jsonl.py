import json

import pytest

from kair_runtime.jsonl import JsonlError, JsonlWriter, read_jsonl, recover


def test_writer_appends_whole_lines_and_recover_reads_them(tmp_path):
    path = tmp_path / "sub" / "t.jsonl"
    with JsonlWriter(path) as w:
        w.write([{"id": 1}, {"id": 2}])
    with JsonlWriter(path) as w:
        w.write([{"id": 3}])
    assert [r["id"] for r in recover(path)] == [1, 2, 3]
    assert recover(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize("torn", ['{"id": 3, "te', '{"id": 3}'])
def test_torn_last_line_is_cut_off_and_appending_continues(tmp_path, torn):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n' + torn)  # killed mid-write: no final newline
    assert [r["id"] for r in recover(path)] == [1, 2]
    assert path.read_text() == '{"id": 1}\n{"id": 2}\n'
    with JsonlWriter(path) as w:
        w.write([{"id": 3}])
    assert [json.loads(l)["id"] for l in path.read_text().splitlines()] == [1, 2, 3]


def test_corruption_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": 1}\nnot json\n{"id": 2}\n')
    with pytest.raises(JsonlError, match=r"t.jsonl:2"):
        recover(path)
    with pytest.raises(JsonlError, match=r"t.jsonl:2"):
        read_jsonl(path)
