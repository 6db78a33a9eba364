"""What this machine has: RAM from the OS, VRAM from ``nvidia-smi`` when present, and the CPU threads
a worker should run (the physical cores this process may use)."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NVIDIA_SMI_QUERY", "Gpu", "Machine", "Threads", "cpu_flags", "cpu_threads", "detect_machine",
           "parse_nvidia_smi", "parse_size", "resident_bytes"]

log = logging.getLogger("laya.memory.machine")

MiB = 1024**2
GiB = 1024**3
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": MiB,
          "g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """``"32GiB"``, ``"8 GB"``, ``"8192MiB"`` → bytes. GB means 10^9, GiB 2^30."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (write e.g. 32GiB, 8GB, 8192MiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class Threads:
    """How many CPU threads llama.cpp runs, for decode and for prompt batches, and why."""

    count: int
    reason: str

    def describe(self) -> str:
        return f"{self.count} CPU thread(s) for decode and prompt batches ({self.reason})"


def cpu_threads(*, sys_root: Path = Path("/sys"), affinity: set[int] | None = None) -> Threads:
    """The physical cores among the CPUs this process may run on (its affinity), capped by a cgroup CPU quota.

    One thread per physical core: a second thread on a core's hyper-thread shares its vector units and
    slows llama.cpp's matrix products; a thread beyond the quota only waits for its turn.
    """
    cpus = sorted(affinity if affinity is not None else os.sched_getaffinity(0))
    cores = {_core_of(sys_root, cpu) for cpu in cpus}
    count = max(1, len(cores))
    reason = f"{len(cores)} physical core(s) among the {len(cpus)} CPU(s) this process may use"
    quota = _cgroup_quota(sys_root)
    if quota is not None and math.ceil(quota) < count:
        count = max(1, math.ceil(quota))
        reason += f", capped by the cgroup's CPU quota of {quota:g}"
    return Threads(count, reason)


def _core_of(sys_root: Path, cpu: int) -> tuple[str, str]:
    """The (package, core) a logical CPU belongs to; the CPU itself where sysfs does not say."""
    topology = sys_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
    try:
        return ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
    except OSError:
        return ("cpu", str(cpu))


def _cgroup_quota(sys_root: Path) -> float | None:
    """CPUs the cgroup lets this process use (cgroup v2 ``cpu.max``, or v1 ``cfs_quota_us``); None: no quota."""
    cgroup = sys_root / "fs" / "cgroup"
    try:
        fields = (cgroup / "cpu.max").read_text().split()  # "max 100000", or "150000 100000" for 1.5 CPUs
    except OSError:
        fields = []
    if len(fields) == 2 and fields[0] == "max":
        return None
    if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]):
        return int(fields[0]) / int(fields[1])
    for folder in ("cpu", "cpu,cpuacct"):
        try:
            quota_us = int((cgroup / folder / "cpu.cfs_quota_us").read_text())
            period_us = int((cgroup / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None


@dataclass(frozen=True, slots=True)
class Machine:
    ram_total: int
    ram_available: int
    gpus: tuple[Gpu, ...] = field(default=())
    source: str = "detected"
    cpu_flags: frozenset[str] = field(default=frozenset())
    """The CPU's feature flags (``/proc/cpuinfo``): which of llama.cpp's CPU kernels can run."""
    threads: Threads | None = None
    """The CPU threads a worker runs here (:func:`cpu_threads`); None for a machine described by hand."""

    @property
    def has_amx(self) -> bool:
        return "amx_int8" in self.cpu_flags or "amx_tile" in self.cpu_flags

    def with_overrides(self, *, ram: int | None = None, vram: int | None = None) -> Machine:
        """Plan for another machine: a given size counts as entirely free."""
        gpus = self.gpus
        if vram is not None:
            gpus = (Gpu("given", vram, vram),) if vram > 0 else ()
        return Machine(ram_total=ram or self.ram_total, ram_available=ram or self.ram_available, gpus=gpus,
                       source="given" if ram or vram is not None else self.source, cpu_flags=self.cpu_flags,
                       threads=self.threads)


def _ram() -> tuple[int, int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle if ":" in line}
        return info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError):
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, pages * size // 2  # no availability figure: assume half is free


NVIDIA_SMI_QUERY = ("--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits")
"""The arguments Laya passes to ``nvidia-smi``; :func:`parse_nvidia_smi` reads what they print."""


def parse_nvidia_smi(out: str) -> tuple[Gpu, ...]:
    """GPUs from ``nvidia-smi`` run with :data:`NVIDIA_SMI_QUERY`: one ``name, total, free`` line each, in MiB.

    A GPU whose memory figures are not numbers (``[N/A]`` on MIG slices and unified-memory
    boards such as the GB10, ``[Not Supported]`` elsewhere) is left out with a warning:
    planning for it would be a guess.
    """
    gpus = []
    for line in out.strip().splitlines():
        # The name comes first and may itself hold a comma; the two figures never do.
        parts = [part.strip() for part in line.rsplit(",", 2)]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            gpus.append(Gpu(parts[0], int(parts[1]) * MiB, int(parts[2]) * MiB))
        elif line.strip():
            log.warning("nvidia-smi reports no usable memory figures for %r; not planning for that GPU "
                        "(give --vram to plan for it)", line.strip())
    return tuple(gpus)


def _nvidia_gpus() -> tuple[Gpu, ...]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_nvidia_smi(out)


def cpu_flags() -> frozenset[str]:
    """Feature flags of the first CPU in ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def detect_machine() -> Machine:
    total, available = _ram()
    return Machine(ram_total=total, ram_available=available, gpus=_nvidia_gpus(), cpu_flags=cpu_flags(),
                   threads=cpu_threads())


def resident_bytes() -> int:
    """This process's resident set size (Linux), 0 where unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
