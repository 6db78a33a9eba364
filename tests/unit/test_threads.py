"""How many CPU threads a worker runs: one per physical core it may use, under its cgroup's quota."""

from __future__ import annotations

from pathlib import Path

from laya.memory.machine import Machine, Threads, cpu_threads
from laya.memory.planner import threads


def fake_sys(root: Path, cores: dict[int, tuple[int, int]], cpu_max: str | None = None,
             v1: tuple[int, int] | None = None) -> Path:
    """A /sys with ``cores`` (cpu → (package, core)) and a cgroup v2 ``cpu.max`` or a v1 quota and period."""
    for cpu, (package, core) in cores.items():
        topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    cgroup = root / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    if cpu_max is not None:
        (cgroup / "cpu.max").write_text(cpu_max + "\n")
    if v1 is not None:
        (cgroup / "cpu").mkdir()
        (cgroup / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (cgroup / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return root


def test_hyper_threads_of_one_core_count_once(tmp_path: Path) -> None:
    root = fake_sys(tmp_path, {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)}, cpu_max="max 100000")
    found = cpu_threads(sys_root=root, affinity={0, 1, 2, 3})
    assert found == Threads(2, "2 physical core(s) among the 4 CPU(s) this process may use")


def test_the_affinity_limits_the_cores(tmp_path: Path) -> None:
    root = fake_sys(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)})
    assert cpu_threads(sys_root=root, affinity={2, 3}).count == 2  # the same core ids on another package
    assert cpu_threads(sys_root=root, affinity={1}).count == 1


def test_a_cgroup_quota_caps_the_count_rounded_up(tmp_path: Path) -> None:
    cores = {n: (0, n) for n in range(8)}
    v2 = cpu_threads(sys_root=fake_sys(tmp_path / "v2", cores, cpu_max="150000 100000"), affinity=set(cores))
    assert v2.count == 2 and v2.reason.endswith("capped by the cgroup's CPU quota of 1.5")
    v1 = cpu_threads(sys_root=fake_sys(tmp_path / "v1", cores, v1=(300000, 100000)), affinity=set(cores))
    assert v1.count == 3
    unlimited = cpu_threads(sys_root=fake_sys(tmp_path / "none", cores, v1=(-1, 100000)), affinity=set(cores))
    assert unlimited.count == 8


def test_without_sysfs_each_cpu_counts(tmp_path: Path) -> None:
    assert cpu_threads(sys_root=tmp_path, affinity={0, 1, 2}).count == 3


def test_a_configured_count_wins_and_the_plan_says_why() -> None:
    machine = Machine(0, 0, threads=Threads(6, "6 physical core(s) among the 12 CPU(s) this process may use"))
    assert threads(3, machine) == Threads(3, "model.n_threads = 3")
    assert threads(None, machine) == Threads(6, "model.n_threads unset: 6 physical core(s) among the 12 CPU(s) "
                                                "this process may use")
