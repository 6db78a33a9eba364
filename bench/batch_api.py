"""The Batch API against `laya batch`: one file of requests through `/v1/batches` and through `laya batch`.

    python bench/batch_api.py [--lines 10000] [--rounds 2]   # writes bench/results/batch_api.md

One Valkey, a router, a worker (the tiny generated model) and `laya serve`, all
real processes on their default settings. Each round sends the same requests
both ways, in turns: as an OpenAI batch file (upload, `batches.create`, poll
until `completed`, download the output) and as a `laya batch` file (`laya batch
IN -o OUT`). Half the lines are answered by rules, a fifth by the cache (warmed
by one request first), the rest by the model (4 tokens each); model prompts carry
the round and the path, so no run answers another's from the cache. Wall time of
each run, from the first byte sent to the last result written; the ratio is the
Batch API's wall over `laya batch`'s, the median over the rounds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from common import cpu_name, host_speed_ms, start_valkey, write_results

BIN = Path(sys.executable).parent
RULES = ["hello", "ping", "opening hours please"]
CACHED = "jello z"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prompts(lines: int, tag: str) -> list[tuple[str, int]]:
    """(content, max_tokens) per line: half rules, a fifth the cached prompt, the rest distinct model prompts."""
    out = []
    for i in range(lines):
        if i % 10 < 5:
            out.append((RULES[i % 3], 16))
        elif i % 10 < 7:
            out.append((CACHED, 4))
        else:
            out.append((f"story {i} {tag} z", 4))
    return out


def run_batch_api(client: object, directory: Path, lines: list[tuple[str, int]], tag: str) -> float:
    data = b"".join(orjson.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"model": "default", "max_tokens": tokens,
                                           "messages": [{"role": "user", "content": content}]}}) + b"\n"
                    for i, (content, tokens) in enumerate(lines))
    started = time.perf_counter()
    file_id = client.files.create(file=(f"{tag}.jsonl", data), purpose="batch").id  # type: ignore[attr-defined]
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",  # type: ignore[attr-defined]
                                  completion_window="24h")
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):  # type: ignore[attr-defined]
        time.sleep(0.2)  # a pipeline polls; more often only adds work to the process running the batch
    assert batch.status == "completed" and batch.request_counts.failed == 0, batch
    output = client.files.content(batch.output_file_id).read()  # type: ignore[attr-defined]
    (directory / f"{tag}.out.jsonl").write_bytes(output)
    took = time.perf_counter() - started
    assert output.count(b"\n") == len(lines), "an output line is missing"
    return took


def run_laya_batch(env: dict[str, str], directory: Path, lines: list[tuple[str, int]], tag: str) -> float:
    source, out = directory / f"{tag}.jsonl", directory / f"{tag}.out.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": f"{tag}-{i}", "max_tokens": tokens,
                                              "messages": [{"role": "user", "content": content}]}) + b"\n"
                                for i, (content, tokens) in enumerate(lines)))
    started = time.perf_counter()
    subprocess.run([str(BIN / "laya"), "batch", str(source), "-o", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = time.perf_counter() - started
    assert out.read_bytes().count(b"\n") == len(lines), "a result line is missing"
    return took


def main() -> None:
    import openai

    from laya.worker.tinymodel import write_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    routes = Path(__file__).resolve().parent.parent / "configs" / "routes.example.toml"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        valkey = start_valkey(directory)
        port = free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAYA_")},
               "LAYA_REDIS_URL": f"redis://127.0.0.1:{valkey.port}", "LAYA_ROUTES": str(routes),
               "LAYA_MODEL_PATH": str(write_tiny_model(directory / "tiny.gguf")), "LAYA_HTTP__PORT": str(port),
               "LAYA_HTTP__FILES_DIR": str(directory / "files"), "LAYA_METRICS__PORT": "0"}
        procs = [subprocess.Popen([str(BIN / "laya"), role], env=env, stdout=subprocess.DEVNULL,
                                  stderr=open(directory / f"{role}.log", "wb"))  # noqa: SIM115
                 for role in ("router", "worker", "serve")]
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=10)
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.chat.completions.create(model="default", max_tokens=4,
                                                   messages=[{"role": "user", "content": CACHED}])
                    break
                except openai.APIConnectionError:
                    assert time.monotonic() < deadline, "laya serve did not start"
                    time.sleep(0.2)
            rounds = []
            for n in range(args.rounds):
                api = run_batch_api(client, directory, prompts(args.lines, f"api{n}"), f"api{n}")
                plain = run_laya_batch(env, directory, prompts(args.lines, f"cli{n}"), f"cli{n}")
                rounds.append((api, plain))
                print(f"round {n + 1}: /v1/batches {api:.2f} s, laya batch {plain:.2f} s, ratio {api / plain:.3f}",
                      flush=True)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
            valkey.stop()
    ratio = statistics.median(api / plain for api, plain in rounds)
    lines = ["# The Batch API against `laya batch`", "",
             (f"`python bench/batch_api.py --lines {args.lines} --rounds {args.rounds}`; {cpu_name()}, "
             f"{os.cpu_count()} CPUs (a pure-Python loop of a million additions: {host_speed_ms()} ms)."), "",
             (f"{args.lines:,} chat requests per run (half rules, a fifth the cached prompt, the rest the tiny model, "
             "4 tokens); a router, a worker and `laya serve` on their defaults; the batch polled every 0.2 s."), "",
             "| round | `/v1/batches` (s) | `laya batch` (s) | ratio |", "|---:|---:|---:|---:|",
             *(f"| {n + 1} | {api:.2f} | {plain:.2f} | {api / plain:.3f} |" for n, (api, plain) in enumerate(rounds)),
             "", f"Median ratio **{ratio:.3f}** (target ≤ 1.05: {'met' if ratio <= 1.05 else 'NOT met'})."]
    write_results("batch_api.md", lines, f"{args.lines} lines, median ratio {ratio:.3f} over {args.rounds} rounds")


if __name__ == "__main__":
    main()
