"""The container files: what they run must be commands Laya accepts, with the guarantees the README gives.

No Docker daemon runs where the tests run, so this checks the files themselves;
`docker-compose config` and hadolint validate their syntax (README, "Containers").
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from laya.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def laya_args(command: list[str]) -> list[str]:
    """``["CMD", "laya", "health", ...]`` → the arguments after ``laya``."""
    assert command[:2] == ["CMD", "laya"], command
    return command[2:]


def test_every_healthcheck_is_a_laya_health_command_that_parses() -> None:
    services = compose()["services"]
    for name in ("router", "serve", "worker", "worker-cuda"):
        args = build_parser().parse_args(laya_args(services[name]["healthcheck"]["test"]))
        assert args.command == "health" and args.quiet
        assert args.role == ("worker" if name.startswith("worker") else "router")
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (ROOT / dockerfile).read_text()
        check = re.search(r"^HEALTHCHECK .* CMD (\[.*\])$", text, re.MULTILINE)
        assert check is not None, dockerfile
        args = build_parser().parse_args(yaml.safe_load(check.group(1))[1:])
        assert args.command == "health"


def test_services_run_laya_roles_on_valkey_with_aof() -> None:
    services = compose()["services"]
    valkey = services["valkey"]
    assert valkey["image"].startswith("valkey/valkey:")
    assert "--appendonly yes" in shlex.join(valkey["command"]).replace("'", "")
    assert any(v.endswith(":/data") for v in valkey["volumes"])
    assert services["router"]["command"] == ["router"]
    assert services["serve"]["command"] == ["serve"] and services["serve"]["ports"] == ["127.0.0.1:8390:8390"]
    assert services["serve"]["environment"]["LAYA_HTTP__BIND"] == "0.0.0.0"
    for name in ("worker", "worker-cuda"):
        worker = services[name]
        assert worker["command"] == ["worker"]
        assert worker["environment"]["LAYA_MODEL_PATH"].startswith("/models/")
        assert any(v.endswith(":/models:ro") for v in worker["volumes"])
        assert worker["depends_on"]["valkey"]["condition"] == "service_healthy"
    assert services["worker"]["profiles"] == ["cpu"]
    assert services["worker-cuda"]["profiles"] == ["cuda"]
    devices = services["worker-cuda"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


def test_prometheus_scrapes_the_ports_compose_publishes() -> None:
    services = compose()["services"]
    published = {port.rsplit(":", 2)[-2] for name in ("router", "worker") for port in services[name]["ports"]}
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {t.rsplit(":", 1)[1] for job in scrape["scrape_configs"] for group in job["static_configs"]
               for t in group["targets"]}
    assert targets == published == {"9464", "9465"}


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_images_install_llama_cpp_python_the_documented_way(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    assert re.search(r'CMAKE_ARGS="[^"]*"\s*(\\\n)?\s*\S*pip install', text), "build options go in CMAKE_ARGS"
    if dockerfile.endswith("cuda"):
        assert "-DGGML_CUDA=on" in text
    assert "LAYA_METRICS__BIND=0.0.0.0" in text  # Prometheus scrapes from outside the container
