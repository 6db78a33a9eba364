"""What the machine has: nvidia-smi's CSV output, parsed as the driver's tool prints it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from laya.memory.machine import NVIDIA_SMI_QUERY, Gpu, MiB, detect_machine, parse_nvidia_smi

# What `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits` prints
# (NVIDIA's documented CSV format: one line per GPU, ", " between fields, MiB without a unit, and
# "[N/A]" for a figure the device does not report). The GB10 line is what a DGX Spark prints: its
# unified memory has no memory.total or memory.free (llama-swap issue #782 shows "[N/A], [N/A]").
# "[Not Supported]" is the tool's other placeholder for a field a device lacks.
EIGHT_H100 = "".join(f"NVIDIA H100 80GB HBM3, 81559, {81008 - i}\n" for i in range(8))
MIXED = ("NVIDIA GeForce RTX 4090, 24564, 23987\n"
         "NVIDIA GeForce GTX 1050 Ti, 4096, 2131\n"
         "NVIDIA GB10, [N/A], [N/A]\n"
         "NVIDIA A100-SXM4-40GB, [Not Supported], [Not Supported]\n")


def test_several_gpus_each_become_one_gpu_in_mib() -> None:
    gpus = parse_nvidia_smi(EIGHT_H100)
    assert len(gpus) == 8
    assert gpus[0] == Gpu("NVIDIA H100 80GB HBM3", 81559 * MiB, 81008 * MiB)
    assert gpus[7] == Gpu("NVIDIA H100 80GB HBM3", 81559 * MiB, 81001 * MiB)


def test_gpus_without_memory_figures_are_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_nvidia_smi(MIXED) == (Gpu("NVIDIA GeForce RTX 4090", 24564 * MiB, 23987 * MiB),
                                       Gpu("NVIDIA GeForce GTX 1050 Ti", 4096 * MiB, 2131 * MiB))
    warnings = [r.getMessage() for r in caplog.records if "no usable memory figures" in r.getMessage()]
    assert len(warnings) == 2 and "GB10" in warnings[0] and "[Not Supported]" in warnings[1]
    assert all("--vram" in w for w in warnings)


def test_a_name_holding_a_comma_and_an_empty_output() -> None:
    assert parse_nvidia_smi("Acme, Inc. Accelerator, 16384, 16000\n") == (
        Gpu("Acme, Inc. Accelerator", 16384 * MiB, 16000 * MiB),)
    assert parse_nvidia_smi("") == () and parse_nvidia_smi("\n") == ()


def test_output_with_a_header_or_units_is_not_misread(caplog: pytest.LogCaptureFixture) -> None:
    # What the tool prints without noheader,nounits: no line may pass for a GPU's figures.
    assert parse_nvidia_smi("name, memory.total [MiB], memory.free [MiB]\n"
                            "NVIDIA GeForce RTX 4090, 24564 MiB, 23987 MiB\n") == ()


def test_detect_machine_runs_nvidia_smi_with_exactly_that_query(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the driver's tool that answers only the arguments Laya's parser expects.
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n'
                   f'[ "$#" = 2 ] && [ "$1" = "{NVIDIA_SMI_QUERY[0]}" ] && [ "$2" = "{NVIDIA_SMI_QUERY[1]}" ] '
                   '|| exit 9\n'
                   f"printf '{MIXED}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    machine = detect_machine()
    assert [g.name for g in machine.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce GTX 1050 Ti"]
    assert machine.ram_total > 0
    assert NVIDIA_SMI_QUERY == ("--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits")
