"""OpenAI's Files API, for the input of batches: ``/v1/files``.

An upload (``multipart/form-data``: a ``purpose`` field and a ``file`` part) is
parsed as it arrives and the file written straight to ``[http] files_dir``: it
is never held whole in memory, and one over ``[http] max_file_bytes`` or
``[http] max_file_lines`` is refused (413) as soon as it crosses the limit,
its partial file removed. Files live on disk; their records (OpenAI's file
object) in Redis, so every ``laya serve`` sharing the directory and the server
sees the same files.

Laya keeps files for batches only: ``purpose`` is ``batch``. Lines are not
checked here: as on OpenAI, a batch validates its input file when it starts.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson
from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from laya.errors import InvalidRequest, LayaError

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from starlette.requests import Request as HttpRequest

    from laya.keys import Keys

__all__ = ["FileNotFound", "Files", "cursor_page", "file_record"]

FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
PURPOSES = ("batch",)
FIELD_BYTES = 1024
"""Largest form field besides the file (``purpose``, ``expires_after[...]``)."""


def file_record(file_id: str, *, size: int, filename: str, purpose: str, lines: int) -> dict[str, Any]:
    """OpenAI's file object for a file Laya keeps (``laya.lines``: its line count)."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()), "filename": filename,
            "purpose": purpose, "status": "processed", "status_details": None, "expires_at": None,
            "laya": {"lines": lines}}


