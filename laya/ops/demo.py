"""``laya demo``: the whole flow on sample data, start to finish, on this machine.

It starts an embedded Valkey on a free port, a router and a worker, writes
the sample batch ``.laya/demo-requests.jsonl`` (:func:`sample_lines`) and sends
it twice — the first pass answers rule hits at once and queues model jobs; the
second pass repeats it and is answered from the cache — then prints how every
request was routed and stops everything. It says which file it sends and which
rules answer, so what a newcomer sees can be reproduced with ``laya batch``.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import orjson

from laya.batch import read_batch, run_batch
from laya.client import Client
from laya.config import Settings
from laya.connection import connect
from laya.ops.stack import Stack
from laya.router.rules import EXAMPLE_ROUTES

__all__ = ["RULE_LINES", "run_demo", "sample_lines"]

RULE_LINES = ["hello", "Ping?", "What are your opening hours?", "echo: Laya routes in microseconds"]
"""The sample lines the example rules answer (greeting, ping, status, echo)."""


QUESTIONS = [
    "What is the capital of France?", "What is the capital of Japan?", "What do bees make?",
    "What is the opposite of hot?", "Who wrote Romeo and Juliet?", "What colour is the sky on a clear day?",
    "What is the capital of Spain?", "What is the opposite of up?", "What is the capital of Germany?",
    "What animal says moo?",
]
"""Questions the bundled base model answers in a few words (it completes text; it was not tuned to chat)."""


def model_line(number: int) -> dict[str, object]:
    """The ``number``-th model request: a question in a layout a base model completes, one line of answer.

    After the first pass through :data:`QUESTIONS` each asks again "in other words": the text differs, so
    each line is its own request, and the answer is still a fact.
    """
    question = QUESTIONS[number % len(QUESTIONS)]
    if number >= len(QUESTIONS):
        question = f"{question} (asked again, {number // len(QUESTIONS)})"
    return {"prompt": f"Question: {question}\nAnswer:", "max_tokens": 16, "stop": ["\n"]}


def sample_lines(n_model: int) -> list[bytes]:
    """Sample JSONL: rule hits, model jobs (some sent by a rule), one invalid and one non-JSON line."""
    lines: list[object] = list(RULE_LINES)
    lines += [model_line(i) for i in range(n_model)]
    lines += [{"prompt": "Summarize: the queue is the backpressure", "max_tokens": 16, "stop": ["\n"]}]
    lines += [{"prompt": 42}]
    encoded = [orjson.dumps(line) for line in lines]
    encoded.append(b"this line is not JSON")
    return encoded


def run_demo(settings: Settings, state_dir: Path, *, config_path: str | None, n_model: int) -> int:
    extra_env = {}
    routes = settings.router.routes_file
    if routes is None and EXAMPLE_ROUTES.exists():
        extra_env["LAYA_ROUTES"] = str(EXAMPLE_ROUTES)
        routes = EXAMPLE_ROUTES
    state_dir.mkdir(parents=True, exist_ok=True)
    sample = state_dir / "demo-requests.jsonl"
    lines = sample_lines(n_model)
    sample.write_bytes(b"\n".join(lines) + b"\n")
    print(f"sample batch: {sample}, {len(lines)} lines: {len(RULE_LINES)} that rules answer, {n_model + 1} for the "
          "model (one sent there by a rule), one invalid request and one line that is not JSON; sent twice.\n"
          f"rules: {routes if routes is not None else 'none (router.routes_file is not set)'}", file=sys.stderr)
    with Stack(settings, state_dir, config_path=config_path, free_port=True, extra_env=extra_env,
               front_door=False) as stack:
        stack.wait_ready(timeout=120)
        demo_settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": stack.url})})
        client = Client(connect(demo_settings), prefix=settings.redis.prefix)
        first = ("first pass: rules answer at once, the rest queue for the model "
                 "(or come from the cache, if an earlier demo asked the same)")
        for number, label in ((1, first),
                              (2, "second pass, same requests: model answers now come from the cache")):
            out = state_dir / f"demo-results-{number}.jsonl"
            print(f"\n== {label}", flush=True)
            # Ids of this pass's own: the same line of the same file is otherwise the same request, and the
            # second pass would collect the first pass's answers instead of showing the cache.
            this_pass = read_batch(sample, scope=f"demo {uuid.uuid4().hex} pass {number}")
            summary = run_batch(client, this_pass, out, window=64, timeout=120)
            print(summary.table())
        print(f"\nresults: {out}")
        for line in out.read_bytes().splitlines()[:6]:
            record = orjson.loads(line)
            shown = record.get("text") or (record.get("error") or {}).get("message", "")
            print(f"  line {record['line']:>3}  {record['route']:<24} {str(shown)[:60]!r}")
    print("\ndemo finished; everything is stopped.", file=sys.stderr)
    return 0
