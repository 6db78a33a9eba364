"""A batch's files and window, without a server: ids, error records, reading a results file back, AIMD."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from laya.batch import Window
from laya.batchfile import ResultsFile, read_batch
from laya.errors import FileAccessError, ResumeError


def write(path: Path, *lines: object) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines))
    return path


def test_a_line_keeps_its_id_and_a_line_without_one_gets_the_same_derived_id_on_every_read(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", {"id": "order-1", "prompt": "a"}, "b", {"prompt": "c"})
    first, again = read_batch(source), read_batch(source)
    assert [line.id for line in first.requests] == [line.id for line in again.requests]
    own, second, third = first.requests
    assert own.id == "order-1" and own.payload == {"id": "order-1", "prompt": "a"}
    assert second.id.startswith("line2-") and second.payload == {"id": second.id, "prompt": "b"}
    assert third.id.startswith("line3-") and third.id != second.id
    # Another file, another line or other bytes make another request; lines added at the end change nothing.
    copy = write(tmp_path / "copy.jsonl", {"id": "order-1", "prompt": "a"}, "b", {"prompt": "c"})
    assert read_batch(copy).requests[1].id != second.id
    write(source, {"id": "order-1", "prompt": "a"}, "b", {"prompt": "changed"}, "d")
    ids = [line.id for line in read_batch(source).requests]
    assert ids[1] == second.id and ids[2] != third.id
    assert read_batch(source, scope="pass 2").requests[1].id != second.id


def test_bad_and_repeated_ids_are_error_records_that_name_the_field_the_value_and_the_lines(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", {"id": "a b", "prompt": "x"}, {"id": 42, "prompt": "x"},
                   {"id": "job-1", "prompt": "x"}, b"", {"id": "job-1", "prompt": "y"}, b"{not json")
    batch = read_batch(source)
    assert [line.number for line in batch.requests] == [3]
    assert batch.lines == 5 and sorted(batch.rejected) == [1, 2, 5, 6]
    said = {n: r["error"]["message"] for n, r in batch.rejected.items()}
    assert said[1].startswith("field 'id' = 'a b': not a request id; use 1-128 letters, digits")
    assert said[2].startswith("field 'id' = a number (42): not a request id")
    assert said[5] == ("field 'id' = 'job-1' is also the id of line 3; give each line its own id, or leave 'id' "
                       "out and laya batch derives one")
    assert said[6] == ("line is not JSON (unexpected character, expected a string key at character 2); write a "
                       'prompt as a JSON string ("...") or a request as {"prompt": "..."}')
    assert {r["route"] for n, r in batch.rejected.items() if n != 6} == {"error:invalid_request"}
    assert all(r["id"] == batch.ids[n] and r["line"] == n for n, r in batch.rejected.items())


def test_resuming_cuts_a_torn_last_line_and_answers_that_line_again(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", "a", "b", "c")
    batch = read_batch(source)
    out = tmp_path / "out.jsonl"
    first, second = ({"line": n, "id": batch.ids[n], "ok": True} for n in (1, 2))
    out.write_bytes(orjson.dumps(first) + b"\n" + orjson.dumps(second)[:9])  # the crash cut the second write
    results = ResultsFile(out, batch, resume=True)
    assert results.torn and sorted(results.done) == [1]
    results.append(second)
    results.close()
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == [first, second]


def test_resuming_refuses_a_results_file_of_another_input(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", "a", "b")
    batch = read_batch(source)
    out = write(tmp_path / "out.jsonl", {"line": 2, "id": "line2-0123", "ok": True})
    with pytest.raises(ResumeError) as caught:
        ResultsFile(out, batch, resume=True)
    assert caught.value.message == (
        f"cannot resume into {out}: its line 1 answers input line 2 as request line2-0123, but line 2 of "
        f"{source} is now request {batch.ids[2]}; the input changed since, or {out} belongs to another input. "
        "Write to another file (-o), or leave out --resume to start again")
    write(out, b"a log line")
    with pytest.raises(ResumeError, match="its line 1 is not a laya batch result record"):
        ResultsFile(out, batch, resume=True)
    with pytest.raises(FileAccessError, match="it is the input file"):
        ResultsFile(source, batch, resume=False)


def test_a_fresh_run_empties_the_results_file_only_when_it_starts(tmp_path: Path) -> None:
    batch = read_batch(write(tmp_path / "in.jsonl", "a"))
    out = write(tmp_path / "out.jsonl", b"an old line")
    results = ResultsFile(out, batch, resume=False)
    assert out.read_bytes() == b"an old line\n"  # opened (so it is writable), not yet emptied
    results.start()
    results.close()
    assert out.read_bytes() == b""


def test_the_window_grows_by_one_per_window_of_answers_and_halves_once_per_round() -> None:
    window = Window(4, 100)
    assert window.room(1) == 3
    sent = [window.send() for _ in range(4)]
    for _ in range(4):
        window.answered()
    assert window.room(0) == 4 and 4.9 < window.size < 5.0  # 4 + 1/4 + 1/4.25 + ...: just under one more
    before = window.size
    window.refused(sent[0])
    halved = window.size
    assert halved == before / 2
    for sequence in sent[1:]:  # sent before the cut: the same congestion event
        window.refused(sequence)
    assert window.size == halved
    window.refused(window.send())  # sent after the cut: a new event
    assert window.size == halved / 2
    for _ in range(20):
        window.refused(window.send())
    assert window.size == 1.0 and window.room(0) == 1
    assert Window(300, 8).size == 8  # never above the limit


def test_a_line_nested_deeper_than_can_be_sent_is_an_error_record_and_the_others_go(tmp_path: Path) -> None:
    # orjson reads 1,024 levels and writes 255: a line with metadata nested 300 deep once ended the whole run with
    # a TypeError while submitting, the good lines unsent (a helper's find).
    deep: dict[str, object] = {}
    for _ in range(300):
        deep = {"a": deep}
    source = tmp_path / "in.jsonl"
    source.write_text('"first"\n' + json.dumps({"prompt": "x", "metadata": {"k": deep}}) + '\n"third"\n')
    batch = read_batch(source)
    assert [line.number for line in batch.requests] == [1, 3] and batch.rejected[2]["route"] == "error:invalid_json"
    assert "flatten" in batch.rejected[2]["error"]["message"]


def test_an_id_with_a_line_break_at_its_end_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "abc\n", "prompt": "x"}) + "\n")
    batch = read_batch(source)
    assert batch.rejected[1]["error"]["field"] == "id" and batch.requests == []