def cursor_page(records: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's list page of the first ``limit`` of ``records`` (given one more than that when there are more)."""
    page = records[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(records) > limit}


class FileNotFound(LayaError):
    def __init__(self, file_id: str) -> None:
        super().__init__(f"no file {file_id!r:.80}; GET /v1/files lists the files", code="file_not_found",
                         field="file_id")


class _Upload:
    """The parts of one multipart upload, as the parser finds them: form fields kept (small), the file part
    written to ``partial`` and counted."""

    def __init__(self, partial: Path, *, max_bytes: int, max_lines: int) -> None:
        self.partial = partial
        self.max_bytes, self.max_lines = max_bytes, max_lines
        self.fields: dict[str, bytes] = {}
        self.filename: str | None = None
        self.bytes = self.lines = 0
        self.ends_in_newline = True
        self._out: BinaryIO | None = None
        self._headers: dict[str, bytes] = {}
        self._field, self._value = b"", b""
        self._name: str | None = None
        self._is_file = False
        self._seen_file = False

    def callbacks(self) -> Any:  # python_multipart's MultipartCallbacks: these names, these signatures
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end}

    def _part_begin(self) -> None:
        self._headers, self._field, self._value = {}, b"", b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._field.decode("latin-1").lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._name, self._is_file = name, b"filename" in options
        if name == "file":
            if self._seen_file:
                raise InvalidRequest("the upload has two file parts; send one file per request", field="file")
            self._seen_file = True
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace")[:255] or "upload.jsonl"
            self._out = open(self.partial, "wb")  # noqa: SIM115 - closed in _part_end or close()
        else:
            self.fields[name] = b""

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        piece = data[start:end]
        if self._out is None:
            value = self.fields[self._name or ""] + piece
            if len(value) > FIELD_BYTES:
                raise InvalidRequest(f"the form field {self._name!r:.40} is over {FIELD_BYTES} bytes; the file "
                                     "goes in the part named 'file'", field=self._name or "file")
            self.fields[self._name or ""] = value
            return
        self.bytes += len(piece)
        if self.bytes > self.max_bytes:
            raise InvalidRequest(f"the file is over [http] max_file_bytes = {self.max_bytes:,} bytes; split it "
                                 "into several batches", code="too_large", field="file")
        self.lines += piece.count(b"\n")
        if piece:
            self.ends_in_newline = piece.endswith(b"\n")
        if self.lines + (not self.ends_in_newline) > self.max_lines:
            raise InvalidRequest(f"the file has over [http] max_file_lines = {self.max_lines:,} lines; split it "
                                 "into several batches", code="too_large", field="file")
        self._out.write(piece)

    def _part_end(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    @property
    def line_count(self) -> int:
        return self.lines + (not self.ends_in_newline)


class Files:
    """The files of ``laya serve``: ``directory`` for their bytes, ``redis`` for their records."""

    def __init__(self, directory: Path, redis: Redis, keys: Keys, *, max_bytes: int, max_lines: int) -> None:
        self.directory = directory
        self.redis = redis
        self.keys = keys
        self.max_bytes, self.max_lines = max_bytes, max_lines

    def path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.jsonl"

    async def create(self, request: HttpRequest) -> dict[str, Any]:
        """Receive an upload; its file object."""
        kind, options = parse_options_header(request.headers.get("content-type", ""))
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise InvalidRequest(f"Content-Type {kind.decode('latin-1') or 'missing'!r:.60}: upload the file as "
                                 "multipart/form-data with a 'purpose' field and a 'file' part (as the OpenAI SDKs' "
                                 "files.create does)", code="invalid_request", field="file")
        self.directory.mkdir(parents=True, exist_ok=True)
        file_id = "file-" + secrets.token_hex(12)
        upload = _Upload(self.directory / f".{file_id}.partial", max_bytes=self.max_bytes, max_lines=self.max_lines)
        parser = MultipartParser(boundary, upload.callbacks())
        try:
            try:
                async for chunk in request.stream():
                    parser.write(chunk)
                parser.finalize()
            except ParseError as exc:
                raise InvalidRequest(f"the upload is not valid multipart/form-data ({exc}); send it as the OpenAI "
                                     "SDKs' files.create does", field="file") from None
            upload.close()
            purpose = upload.fields.get("purpose", b"").decode("utf-8", "replace")
            if purpose not in PURPOSES:
                raise InvalidRequest(f"purpose {purpose!r:.40}: Laya keeps files for batches only; send "
                                     "purpose 'batch'", field="purpose")
            if upload.filename is None:
                raise InvalidRequest("the upload has no part named 'file'; send the JSONL file in it", field="file")
            os.replace(upload.partial, self.path(file_id))
        except BaseException:
            upload.close()
            upload.partial.unlink(missing_ok=True)
            raise
        record = file_record(file_id, size=upload.bytes, filename=upload.filename, purpose=purpose,
                             lines=upload.line_count)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.file(file_id), orjson.dumps(record))
            pipe.zadd(self.keys.files, {file_id: time.time()})
            await pipe.execute()
        return record

    async def retrieve(self, file_id: str) -> dict[str, Any]:
        raw = await self.redis.get(self.keys.file(file_id)) if FILE_ID.match(file_id) else None
        if raw is None:
            raise FileNotFound(file_id)
        record: dict[str, Any] = orjson.loads(raw)
        return record

    async def delete(self, file_id: str) -> dict[str, Any]:
        await self.retrieve(file_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.file(file_id))
            pipe.zrem(self.keys.files, file_id)
            await pipe.execute()
        self.path(file_id).unlink(missing_ok=True)
        return {"id": file_id, "object": "file", "deleted": True}

    async def list(self, *, purpose: str | None, limit: int, after: str | None, order: str) -> dict[str, Any]:
        """OpenAI's cursor page: ``limit`` files after ``after``, newest first (``order`` desc) or oldest."""
        found = await self.redis.zrange(self.keys.files, 0, -1, desc=order == "desc")
        ids: list[str] = [i.decode() if isinstance(i, bytes) else str(i) for i in found]
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        records = []
        for file_id in ids:
            raw = await self.redis.get(self.keys.file(file_id))
            if raw is None:
                continue
            record = orjson.loads(raw)
            if purpose is None or record["purpose"] == purpose:
                records.append(record)
            if len(records) > limit:
                break
        return cursor_page(records, limit)
