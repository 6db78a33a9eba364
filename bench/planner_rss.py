"""Planner accuracy: predicted worker memory vs the measured resident set of a loaded worker.

    python bench/planner_rss.py            # writes bench/results/planner_rss.md
    python bench/planner_rss.py gemma      # only the rows whose model names it: planner_rss_gemma.md

For a generated ~60 MB F16 model (512-dim, 8 layers) at three context sizes,
for the real Gemma 3 270M of the [model] extra (sliding-window layers) at two,
and for models with real shapes and quantisations (Qwen2.5-1.5B in Q4_K_M and
Qwen3-0.6B in Q8_0, all layers, tests.shapedmodel) with llama.cpp's CPU extra
buffers on and off, each measurement runs in a fresh process that does what `laya worker` does —
imports, plans, loads the model through the worker's own loading code — then
generates once (so compute buffers and the KV cache are touched) and reads
VmRSS. The prompt nearly fills the context, so the KV cache and the compute
buffers are fully touched: the worst case a worker reaches. The baseline is
the same process's RSS after imports, before loading.
Target: predicted total within ±10 % of the measured RSS.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: laya, and tests' model writers

CONTEXTS = (512, 2048, 8192)
RUNS = 3
RESULTS = Path(__file__).resolve().parent / "results" / "planner_rss.md"

CHILD = r"""
import json, sys, time
from laya.config import Settings
from laya.worker.backend import Controls
from laya.memory.machine import resident_bytes
from laya.worker.rqworker import plan_and_load
from laya.schema import Request
baseline = resident_bytes()
settings = Settings.model_validate({"model": {"path": sys.argv[1], "cpu_extra_buffers": sys.argv[3]},
                                    "runtime": {"max_seq_len": int(sys.argv[2])}})
backend, plan = plan_and_load(settings)
# A prompt that fills the window touches every page of the KV cache and compute buffers: the worst case.
sentence = "The queue is the backpressure: one job at a time per GPU. "
per = len(backend.llm.tokenize(sentence.encode(), add_bos=False))
backend.generate(Request(prompt=sentence * ((backend.n_ctx - 100) // per)), max_tokens=16,
                 controls=Controls(deadline=time.monotonic() + 300, on_token=lambda n: None))
print(json.dumps({"baseline": baseline, "rss": resident_bytes(), "predicted": plan.ram_predicted,
                  "kv": plan.kv_cache, "n_ctx": backend.n_ctx}))
"""


def measure(model: Path, ctx: int, buffers: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(model), str(ctx), buffers], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    from laya.ops.bundled import bundled_model
    from laya.worker.tinymodel import TinyModelSpec, write_tiny_model
    from tests.shapedmodel import SHAPES, write_shaped_model

    mib = 2**20
    lines = ["# Planner vs measured RSS", "",
             f"Median of {RUNS} fresh processes per row; `max` is the largest of them. Baseline: the same",
             "process after its imports, before the model loads. Extra buffers: llama.cpp's CPU extra buffer",
             "types (`model.cpu_extra_buffers`); `auto` resolves to on for a CPU without AMX.", "",
             ("| model | extra buffers | ctx | KV planned (MiB) | baseline RSS | measured RSS (median) | max | "
              "predicted | error |"), "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    results = RESULTS
    only = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory() as tmp:
        tiny = write_tiny_model(Path(tmp) / "m60.gguf", TinyModelSpec(dim=512, n_layer=8, n_head=8, n_head_kv=4,
                                                                       ff=2048))
        cases = [(f"generated {tiny.stat().st_size / 1e6:.0f} MB F16, 512-dim, 8 layers", tiny, ctx, "auto")
                 for ctx in CONTEXTS]
        for shape, quant in (("qwen2.5-1.5b", "Q4_K_M"), ("qwen3-0.6b", "Q8_0")):
            if only is not None and only.lower() not in shape:
                continue  # writing a full-size shaped model takes a while
            path = write_shaped_model(Path(tmp) / f"{shape}-{quant}.gguf", SHAPES[shape], quant)  # type: ignore[arg-type]
            label = f"{shape} shapes, {quant}, {path.stat().st_size / 1e6:,.0f} MB"
            cases += [(label, path, 2048, buffers) for buffers in ("on", "off")]
        gemma = bundled_model(Path(tmp))
        if gemma is not None:
            cases += [("Gemma 3 270M (the [model] extra), Q4_K_M, 253 MB", gemma, ctx, "auto") for ctx in (2048, 8192)]
        if only is not None:
            cases = [case for case in cases if only.lower() in case[0].lower()]
            results = RESULTS.with_name(f"planner_rss_{only.lower()}.md")
        for label, model, ctx, buffers in cases:
            runs = [measure(model, ctx, buffers) for _ in range(RUNS)]
            rss = statistics.median(r["rss"] for r in runs)
            base = statistics.median(r["baseline"] for r in runs)
            predicted = runs[0]["predicted"]
            error = (predicted - rss) / rss
            errors.append(abs(error))
            lines.append(f"| {label} | {buffers} | {ctx} | {runs[0]['kv'] / mib:.1f} | {base / mib:.0f} | "
                         f"{rss / mib:.0f} | {max(r['rss'] for r in runs) / mib:.0f} | {predicted / mib:.0f} | "
                         f"{error:+.1%} |")
            print(lines[-1], flush=True)
    worst = max(errors)
    lines += ["", f"Worst error {worst:.1%} (target ±10 %): {'met' if worst <= 0.10 else 'NOT met'}."]
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
