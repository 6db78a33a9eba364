"""Which ways of loading a quantised model crash on this machine, and what extra buffers cost.

    python bench/load_probe.py                          # CPU: Qwen2.5-1.5B shapes, 28 layers, Q4_K_M
    python bench/load_probe.py --gpu-layers -1 --shape qwen2.5-7b --out bench/results/load_probe_cuda.md

Each case runs in a fresh process (a crash in llama.cpp kills the whole process):
it loads a generated model with real shapes (:mod:`tests.shapedmodel`, answers that
never stop), evaluates a 64-token prompt and decodes ``--tokens`` tokens greedily,
and reports how it ended (``ok``, or the signal that killed it), the load time and
the decode rate. The cases vary what issue 12 suspected: llama.cpp's CPU extra
buffer types (on, off, Laya's ``auto``), whether numpy is imported before
``llama_cpp``, and llama.cpp's verbosity. With ``--backtrace`` a crashing case is
run again under ``cuda-gdb`` or ``gdb`` (whichever exists) for its native stack.
Decode rates are medians of ``--runs`` processes per case; the baseline is the
plain ``Llama()`` load of the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

RESULTS = Path(__file__).resolve().parent / "results"

CASES: dict[str, str] = {
    "raw Llama(), llama_cpp imported first": "raw:default:first",
    "raw Llama(), numpy imported first": "raw:default:numpy",
    "raw Llama(), numpy first, verbose": "raw:default:numpy-verbose",
    "raw Llama(), extra buffers on": "raw:on:first",
    "raw Llama(), extra buffers off": "raw:off:first",
    "Laya LlamaBackend, cpu_extra_buffers auto": "laya:auto:numpy",
    "Laya LlamaBackend, cpu_extra_buffers on": "laya:on:numpy",
    "Laya LlamaBackend, cpu_extra_buffers off": "laya:off:numpy",
}

CHILD = r"""
import json, sys, time
kind, buffers, order = sys.argv[2].split(":")
if order.startswith("numpy"):
    import numpy, pydantic  # what `laya worker` has imported before llama_cpp
import llama_cpp
model, gpu_layers, tokens = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
started = time.monotonic()
if kind == "raw":
    from contextlib import nullcontext
    from laya.worker.backend import _model_params
    params = nullcontext() if buffers == "default" else _model_params(use_extra_bufts=buffers == "on")
    with params:
        llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_gpu_layers=gpu_layers,
                              verbose=order.endswith("verbose"))
else:
    from laya.worker.backend import LlamaBackend
    from laya.config import Settings
    settings = Settings.model_validate({"model": {"path": model, "n_gpu_layers": gpu_layers,
                                                  "cpu_extra_buffers": buffers},
                                        "runtime": {"max_seq_len": 1024}})
    llm = LlamaBackend(settings).llm
loaded = time.monotonic() - started
prompt = llm.tokenize(b"q" * 63, add_bos=True)
out, first = [], None
for token in llm.generate(prompt, temp=0.0):
    now = time.monotonic()
    first = first or now
    out.append(token)
    if len(out) >= tokens:
        break
rate = (len(out) - 1) / (now - first) if len(out) > 1 else 0.0
print(json.dumps({"load_s": loaded, "tok_s": rate, "text": llm.detokenize(out[:12]).decode()}))
"""


def run_case(model: Path, spec: str, gpu_layers: int, tokens: int) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model), spec, str(gpu_layers), str(tokens)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 0:
        return {"outcome": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}
    if proc.returncode < 0:
        outcome = f"killed by {signal.Signals(-proc.returncode).name}"
    else:
        outcome = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:120]}"
    return {"outcome": outcome}


def backtrace(model: Path, spec: str, gpu_layers: int, tokens: int) -> str:
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if debugger is None:
        return "(no gdb or cuda-gdb on this machine)"
    try:
        proc = subprocess.run([debugger, "-batch", "-ex", "run", "-ex", "bt 40", "-ex", "info sharedlibrary",
                               "--args", sys.executable, "-c", CHILD, str(model), spec, str(gpu_layers), str(tokens)],
                              capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        return f"({debugger} did not finish in 180 s)"
    lines = [line for line in proc.stdout.splitlines()
             if line.startswith(("#", "0x")) or "signal" in line.lower() or "blas" in line.lower()]
    return "\n".join(lines[-80:])


def main() -> None:
    from laya.memory.machine import cpu_flags
    from tests.shapedmodel import SHAPES, write_shaped_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, help="layers to write (default: all of the shape's)")
    parser.add_argument("--quant", default="Q4_K_M", choices=["Q4_K_M", "Q8_0", "F16"])
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="processes per case that loaded (for the median)")
    parser.add_argument("--backtrace", action="store_true", help="native stack of the first case that crashes")
    parser.add_argument("--cases", help="comma-separated numbers of the cases to run (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS / "load_probe_cpu.md")
    args = parser.parse_args()

    shape = SHAPES[args.shape].with_layers(args.layers or SHAPES[args.shape].n_layer)
    flags = cpu_flags()
    cpu = "AMX" if {"amx_int8", "amx_tile"} & flags else ("AVX-512" if "avx512f" in flags else "no AMX")
    with tempfile.TemporaryDirectory() as tmp:
        model = write_shaped_model(Path(tmp) / "probe.gguf", shape, args.quant, stops=False)
        lines = [(f"# Load probe: {shape.name} shapes, {shape.n_layer} layers, {args.quant}, n_gpu_layers "
                  f"{args.gpu_layers}"), "",
                 f"CPU: {cpu}. Each case is a fresh process: load, 64-token prompt, {args.tokens} greedy tokens.",
                 f"Decode rate: median of up to {args.runs} processes.", "",
                 "| case | outcome | load s | decode tok/s | first tokens |", "|---|---|---:|---:|---|"]
        traces: list[str] = []
        chosen = [int(n) for n in args.cases.split(",")] if args.cases else range(1, len(CASES) + 1)
        for number, (name, spec) in enumerate(CASES.items(), start=1):
            if number not in chosen:
                continue
            runs = [run_case(model, spec, args.gpu_layers, args.tokens)]
            if runs[0]["outcome"] == "ok":
                runs += [run_case(model, spec, args.gpu_layers, args.tokens) for _ in range(args.runs - 1)]
            ok = [r for r in runs if r["outcome"] == "ok"]
            outcome = runs[0]["outcome"] if not ok else f"ok {len(ok)} of {len(runs)}"
            load = f"{statistics.median(float(r['load_s']) for r in ok):.2f}" if ok else "-"  # type: ignore[arg-type]
            rate = f"{statistics.median(float(r['tok_s']) for r in ok):.1f}" if ok else "-"  # type: ignore[arg-type]
            text = repr(ok[0]["text"]) if ok else ""
            lines.append(f"| {name} | {outcome} | {load} | {rate} | {text} |")
            print(lines[-1], flush=True)
            if not ok and args.backtrace and not traces:
                traces.append(f"## {name}\n\n```\n{backtrace(model, spec, args.gpu_layers, args.tokens)}\n```")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines + [""] + traces) + "\n")
    print("\n".join(lines + traces))


if __name__ == "__main__":
    main()
