"""`/v1/files` through the official `openai` package, on a real `laya serve` and Valkey."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import Server, free_port
from tests.integration.test_http import Door, _env, _running


def _serve(redis_server: Server, tiny_model: Path, routes_file: Path, files: Path, logs: Path,
           **limits: str) -> Iterator[Door]:
    port = free_port()
    env = _env(redis_server.url, f"files{port}", port, tiny_model, routes_file, LAYA_HTTP__FILES_DIR=str(files),
               **limits)
    yield from _running(redis_server, env, port, f"files{port}", logs, ())


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    return tmp_path / "files"


@pytest.fixture
def door(redis_server: Server, tiny_model: Path, routes_file: Path, files_dir: Path, tmp_path: Path) -> Iterator[Door]:
    yield from _serve(redis_server, tiny_model, routes_file, files_dir, tmp_path)


@pytest.fixture
def small_door(redis_server: Server, tiny_model: Path, routes_file: Path, files_dir: Path,
               tmp_path: Path) -> Iterator[Door]:
    yield from _serve(redis_server, tiny_model, routes_file, files_dir, tmp_path, LAYA_HTTP__MAX_FILE_BYTES="4096",
                      LAYA_HTTP__MAX_FILE_LINES="10")


def jsonl(lines: int, *, width: int = 0) -> bytes:
    return b"".join(b'{"custom_id": "r%d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s"}}\n'
                    % (i, b"x" * width) for i in range(lines))


def test_a_file_is_uploaded_listed_read_back_and_deleted(door: Door, files_dir: Path, tmp_path: Path) -> None:
    client = door.client()
    data = jsonl(3) + b'{"custom_id": "last, no newline"}'
    source = tmp_path / "requests.jsonl"
    source.write_bytes(data)
    with source.open("rb") as f:
        created = client.files.create(file=f, purpose="batch")
    assert created.id.startswith("file-") and created.object == "file" and created.purpose == "batch"
    assert created.bytes == len(data) and created.filename == "requests.jsonl"
    assert created.model_extra is not None and created.model_extra["laya"] == {"lines": 4}
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).read() == data
    assert (files_dir / f"{created.id}.jsonl").read_bytes() == data
    with source.open("rb") as f:
        second = client.files.create(file=("other.jsonl", f), purpose="batch")
    listed = client.files.list(purpose="batch")
    assert [f.id for f in listed.data] == [second.id, created.id]  # newest first
    page = client.files.list(purpose="batch", limit=1, order="asc")
    assert [f.id for f in page.data] == [created.id] and page.has_more
    assert [f.id for f in client.files.list(limit=1, order="asc", after=created.id).data] == [second.id]

    deleted = client.files.delete(created.id)
    assert deleted.id == created.id and deleted.deleted
    assert not (files_dir / f"{created.id}.jsonl").exists()
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(created.id)
        assert caught.value.body["code"] == "file_not_found" and "GET /v1/files lists" in caught.value.message  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("../../etc/passwd")
    assert [f.id for f in client.files.list().data] == [second.id]


def test_uploads_over_a_limit_or_not_for_batches_are_refused_and_leave_nothing(small_door: Door,
                                                                               files_dir: Path) -> None:
    client = small_door.client(max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("many.jsonl", jsonl(11)), purpose="batch")
    assert caught.value.status_code == 413 and "max_file_lines = 10" in caught.value.message
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("wide.jsonl", jsonl(2, width=3000)), purpose="batch")
    assert caught.value.status_code == 413 and "max_file_bytes = 4,096" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("tune.jsonl", jsonl(2)), purpose="fine-tune")
    assert caught.value.body["param"] == "purpose" and "purpose 'batch'" in caught.value.message  # type: ignore[index]
    assert list(files_dir.iterdir()) == [], "a refused upload left a file behind"
    assert client.files.list().data == []
    ok = client.files.create(file=("ten.jsonl", jsonl(10)), purpose="batch")  # exactly at the limit
    assert ok.model_extra is not None and ok.model_extra["laya"]["lines"] == 10


def _peak_rss_mib(pid: int) -> float:
    """The most resident memory the process has had (VmHWM): an upload held whole shows here even once freed."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_100_mb_upload_is_streamed_to_disk_not_held_in_memory(door: Door, files_dir: Path, tmp_path: Path) -> None:
    """The bound: the server's peak resident memory grows by less than 40 MiB for a 100 MB file."""
    client = door.client(timeout=120)
    source = tmp_path / "big.jsonl"
    with source.open("wb") as out:
        for _ in range(50):
            out.write(jsonl(1000, width=1920))  # 50,000 lines, just over 100 MB
    size = source.stat().st_size
    assert size > 100_000_000
    client.files.list()  # the server has served a request: what it holds at rest is loaded
    [serve] = door.pids
    before = _peak_rss_mib(serve)
    with source.open("rb") as f:
        created = client.files.create(file=f, purpose="batch")
    grown = _peak_rss_mib(serve) - before
    assert created.bytes == size and created.model_extra is not None and created.model_extra["laya"]["lines"] == 50_000
    assert (files_dir / f"{created.id}.jsonl").stat().st_size == size
    assert grown < 40, f"the server's peak RSS grew by {grown:.0f} MiB for a {size / 1e6:.0f} MB upload"
