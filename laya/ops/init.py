"""``laya init``: write a commented config for this machine (and a model, if given).

It plans the model at a few context sizes and KV types and keeps the first that
fits: 8192, 4096 then 2048 tokens with an f16 KV cache, then the same with
q8_0. It never picks a context beyond the model's training context (a model
answers badly past it), unless ``--ctx`` asks for one.

The file it writes must behave as its comments say, so every plan here is the
plan of the values the file sets: the candidate values are made into a
:class:`~laya.config.Settings` the way ``laya -c FILE`` would load them, and
planned through :func:`~laya.memory.planner.plan_input`, exactly as ``laya plan`` and
the worker do. The model's path is written absolute, because a config's
relative paths are read relative to the config file, not to where
``laya init`` ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from laya.config import Settings, format_validation_error
from laya.errors import ConfigError
from laya.memory.machine import GiB, Machine
from laya.memory.modelfile import ModelInfo, read_model_info
from laya.memory.planner import Plan, make_plan, plan_input, recommend_quant
from laya.router.rules import EXAMPLE_ROUTES

__all__ = ["CANDIDATE_CTX", "Choice", "choose", "config_values", "render_config"]

CANDIDATE_CTX = (8192, 4096, 2048)


@dataclass(frozen=True, slots=True)
class Choice:
    """The values ``laya init`` writes and their plan; ``why_ctx`` says how the context was picked."""

    values: dict[str, dict[str, Any]]
    plan: Plan
    why_ctx: str


def config_values(machine: Machine, model_path: Path | None, *, ctx: int = 2048, kv: str = "f16",
                  quant_type: str | None = None) -> dict[str, dict[str, Any]]:
    """The tables of the config file, as TOML would read them back."""
    gpu = bool(machine.gpus)
    model: dict[str, Any] = {"name": "default"}
    if model_path is not None:
        model["path"] = str(model_path.expanduser().resolve())
    if quant_type:
        model["quant_type"] = quant_type
    model["n_gpu_layers"] = -1 if gpu else 0
    values = {
        "model": model,
        "runtime": {"max_seq_len": ctx, "n_parallel": 1},
        "memory": {"kv_cache_policy": kv, "offload_policy": "disabled" if gpu else "explicit",
                   "budget_fraction": 0.85},
    }
    try:  # only --ctx comes from the user; a file that `laya -c` would refuse is never written
        Settings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(f"--ctx {ctx}", exc, model=Settings)) from None
    return values


def _plan(model: ModelInfo, machine: Machine, values: dict[str, dict[str, Any]]) -> Plan:
    """The plan ``laya -c FILE plan`` makes of a file holding ``values``."""
    settings = Settings.model_validate(values)
    return make_plan(model, machine, plan_input(settings))


def _candidates(model: ModelInfo, ctx: int | None) -> tuple[list[int], str]:
    """Contexts to try, largest first, and how they were chosen (for the file's comment)."""
    if ctx is not None:
        beyond = model.context_length is not None and ctx > model.context_length
        return [ctx], ("asked for with --ctx" + (f"; beyond the model's training context of {model.context_length} "
                                                 "tokens, so answers may degrade past that" if beyond else ""))
    offered = ", ".join(map(str, CANDIDATE_CTX))
    trained = model.context_length
    if not trained:
        return list(CANDIDATE_CTX), f"the largest of {offered} that fits"
    within = [c for c in CANDIDATE_CTX if c <= trained]
    if not within:
        return [trained], f"the model's training context ({offered} are beyond it)"
    return within, f"the largest of {offered} that fits within the model's training context ({trained} tokens)"


def choose(model_path: Path, machine: Machine, *, ctx: int | None = None) -> Choice:
    """The most generous configuration that fits, or the refusal at the smallest context tried."""
    model = read_model_info(model_path)
    contexts, why = _candidates(model, ctx)
    for kv in ("f16", "q8_0"):
        for size in contexts:
            values = config_values(machine, model_path, ctx=size, kv=kv, quant_type=model.file_type)
            plan = _plan(model, machine, values)
            if plan.verdict == "fits":
                return Choice(values, plan, why)
    values = config_values(machine, model_path, ctx=contexts[-1], quant_type=model.file_type)
    return Choice(values, _plan(model, machine, values), why)


def _toml(value: Any) -> str:
    """A TOML value: JSON's string escapes are TOML's basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


_COMMENTS = {
    ("model", "n_gpu_layers", -1): "every layer on the GPU",
    ("model", "n_gpu_layers", 0): "CPU only",
    ("runtime", "n_parallel", 1): "one sequence per GPU: the queue is the backpressure",
    ("memory", "offload_policy", "disabled"): "never move layers to the CPU behind your back",
    ("memory", "offload_policy", "explicit"): "n_gpu_layers above says where layers go",
}


def render_config(machine: Machine, values: dict[str, dict[str, Any]], *, plan: Plan | None = None,
                  why_ctx: str | None = None, check: str = "laya plan") -> str:
    """The commented file: a header, the tables of ``values``, and ``plan`` (their plan) as comments.

    ``check`` is the command that plans the written file on the machine planned for here.
    """
    gpu = max(machine.gpus, key=lambda g: g.total) if machine.gpus else None
    hardware = f"{machine.ram_total / GiB:.0f} GiB RAM, " + (
        f"{'a GPU' if gpu.name == 'given' else gpu.name} with {gpu.total / GiB:.1f} GiB" if gpu else "no GPU")
    lines = [
        f"# Laya config written by `laya init` for this machine: {hardware}.",
        f"# Recommended quantisation: {recommend_quant(machine)}.",
        (f"# Check any change with `{check}`" if "path" in values["model"] else
         f"# Set model.path to a GGUF file, then check this config with `{check}`")
        + "; the worker plans again before it loads.",
        "",
        "[redis]",
        '# url = "redis://127.0.0.1:6379/0"   # unset: the embedded Valkey of `laya up`',
    ]
    for table, fields in values.items():
        lines += ["", f"[{table}]"]
        if table == "model" and "path" not in fields:
            lines.append('# path = "/models/your-model.gguf"   # unset: `laya up` makes a tiny demo model')
        for name, value in fields.items():
            comment = _COMMENTS.get((table, name, value))
            if (table, name) == ("runtime", "max_seq_len") and why_ctx:
                comment = why_ctx
            lines.append(f"{name} = {_toml(value)}" + (f"   # {comment}" if comment else ""))
    lines += ["", "[router]",
              "# No routes_file: no rules, so every request the cache cannot answer goes to the model."]
    if EXAMPLE_ROUTES.exists():
        lines += ["# Example rules (greeting, ping, opening hours, echo), to copy and edit:",
                  f"# routes_file = {_toml(str(EXAMPLE_ROUTES))}"]
    else:
        lines.append('# routes_file = "routes.toml"   # [[rule]] tables; relative to this file')
    if plan is not None:
        lines += ["", f"# The plan of this configuration on this machine (`{check}` makes it again):"]
        lines += [f"#   {row}" if row else "#" for row in plan.table().splitlines()]
    return "\n".join(lines) + "\n"
