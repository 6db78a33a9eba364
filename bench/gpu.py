"""GPU benchmark: raw llama-cpp-python against Laya's worker, same model, same machine, one run.

    python bench/gpu.py                     # writes bench/results/gpu.md (needs a CUDA build of llama-cpp-python)
    python bench/gpu.py --model my.gguf     # your own model instead of the generated one

The model is generated: Qwen2.5-7B-Instruct's shapes in Q4_K_M (4.4 GiB; random
steered weights whose answers never end, :mod:`tests.shapedmodel`), so decoding
always runs to ``max_tokens``. Both sides load it with every layer on the GPU,
n_ctx 2048, n_batch 512, f16 KV cache, each in its own process, one after the other:

* **raw**: ``Llama()`` and its ``generate()`` loop, in-process;
* **laya**: an embedded Valkey, ``laya router`` and ``laya worker``; jobs go
  through ``Client.ask`` (XADD, router, RQ, worker, result record).

Each side runs ``--jobs`` single jobs (a distinct ~900-token prompt each, 256
tokens, greedy), then 32 jobs back to back (laya: all submitted at once; raw: a
loop). Reported: TTFT and decode tok/s (medians), wall time per job (median and
max), the 32-job burst's completion tokens per second, and VRAM in use after the
jobs (``nvidia-smi``, minus what was in use before the process started) against
the GPU total of ``laya plan`` (margin excluded).

Targets (issue 12): Laya/raw decode ≥ 0.98; Laya's added wall time per job ≤ 2 ms;
burst ≥ 0.97× raw throughput; VRAM within ±5 % of the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

RESULTS = Path(__file__).resolve().parent / "results"
N_CTX, N_BATCH = 2048, 512
MAX_TOKENS = int(os.environ.get("LAYA_BENCH_TOKENS", "256"))  # fewer for a dry run on a CPU
BURST = int(os.environ.get("LAYA_BENCH_BURST", "32"))
FILLER = "the queue is the backpressure and one job at a time runs on each gpu "


def prompt(i: int) -> str:
    """A distinct prompt of about 900 tokens (the generated model's vocabulary is bytes)."""
    return (f"{i:05d} " + FILLER * 14)[:900]


def vram_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


# -- raw side: runs in a child process -------------------------------------------------------------

def run_raw(model: str, jobs: int) -> dict[str, object]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, n_gpu_layers=-1, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                          verbose=False)

    def one(i: int) -> dict[str, float]:
        started = time.perf_counter()
        tokens = llm.tokenize(prompt(i).encode(), add_bos=True)
        count, first, last = 0, started, started
        text = bytearray()
        for token in llm.generate(tokens, temp=0.0):
            if token == llm.token_eos():
                break
            last = time.perf_counter()
            if count == 0:
                first = last
            count += 1
            text += llm.detokenize([token])
            if count >= MAX_TOKENS:
                break
        text.decode("utf-8", errors="replace")
        return {"wall_ms": (time.perf_counter() - started) * 1000, "ttft_ms": (first - started) * 1000,
                "tok_s": (count - 1) / (last - first), "tokens": count}

    one(10**6)  # warm-up: CUDA kernels, graph allocation
    singles = [one(i) for i in range(jobs)]
    started = time.perf_counter()
    burst = [one(1000 + i) for i in range(BURST)]
    burst_s = time.perf_counter() - started
    return {"singles": singles, "burst_tok_s": sum(b["tokens"] for b in burst) / burst_s,
            "vram_mib": vram_used_mib()}


# -- laya side: a stack of real processes ------------------------------------------------------------

def run_laya(model: str, jobs: int) -> dict[str, object]:
    from common import start_valkey, stop_processes

    from laya.client import Client
    from laya.config import Settings
    from laya.memory.machine import MiB, detect_machine
    from laya.memory.modelfile import read_model_info
    from laya.memory.planner import make_plan, plan_input

    env_settings = {"LAYA_RUNTIME__MAX_SEQ_LEN": str(N_CTX), "LAYA_RUNTIME__N_BATCH": str(N_BATCH),
                    "LAYA_RUNTIME__MAX_TOKENS_LIMIT": str(MAX_TOKENS),
                    "LAYA_RUNTIME__DEFAULT_MAX_TOKENS": str(MAX_TOKENS), "LAYA_MODEL_PATH": model}
    settings = Settings.model_validate({"model": {"path": model},
                                        "runtime": {"max_seq_len": N_CTX, "n_batch": N_BATCH}})
    plan = make_plan(read_model_info(model), detect_machine(), plan_input(settings))
    gpu = next((d for d in plan.devices if d.device == "gpu"), plan.devices[0])  # a CPU dry run: no GPU
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp))
        url = f"{server.connection_url}/0"
        env = {**os.environ, **env_settings, "LAYA_REDIS_URL": url}
        procs = [subprocess.Popen([sys.executable, "-m", "laya", role], env=env) for role in ("router", "worker")]
        try:
            client = Client.from_url(url)
            warm_up = client.submit(prompt(10**6), max_tokens=MAX_TOKENS)  # answered once the model has loaded
            while client.result(warm_up) is None:
                if any(proc.poll() is not None for proc in procs):
                    raise SystemExit("laya router or worker exited; see the log above")
                time.sleep(0.5)

            def one(i: int) -> dict[str, float]:
                started = time.perf_counter()
                result = client.ask(prompt(i), max_tokens=MAX_TOKENS, timeout=600)
                wall = (time.perf_counter() - started) * 1000
                assert result.ok and result.timings is not None and result.usage is not None, result
                return {"wall_ms": wall, "ttft_ms": result.timings.ttft_ms or 0.0,
                        "tok_s": result.timings.tokens_per_s or 0.0, "tokens": result.usage.completion_tokens}

            singles = [one(i) for i in range(jobs)]
            started = time.perf_counter()
            ids = [client.submit(prompt(1000 + i), max_tokens=MAX_TOKENS) for i in range(BURST)]
            results = [client.wait(request_id, timeout=600) for request_id in ids]
            burst_s = time.perf_counter() - started
            assert all(r.ok for r in results), [r.route for r in results]
            vram = vram_used_mib()
        finally:
            stop_processes(procs)
            server.stop()
    completion_tokens = sum(r.usage.completion_tokens for r in results if r.usage is not None)
    return {"singles": singles, "vram_mib": vram, "burst_tok_s": completion_tokens / burst_s,
            "plan_gpu_mib": (gpu.total - gpu.margin) / MiB, "plan_table": plan.table()}


