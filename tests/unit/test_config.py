from __future__ import annotations

from pathlib import Path

import pytest

from laya.config import load_settings, redact_url
from laya.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_defaults_are_desktop_safe() -> None:
    settings = load_settings(None, environ={})
    assert settings.runtime.max_seq_len == 2048
    assert settings.runtime.n_parallel == 1
    assert settings.memory.offload_policy == "disabled"
    assert settings.redis.effective_url == "redis://127.0.0.1:6390/0"


@pytest.mark.parametrize("name", ["desktop-8gb.toml", "server-24gb.toml", "cpu-only.toml"])
def test_shipped_configs_load(name: str) -> None:
    settings = load_settings(CONFIGS / name, environ={})
    assert settings.router.routes_file == (CONFIGS / "routes.example.toml")
    assert settings.router.routes_file.exists()


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[runtime]\nmax_seq_len = 4096\n")
    settings = load_settings(None, environ={
        "LAYA_CONFIG": str(config), "LAYA_REDIS_URL": "rediss://u:secret@h:6380/1",
        "LAYA_RUNTIME__JOB_TIMEOUT_S": "30"})
    assert settings.runtime.max_seq_len == 4096
    assert settings.runtime.job_timeout_s == 30
    assert settings.redis.url == "rediss://u:secret@h:6380/1"
    assert redact_url(settings.redis.url) == "rediss://u:***@h:6380/1"


@pytest.mark.parametrize(("body", "expected"), [
    ("[runtime]\nn_parallel = 4\n", "runtime.n_parallel = 4"),
    ("[runtime]\nmax_seq_len = 8\n", "runtime.max_seq_len = 8"),
    ("[memory]\noffload_policy = \"auto\"\n", "memory.offload_policy = 'auto'"),
    ("[router]\nmax_batch = 32\n", "router.max_batch"),
    ("[redis]\nurl = \"http://x\"\n", "redis.url = 'http://x'"),
    ("[runtime\n", "not valid TOML"),
])
def test_bad_config_names_file_field_value_and_reason(tmp_path: Path, body: str, expected: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_settings(config, environ={})
    assert str(config) in info.value.message
    assert expected in info.value.message


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "none.toml", environ={})
