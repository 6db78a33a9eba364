"""Planner accuracy: predicted worker memory vs the measured resident set of a loaded worker.

    python bench/planner_rss.py            # writes bench/results/planner_rss.md

For a generated ~60 MB model (512-dim, 8 layers) at three context sizes, each
measurement runs in a fresh process that does what `laya worker` does —
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

CONTEXTS = (512, 2048, 8192)
RUNS = 3
RESULTS = Path(__file__).resolve().parent / "results" / "planner_rss.md"

CHILD = r"""
import json, sys, time
from laya.config import Settings
from laya.worker import plan_and_load, resident_bytes
from laya.schema import Request
baseline = resident_bytes()
settings = Settings.model_validate({"model": {"path": sys.argv[1]}, "runtime": {"max_seq_len": int(sys.argv[2])}})
backend, plan = plan_and_load(settings)
# A prompt that fills the window touches every page of the KV cache and compute buffers: the worst case.
backend.generate(Request(prompt="x" * (int(sys.argv[2]) - 80)), max_tokens=16,
                 deadline=time.monotonic() + 60, on_token=lambda n: None)
print(json.dumps({"baseline": baseline, "rss": resident_bytes(), "predicted": plan.ram_predicted,
                  "kv": plan.kv_cache, "n_ctx": backend.n_ctx}))
"""


def measure(model: Path, ctx: int) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(model), str(ctx)], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    from laya.tinymodel import TinyModelSpec, write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "m60.gguf", TinyModelSpec(dim=512, n_layer=8, n_head=8, n_head_kv=4,
                                                                        ff=2048))
        size_mib = model.stat().st_size / 2**20
        rows = []
        for ctx in CONTEXTS:
            runs = [measure(model, ctx) for _ in range(RUNS)]
            rss = statistics.median(r["rss"] for r in runs)
            base = statistics.median(r["baseline"] for r in runs)
            predicted = runs[0]["predicted"]
            error = (predicted - rss) / rss
            rows.append((ctx, runs[0]["kv"], base, rss, max(r["rss"] for r in runs), predicted, error))
    mib = 2**20
    lines = [f"# Planner vs measured RSS ({size_mib:.0f} MB generated model, 512-dim, 8 layers, f16)", "",
             f"Median of {RUNS} fresh processes per context; `max` is the largest of them. Baseline: the same",
             "process after its imports, before the model loads.", "",
             "| ctx | KV planned (MiB) | baseline RSS | measured RSS (median) | max | predicted | error |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for ctx, kv, base, rss, top, predicted, error in rows:
        lines.append(f"| {ctx} | {kv / mib:.1f} | {base / mib:.0f} | {rss / mib:.0f} | {top / mib:.0f} | "
                     f"{predicted / mib:.0f} | {error:+.1%} |")
    worst = max(abs(r[-1]) for r in rows)
    lines += ["", f"Worst error {worst:.1%} (target ±10 %): {'met' if worst <= 0.10 else 'NOT met'}."]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