# -- the report ------------------------------------------------------------------------------------------

def child(side: str, model: str, jobs: int) -> dict[str, object]:
    before = vram_used_mib()
    out = subprocess.run([sys.executable, __file__, "--side", side, "--model", model, "--jobs", str(jobs)],
                         capture_output=True, text=True, check=False)
    sys.stderr.write(out.stderr[-4000:])
    if out.returncode != 0:
        raise SystemExit(f"the {side} side failed with code {out.returncode}")
    data: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    data["vram_mib"] = int(data["vram_mib"]) - before  # type: ignore[call-overload]
    return data


def report(model: str, size_gib: float, raw: dict[str, object], laya: dict[str, object]) -> list[str]:
    def med(side: dict[str, object], key: str) -> float:
        return statistics.median(float(s[key]) for s in side["singles"])  # type: ignore[attr-defined]

    def top(side: dict[str, object], key: str) -> float:
        return max(float(s[key]) for s in side["singles"])  # type: ignore[attr-defined]

    gpu_name = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False).stdout.strip()
    decode = med(laya, "tok_s") / med(raw, "tok_s")
    added = med(laya, "wall_ms") - med(raw, "wall_ms")
    burst = float(laya["burst_tok_s"]) / float(raw["burst_tok_s"])  # type: ignore[arg-type]
    vram_err = (float(laya["vram_mib"]) - float(laya["plan_gpu_mib"])) / float(laya["plan_gpu_mib"])  # type: ignore[arg-type]
    n = len(raw["singles"])  # type: ignore[arg-type]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**NOT met**"

    rows = [
        ("decode tok/s (median)", f"{med(raw, 'tok_s'):.1f}", f"{med(laya, 'tok_s'):.1f}", f"{decode:.3f}",
         f"≥ 0.98: {verdict(decode >= 0.98)}"),
        ("TTFT ms (median)", f"{med(raw, 'ttft_ms'):.1f}", f"{med(laya, 'ttft_ms'):.1f}",
         f"{med(laya, 'ttft_ms') / med(raw, 'ttft_ms'):.3f}", "—"),
        ("wall ms per job (median)", f"{med(raw, 'wall_ms'):.1f}", f"{med(laya, 'wall_ms'):.1f}",
         f"+{added:.2f} ms", f"≤ 2 ms added: {verdict(added <= 2.0)}"),
        ("wall ms per job (max)", f"{top(raw, 'wall_ms'):.1f}", f"{top(laya, 'wall_ms'):.1f}", "—", "—"),
        (f"{BURST}-job burst, completion tok/s", f"{float(raw['burst_tok_s']):.1f}",  # type: ignore[arg-type]
         f"{float(laya['burst_tok_s']):.1f}", f"{burst:.3f}", f"≥ 0.97: {verdict(burst >= 0.97)}"),  # type: ignore[arg-type]
        ("VRAM MiB (nvidia-smi)", str(raw["vram_mib"]), str(laya["vram_mib"]),
         f"plan {float(laya['plan_gpu_mib']):,.0f}: {vram_err:+.1%}",  # type: ignore[arg-type]
         f"±5 %: {verdict(abs(vram_err) <= 0.05)}"),
    ]
    return [
        f"# GPU: raw llama-cpp-python vs Laya's worker ({gpu_name})", "",
        (f"Model: {Path(model).name}, {size_gib:.2f} GiB, all layers on the GPU, n_ctx {N_CTX}, f16 KV. "
         f"Each side: {n} single jobs (~900-token prompt, {MAX_TOKENS} tokens), then {BURST} back to back."), "",
        "| measure | raw | laya | laya / raw | target |", "|---|---:|---:|---:|---|",
        *(f"| {' | '.join(row)} |" for row in rows), "",
        ("Laya's TTFT and decode rate are the worker's own (result timings); its wall time is `Client.ask`'s, "
         "from the XADD to the result."), "", "The plan:", "", "```", str(laya["plan_table"]), "```",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF file (default: generate Qwen2.5-7B shapes in Q4_K_M)")
    parser.add_argument("--jobs", type=int, default=5, help="single jobs per side")
    parser.add_argument("--side", choices=["raw", "laya"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.md")
    args = parser.parse_args()
    if args.side:
        result = (run_raw if args.side == "raw" else run_laya)(args.model, args.jobs)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from tests.shapedmodel import SHAPES, write_shaped_model

            model = str(write_shaped_model(Path(tmp) / "qwen2.5-7b-q4_k_m.gguf", SHAPES["qwen2.5-7b"], "Q4_K_M",
                                           stops=False))
        size = Path(model).stat().st_size / 2**30
        raw = child("raw", model, args.jobs)
        laya = child("laya", model, args.jobs)
    lines = report(model, size, raw, laya)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
