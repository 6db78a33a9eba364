"""The README's commands, run as the README writes them, so the README cannot drift from the tool.

Each shell block marked ``<!-- readme-test: NAME -->`` in README.md runs in
bash, unchanged, in a fresh directory that looks like a fresh clone after the
quick start's install: a copy of the checkout's ``configs/`` and
``producers/``, and ``.venv`` linking to the virtualenv this test runs in
(its ``bin/`` is also first on PATH, as after ``. .venv/bin/activate``).

What is not re-run: the install steps of the quick start (``python3 -m venv
.venv`` and ``.venv/bin/pip install -e .``, dropped from their ``&&`` chain).
The test runs inside a virtualenv installed exactly that way already, and a
second install would take minutes (llama-cpp-python compiles).

What is adapted: the ports. ``laya up`` (block ``up``) serves the embedded
Valkey on a free port instead of 6390, through ``LAYA_REDIS__EMBEDDED_PORT``,
which every ``laya`` command and the producers read the same way, so the
commands themselves stay as written; its HTTP API listens on a free port instead
of 8390 (``LAYA_HTTP__PORT``), and the ``curl`` block's URL is given that port.

The order is the README's: the demo (which assembles the [model] extra's model
into ``.laya/models/``), then ``laya up`` and the commands run against it (the shell block, then the
Python example marked ``<!-- readme-test: python -->``), then the memory
examples on that model. The real-model examples (Qwen files a newcomer does not have)
are the unmarked blocks; :func:`test_every_example_block_is_run_or_needs_a_real_model`
keeps them that way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

from ..conftest import free_port
from .running import RunningUp

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKED = re.compile(r"<!-- readme-test: (\S+) -->\n```sh\n(.*?)```", re.DOTALL)
MARKED_PYTHON = re.compile(r"<!-- readme-test: python -->\n```python\n(.*?)```", re.DOTALL)
SECTIONS = ("## Quick start", "## Using a real model", "## Memory: plan before loading")


def blocks() -> dict[str, str]:
    return {name: body for name, body in MARKED.findall(README.read_text())}


def without_install(block: str) -> str:
    """The block minus the install steps of an ``&&`` chain (see the module docstring)."""
    lines = []
    for line in block.splitlines():
        steps = [s for s in line.split(" && ") if not re.match(r"\s*(python3 -m venv|\S*pip install)", s)]
        lines.append(" && ".join(steps))
    return "\n".join(lines)


def run(block: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{block}\nexited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def fresh_clone(tmp_path: Path) -> Path:
    """The files git tracks in configs/ and producers/: a checkout where someone followed the README holds its
    outputs too (configs/local.toml from `laya init`, which a second `laya init` will not overwrite)."""
    clone = tmp_path / "laya"
    tracked = subprocess.run(["git", "ls-files", "-z", "configs", "producers"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    (clone / ".venv").symlink_to(sys.prefix)
    return clone


def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    found = blocks()
    assert set(found) == {"demo", "up", "with-up", "curl", "plan"}, sorted(found)
    clone = fresh_clone(tmp_path)
    bin_dir = Path(sys.prefix) / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=sys.prefix,
               LAYA_REDIS__EMBEDDED_PORT=str(free_port()), LAYA_HTTP__PORT=str(free_port()))

    demo = run(without_install(found["demo"]), clone, env)
    assert "laya demo" in found["demo"] and "demo finished; everything is stopped." in demo.stderr
    assert "sample batch: .laya/demo-requests.jsonl, 17 lines" in demo.stderr  # what the README says it sends
    for route in ("rule:greeting", "rule:ping", "rule:status", "rule:echo", "model:default", "cache"):
        assert route in demo.stdout, demo.stdout
    assert "runs the [model] extra's Gemma 3 270M base" in demo.stderr  # real weights, not the tiny model
    assert "' Paris'" in demo.stdout and "' Tokyo'" in demo.stdout, demo.stdout  # real model text

    up = RunningUp(found["up"].strip(), cwd=clone, env=env)
    try:
        up.wait_for("laya is up on")
        assert "0 rules loaded" not in up.text()
        used = run(found["with-up"], clone, env)
        curl = run(found["curl"].replace(":8390/", f":{env['LAYA_HTTP__PORT']}/"), clone, env)
        [example] = MARKED_PYTHON.findall(README.read_text())
        python = subprocess.run([sys.executable, "-c", example], cwd=clone, env=env, capture_output=True,
                                text=True, timeout=120, check=False)
    finally:
        up.close()
    assert used.stdout.startswith("Hello! Send a task and Laya will queue it for the model.\n"), used.stdout
    assert '"route":"model:default"' in used.stdout  # the colours' record, from `laya result "$id" --wait`
    assert '"text":" red, yellow and blue."' in used.stdout, used.stdout
    routes = [orjson.loads(line)["route"] for line in (clone / "results.jsonl").read_bytes().splitlines()]
    assert routes[:2] == ["rule:greeting", "rule:status"] and "rule:ping" in routes, routes
    assert "question 1: [rule:status]" in used.stdout and "question 3: [rule:greeting]" in used.stdout
    chat = orjson.loads(curl.stdout)
    assert chat["choices"][0]["message"]["content"].startswith("Hello!") and chat["laya"]["route"] == "rule:greeting"
    assert python.returncode == 0, python.stderr
    assert python.stdout.startswith("model:default ") and python.stdout.endswith("model:default\n"), python.stdout
    assert python.stdout.startswith("model:default  night\n"), python.stdout

    planned = run(found["plan"], clone, env)
    assert planned.stdout.count("verdict FITS") == 2 and '"verdict": "fits"' in planned.stdout, planned.stdout
    assert (clone / "configs" / "local.toml").exists()


def test_every_example_block_is_run_or_needs_a_real_model() -> None:
    """A new example in these sections must be marked (and so run), unless it needs what a newcomer lacks."""
    text = README.read_text()
    for heading in SECTIONS:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        marked = {body for _, body in MARKED.findall(section)}
        for body in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
            needs = re.search(r"qwen|/models/|pip install|pytest", body, re.IGNORECASE)
            assert body in marked or needs, f"an example under {heading!r} is neither run nor real-model:\n{body}"
