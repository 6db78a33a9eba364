"""The ``laya`` command: thin wrappers that parse arguments, load config, call one ``run_*``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import orjson

from laya.config import Settings, load_settings
from laya.errors import ConfigError, LayaError

__all__ = ["main"]

STATE_DIR = Path(".laya")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _client(settings: Settings) -> Any:
    from laya.client import Client
    from laya.connection import connect

    return Client(connect(settings), prefix=settings.redis.prefix)


def _print_result(result: Any, as_json: bool) -> int:
    if as_json:
        print(orjson.dumps(result.model_dump(exclude_none=True)).decode())
    elif result.ok:
        print(result.text)
    else:
        print(f"{result.route}: {result.error.message if result.error else ''}", file=sys.stderr)
    return 0 if result.ok else 1


def cmd_router(args: argparse.Namespace) -> int:
    from laya.connection import connect
    from laya.router import run_router

    settings = _settings(args)
    run_router(settings, connect(settings, wait=True))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from laya.connection import connect
    from laya.worker import run_worker

    settings = _settings(args)
    run_worker(settings, connect(settings, wait=True), burst=args.burst, force=args.force)
    return 0


def _machine(args: argparse.Namespace) -> Any:
    from laya.machine import detect_machine, parse_size

    try:
        ram = parse_size(args.ram) if args.ram else None
        vram = parse_size(args.vram) if args.vram else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return detect_machine().with_overrides(ram=ram, vram=vram)


def cmd_plan(args: argparse.Namespace) -> int:
    from laya.modelfile import read_model_info
    from laya.planner import make_plan, plan_input

    settings = _settings(args)
    model_path = args.model or settings.model.path
    if model_path is None:
        raise ConfigError("no model to plan: pass --model PATH or set model.path")
    inp = plan_input(settings, ctx=args.ctx, n_seq=args.parallel, kv_type=args.kv, n_gpu_layers=args.gpu_layers,
                     offload_policy=args.offload)
    plan = make_plan(read_model_info(model_path), _machine(args), inp)
    print(orjson.dumps(plan.to_dict(), default=str, option=orjson.OPT_INDENT_2).decode() if args.json
          else plan.table())
    return 1 if plan.verdict == "refuse" else 0


def cmd_init(args: argparse.Namespace) -> int:
    from laya.init import choose, render_config
    from laya.planner import plan_input

    machine = _machine(args)
    settings = load_settings(None, environ={})
    plan = choose(args.model, machine, plan_input(settings)) if args.model else None
    if args.output.exists() and not args.force:
        raise ConfigError(f"{args.output} exists; pass --force to overwrite it")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render_config(machine, args.model, plan))
    print(f"wrote {args.output}" + (f" (plan: {plan.verdict})" if plan else ""))
    if plan is not None and plan.verdict == "refuse":
        print(plan.table(), file=sys.stderr)
        return 1
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from laya.stack import Stack

    stack = Stack(_settings(args), STATE_DIR, config_path=args.config)
    stack.handle_signals()  # Ctrl-C (or SIGTERM) from here on: router and worker stop first, the server last
    try:
        stack.start()
        if stack.wait_ready(timeout=args.ready_timeout):
            print(f"laya is up on {stack.url}: `laya submit --wait \"...\"` to try it; Ctrl-C stops it.",
                  file=sys.stderr)
            stack.serve_forever()
    finally:
        stack.stop()
    print("laya stopped.", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from laya.demo import run_demo

    return run_demo(_settings(args), STATE_DIR, config_path=args.config, n_model=args.requests)


def cmd_submit(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt not in (None, "-") else sys.stdin.read()
    params: dict[str, Any] = {"model": args.model, "max_tokens": args.max_tokens,
                              "temperature": args.temperature}
    client = _client(_settings(args))
    request_id = client.submit(prompt, **{k: v for k, v in params.items() if v is not None})
    if not args.wait:
        print(request_id)
        return 0
    return _print_result(client.wait(request_id, timeout=args.timeout), args.json)


def cmd_result(args: argparse.Namespace) -> int:
    client = _client(_settings(args))
    result = client.wait(args.id, timeout=args.timeout) if args.wait else client.result(args.id)
    if result is None:
        print(f"no result for {args.id} (yet)", file=sys.stderr)
        return 2
    return _print_result(result, as_json=True)


def cmd_batch(args: argparse.Namespace) -> int:
    from laya.batch import read_batch, run_batch

    out = args.output or args.input.with_suffix(".out.jsonl")
    batch = read_batch(args.input)  # a missing input is reported before Redis is needed
    summary = run_batch(_client(_settings(args)), batch, out, window=args.window, timeout=args.timeout)
    print(summary.table())
    print(f"results: {out}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from laya.keys import Keys

    settings = _settings(args)
    client = _client(settings)
    keys = Keys(settings.redis.prefix)
    rows: dict[str, Any] = {k.decode(): v.decode() for k, v in sorted(client.redis.hgetall(keys.router_stats).items())}
    for name, value in sorted(client.redis.hgetall(keys.worker_stats).items()):
        rows[f"worker:{name.decode()}"] = orjson.loads(value)
    if args.json:
        print(orjson.dumps(rows).decode())
    else:
        for key, value in rows.items():
            print(f"{key:<32} {value}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from laya.benchmark import run_routing_bench

    result = run_routing_bench(n_rules=args.rules, cache_entries=args.cache_entries, requests=args.requests)
    print(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode() if args.json else result.table())
    return 0


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(value: str) -> str:
    """``--log-level``, checked while parsing: argparse reports a bad one in its usual short error."""
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laya", description="Local LLM job router on Redis and RQ.")
    parser.add_argument("--config", "-c", help="TOML config file (default: $LAYA_CONFIG, else built-in defaults)")
    parser.add_argument("--log-level", default="INFO", type=_log_level, metavar="LEVEL",
                        help=f"{', '.join(LOG_LEVELS)} (any case; default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("router", help="run an ingress router").set_defaults(func=cmd_router)
    p = sub.add_parser("worker", help="run a GPU worker (loads the model, then serves its queue)")
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    p.add_argument("--force", action="store_true", help="load even when the memory plan refuses")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("plan", help="memory plan for a model on this (or a given) machine, before loading")
    p.add_argument("--model", type=Path, help="GGUF file (default: model.path)")
    p.add_argument("--ctx", type=int, help="tokens per sequence (default: runtime.max_seq_len)")
    p.add_argument("--parallel", type=int, help="sequences (default: runtime.n_parallel)")
    p.add_argument("--kv", choices=["f16", "q8_0", "q4_0"], help="KV cache type")
    p.add_argument("--gpu-layers", type=int, help="layers on the GPU (-1 = all)")
    p.add_argument("--offload", choices=["disabled", "explicit"], help="offload policy")
    p.add_argument("--ram", help="plan for this much free RAM, e.g. 32GiB")
    p.add_argument("--vram", help="plan for one GPU with this much free memory, e.g. 8GiB (0: no GPU)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("init", help="write a config for this machine (and a model)")
    p.add_argument("--model", type=Path, help="GGUF file to size the config for")
    p.add_argument("-o", "--output", type=Path, default=Path("configs/local.toml"))
    p.add_argument("--ram", help="plan for this much free RAM instead of what is detected")
    p.add_argument("--vram", help="plan for one GPU with this much memory (0: no GPU)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("up", help="start everything: embedded Valkey (if no URL), router, worker; "
                                  "restart a router or worker that dies")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for the worker")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("demo", help="run the whole flow on sample data and print the route summary")
    p.add_argument("--requests", type=int, default=40, help="model requests in the sample (default 40)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("submit", help="submit a prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt; '-' or nothing reads stdin")
    p.add_argument("--model")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--wait", action="store_true", help="wait for the result and print it")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", action="store_true", help="print the whole result record")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("result", help="print the result record of a request id")
    p.add_argument("id")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(func=cmd_result)
    p = sub.add_parser("batch", help="process a JSONL file of requests")
    p.add_argument("input", type=Path)
    p.add_argument("-o", "--output", type=Path, help="results file (default: INPUT.out.jsonl)")
    p.add_argument("--window", type=int, default=256, help="requests in flight at once")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this long without progress")
    p.set_defaults(func=cmd_batch)
    p = sub.add_parser("bench", help="measure the router's decision time on this machine")
    p.add_argument("what", choices=["routing"])
    p.add_argument("--rules", type=int, default=1000, help="synthetic rules, a quarter of each kind")
    p.add_argument("--cache-entries", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("stats", help="router counters, latency percentiles and queue depths")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args))
    except LayaError as exc:
        print(f"laya {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"laya {args.command}: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
