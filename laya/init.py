"""``laya init``: write a commented config for this machine (and a model, if given).

It plans the model at a few context sizes and KV types and keeps the first that
fits: 8192, 4096 then 2048 tokens with an f16 KV cache, then the same with
q8_0, then the largest context that fits at all.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from laya.machine import GiB, Machine
from laya.modelfile import read_model_info
from laya.planner import Plan, PlanInput, make_plan, recommend_quant

__all__ = ["choose", "render_config"]

CANDIDATE_CTX = (8192, 4096, 2048)


def choose(model_path: Path, machine: Machine, base: PlanInput) -> Plan:
    """The most generous configuration that fits, or the refusal at 2048 tokens."""
    model = read_model_info(model_path)
    for kv in ("f16", "q8_0"):
        for ctx in CANDIDATE_CTX:
            plan = make_plan(model, machine, replace(base, ctx=ctx, kv_type=kv))
            if plan.verdict == "fits":
                return plan
    plan = make_plan(model, machine, replace(base, ctx=CANDIDATE_CTX[-1]))
    return plan


def render_config(machine: Machine, model_path: Path | None, plan: Plan | None) -> str:
    gpu = max(machine.gpus, key=lambda g: g.total) if machine.gpus else None
    hardware = f"{machine.ram_total / GiB:.0f} GiB RAM, " + (
        f"{gpu.name} with {gpu.total / GiB:.1f} GiB" if gpu else "no GPU")
    planned = plan.planned if plan is not None and plan.verdict != "refuse" else None
    ctx = planned.ctx if planned else 2048
    kv = planned.kv_type if planned else "f16"
    lines = [
        f"# Laya config written by `laya init` for this machine: {hardware}.",
        f"# Recommended quantisation: {recommend_quant(machine)}.",
        "# Check any change with `laya plan`; the worker plans again before it loads.",
        "",
        "[redis]",
        '# url = "redis://127.0.0.1:6379/0"   # unset: the embedded Valkey of `laya up`',
        "",
        "[model]",
        'name = "default"',
        f'path = "{model_path}"' if model_path else '# path = "/models/your-model.gguf"',
    ]
    if plan is not None and plan.file_type:
        lines.append(f'quant_type = "{plan.file_type}"')
    lines += [
        f"n_gpu_layers = {-1 if gpu else 0}" + ("   # every layer on the GPU" if gpu else "   # CPU only"),
        "",
        "[runtime]",
        f"max_seq_len = {ctx}" + (f"   # the largest of {', '.join(map(str, CANDIDATE_CTX))} that fits"
                                  if planned else ""),
        "n_parallel = 1      # one sequence per GPU: the queue is the backpressure",
        "",
        "[memory]",
        f'kv_cache_policy = "{kv}"',
        f'offload_policy = "{"disabled" if gpu else "explicit"}"',
        "budget_fraction = 0.85",
    ]
    if plan is not None:
        lines += ["", "# The plan for this configuration:"]
        lines += [f"#   {row}" if row else "#" for row in plan.table().splitlines()]
    return "\n".join(lines) + "\n"
