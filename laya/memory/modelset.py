"""Several models on one machine, planned as a set: can they all stay loaded together?

Each model gets one worker (``laya up`` starts them all). The planner sizes
one model against the memory a machine has free; a set is planned in the
config's order, each model against what the models before it leave of the
budget (``memory.budget_fraction`` of the free memory, shared, not taken
again per model). The set fits when every model fits in what is left to it;
the first that does not says what would fit (its own plan's options, on the
memory left), and whether it fits alone.

A worker loads the plan the set gives its model, so two workers never
count the same memory twice, and refuses a model its config does not list.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from laya.config import ModelConfig, Settings
from laya.errors import ConfigError
from laya.memory.machine import Gpu, Machine, MiB
from laya.memory.modelfile import read_model_info
from laya.memory.planner import Plan, make_plan, plan_input

__all__ = ["SetPlan", "plan_models"]


@dataclass
class SetPlan:
    machine: Machine
    entries: list[tuple[ModelConfig, Plan]]
    alone: dict[str, str]
    """Verdict of each model that does not fit with the others, planned on the whole machine."""

    @property
    def fits(self) -> bool:
        return all(plan.verdict != "refuse" for _, plan in self.entries)

    def plan_for(self, name: str) -> Plan:
        for model, plan in self.entries:
            if model.name == name:
                return plan
        raise ConfigError(f"model {name!r} is not in the planned set ({', '.join(m.name for m, _ in self.entries)})")

    def to_dict(self) -> dict[str, Any]:
        return {"fits_together": self.fits, "models": [{"name": m.name, "path": str(m.path), **plan.to_dict()}
                                                       for m, plan in self.entries],
                "alone": self.alone}

    def table(self) -> str:
        rows = [(f"{len(self.entries)} models planned together, in config order, each on what the ones before "
                 "it leave"), ""]
        for model, plan in self.entries:
            rows += [f"== {model.name} ==", plan.table(), ""]
        used = {device: sum(d.total for _, p in self.entries for d in p.devices if d.device == device)
                for device in ("gpu", "cpu")}
        totals = ", ".join(f"{device} {n / MiB:,.0f} MiB" for device, n in used.items() if n)
        if self.fits:
            rows.append(f"set FITS: all {len(self.entries)} stay loaded together ({totals})")
        else:
            refused = [m.name for m, p in self.entries if p.verdict == "refuse"]
            rows.append(f"set does NOT fit: {', '.join(refused)} left without memory ({totals} planned)")
            for name in refused:
                rows.append(f"  - {name} alone on this machine: {self.alone.get(name, '?')}; run it on another "
                            "machine, or take the options above (a smaller context or quantisation)")
        return "\n".join(rows)


def _left(machine: Machine, used: dict[str, int], fraction: float) -> Machine:
    """``machine`` with ``used`` bytes per device taken out of its budget (the GPU with the most free memory,
    as the planner picks it)."""
    ram = max(0, machine.ram_available - int(used.get("cpu", 0) / fraction))
    gpus = machine.gpus
    if gpus and used.get("gpu"):
        best = max(range(len(gpus)), key=lambda i: gpus[i].free)
        gpu = gpus[best]
        gpus = (*gpus[:best], Gpu(gpu.name, gpu.total, max(0, gpu.free - int(used["gpu"] / fraction))),
                *gpus[best + 1:])
    return replace(machine, ram_available=ram, gpus=gpus)


def plan_models(settings: Settings, machine: Machine) -> SetPlan:
    """Plan every model ``settings`` serves, in order, on what the earlier ones leave of ``machine``."""
    entries: list[tuple[ModelConfig, Plan]] = []
    alone: dict[str, str] = {}
    used: dict[str, int] = {}
    fraction = settings.memory.budget_fraction
    for model in settings.served:
        if model.path is None:
            raise ConfigError(f"{settings.source}: model {model.name!r} has no path; give each of [[models]] "
                              "a GGUF file")
        info = read_model_info(model.path)
        inp = plan_input(settings.for_model(model.name))
        plan = make_plan(info, _left(machine, used, fraction), inp)
        entries.append((model, plan))
        if plan.verdict == "refuse":
            alone[model.name] = make_plan(info, machine, inp).verdict
            continue
        for device in plan.devices:
            used[device.device] = used.get(device.device, 0) + device.total
    return SetPlan(machine, entries, alone)
