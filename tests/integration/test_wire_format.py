"""docs/wire-format.md's redis-cli example, run as the page writes it, against a running router."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.conftest import Server
from tests.processes import start_laya, stop_laya

PAGE = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
EXAMPLE = re.compile(r"<!-- wire-test: redis-cli -->\n```sh\n(.*?)```", re.DOTALL)


def test_the_redis_cli_example_gets_its_answer(redis_server: Server, routes_file: Path, tmp_path: Path) -> None:
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed (Debian's redis-tools)")
    [block] = EXAMPLE.findall(PAGE.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}, "LAYA_REDIS_URL": redis_server.url,
           "LAYA_ROUTES": str(routes_file), "LAYA_ROUTER__BLOCK_MS": "100", "LAYA_METRICS__PORT": "0"}
    router = start_laya("router", env, tmp_path / "router.log")
    try:
        done = subprocess.run(["bash", "-e", "-c", block], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
    finally:
        stop_laya(router)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"\d+-\d+", lines[0]), lines  # XADD's entry id
    assert lines[1] == "laya:done:wire-1", lines  # BLPOP: the list, then the record
    assert orjson.loads(lines[2]) == orjson.loads(lines[3])  # GET: the same record
    record = orjson.loads(lines[3])
    assert (record["id"], record["route"], record["ok"]) == ("wire-1", "rule:greeting", True)
