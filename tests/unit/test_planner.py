"""The planner on real models' headers (header-only GGUF files: no weights needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laya.errors import GGUFError, UnplannableModel
from laya.memory.machine import GiB, Gpu, Machine, MiB, parse_size
from laya.memory.modelfile import read_model_info
from laya.memory.planner import PlanInput, kv_cache_bytes, make_plan

from ..gguf_headers import LLAMA31_8B, MISTRAL_NEMO_12B, QWEN25_7B, write_header

SEED_DESKTOP = Machine(32 * GiB, 32 * GiB, (Gpu("given", 8 * GiB, 8 * GiB),), "given")


@pytest.fixture(scope="module")
def headers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("headers")
    return {a.name: write_header(folder / f"{a.name}.gguf", a) for a in (QWEN25_7B, LLAMA31_8B, MISTRAL_NEMO_12B)}


def test_reads_the_qwen_header(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    assert (model.architecture, model.n_layer, model.n_head, model.n_head_kv[0]) == ("qwen2", 28, 28, 4)
    assert (model.key_length, model.value_length, model.n_vocab) == (128, 128, 152064)
    assert model.file_type == "Q4_K_M"
    assert 4.3e9 < model.weights_bytes < 4.8e9  # the published file is 4.68 GB
    assert 7.5e9 < model.n_params < 7.7e9
    assert model.truncated  # header only


@pytest.mark.parametrize(("name", "kv_mib"), [("Qwen2.5-7B-Instruct", 112), ("Meta-Llama-3.1-8B-Instruct", 256),
                                              ("Mistral-Nemo-Instruct-2407", 320)])
def test_kv_cache_of_real_architectures_at_2048_tokens(headers: dict[str, Path], name: str, kv_mib: int) -> None:
    model = read_model_info(headers[name])
    assert sum(kv_cache_bytes(model, 2048, 1, "f16")) == kv_mib * MiB
    # The seed's arithmetic: per token 2 (K,V) × layers × kv heads × head dim × 2 bytes.
    per_token = 2 * model.n_layer * model.n_head_kv[0] * model.key_length * 2
    assert sum(kv_cache_bytes(model, 8192, 32, "f16")) == per_token * 8192 * 32


def test_head_dim_differs_from_embedding_over_heads(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Mistral-Nemo-Instruct-2407"])
    assert model.key_length == 128 != model.n_embd // model.n_head == 160


def test_seed_default_is_not_allowed_to_fit_and_says_what_would(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    plan = make_plan(model, SEED_DESKTOP, PlanInput(ctx=8192, n_seq=32))
    assert plan.verdict in ("shrink", "refuse")
    assert plan.reasons and plan.options
    summaries = " ".join(o.summary for o in plan.options)
    assert "one sequence of 8192 tokens" in summaries
    if plan.verdict == "shrink":
        assert plan.planned.ctx < 8192 and plan.planned.ctx % 256 == 0
        assert all(d.fits for d in plan.devices)


def test_seed_tuned_config_fits_with_112_mib_of_kv(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    plan = make_plan(model, SEED_DESKTOP, PlanInput(ctx=2048, n_seq=1, offload_policy="disabled"))
    assert plan.verdict == "fits"
    assert plan.kv_cache == 112 * MiB
    gpu = next(d for d in plan.devices if d.device == "gpu")
    assert gpu.kv_cache == 112 * MiB and gpu.weights > 4 * GiB


def test_disabled_offload_refuses_cpu_layers_and_explicit_allows_them(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Meta-Llama-3.1-8B-Instruct"])
    refused = make_plan(model, SEED_DESKTOP, PlanInput(n_gpu_layers=20))
    assert refused.verdict == "refuse" and "offload_policy" in refused.reasons[0]
    allowed = make_plan(model, SEED_DESKTOP, PlanInput(n_gpu_layers=20, offload_policy="explicit"))
    assert allowed.verdict == "fits"
    cpu = next(d for d in allowed.devices if d.device == "cpu")
    assert cpu.kv_cache == sum(kv_cache_bytes(model, 2048, 1, "f16", range(12)))


def test_too_small_a_gpu_is_refused_with_smaller_quant_and_offload_options(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Mistral-Nemo-Instruct-2407"])  # 7.5 GB of weights
    plan = make_plan(model, SEED_DESKTOP, PlanInput(ctx=2048))
    assert plan.verdict == "refuse"
    text = " ".join(o.summary for o in plan.options)
    assert "file of this model" in text and "offload_policy = \"explicit\"" in text and "slower" in text
    assert any(o.changes.get("quant_type") for o in plan.options)


def test_cpu_plan_when_there_is_no_gpu(headers: dict[str, Path]) -> None:
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    plan = make_plan(model, Machine(32 * GiB, 32 * GiB), PlanInput(cpu_extra_buffers="off"))
    assert [d.device for d in plan.devices] == ["cpu"] and plan.verdict == "fits"
    assert plan.devices[0].weights == model.weights_bytes
    small = make_plan(model, Machine(4 * GiB, 4 * GiB), PlanInput())
    assert small.verdict == "refuse"


def test_quantised_kv_needs_head_sizes_divisible_by_32(tiny_model: Path) -> None:
    plan = make_plan(read_model_info(tiny_model), Machine(8 * GiB, 8 * GiB), PlanInput(kv_type="q8_0"))
    assert plan.verdict == "refuse" and "divisible by 32" in plan.reasons[0]


@pytest.mark.parametrize(("content", "message"), [
    (b"", "not a GGUF file"),
    (b"PK\x03\x04 a zip file", "not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00\x01", "truncated"),
    (b"GGUF\x09\x00\x00\x00" + b"\x00" * 16, "version 9"),
])
def test_bad_files_are_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=message):
        read_model_info(path)


def test_truncated_header_and_unknown_architecture(tmp_path: Path, headers: dict[str, Path]) -> None:
    whole = headers["Qwen2.5-7B-Instruct"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(GGUFError, match="truncated") as broken:
        read_model_info(cut)
    assert not isinstance(broken.value, UnplannableModel)  # --force does not cover a broken file
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(whole.replace(b"qwen2.block_count", b"qwen2.layer_count"))
    with pytest.raises(UnplannableModel, match="not supported by the planner"):
        read_model_info(odd)
    with pytest.raises(GGUFError, match="cannot open"):
        read_model_info(tmp_path / "missing.gguf")


def test_odd_header_values_are_named(tmp_path: Path) -> None:
    wordy = write_header(tmp_path / "wordy.gguf", QWEN25_7B, override={"qwen2.block_count": "many"})
    with pytest.raises(GGUFError, match="qwen2.block_count is 'many', not a number") as broken:
        read_model_info(wordy)
    assert not isinstance(broken.value, UnplannableModel)
    novel = write_header(tmp_path / "novel.gguf", QWEN25_7B, tensor_type=250)  # a quantisation from the future
    with pytest.raises(UnplannableModel, match="type 250, unknown to the planner"):
        read_model_info(novel)


def test_sizes_parse() -> None:
    assert parse_size("32GiB") == 32 * GiB and parse_size("8 GB") == 8 * 10**9 and parse_size("512MiB") == 512 * MiB
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_laya_plan_cli_for_the_seed_scenario(headers: dict[str, Path]) -> None:
    model = str(headers["Qwen2.5-7B-Instruct"])
    base = [sys.executable, "-m", "laya", "plan", "--model", model, "--ram", "32GiB", "--vram", "8GiB", "--json"]
    seed = subprocess.run([*base, "--ctx", "8192", "--parallel", "32"], capture_output=True, text=True,
                          timeout=60, check=False)
    seed_plan = json.loads(seed.stdout)
    assert seed_plan["verdict"] != "fits" and seed_plan["options"]
    tuned = subprocess.run([*base, "--ctx", "2048", "--parallel", "1"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert tuned.returncode == 0
    tuned_plan = json.loads(tuned.stdout)
    assert tuned_plan["verdict"] == "fits" and tuned_plan["kv_cache"] == 112 * MiB
    table = subprocess.run(base[:-1] + ["--ctx", "2048"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "verdict FITS" in table and "gpu" in table


def test_laya_init_writes_a_config_that_loads(tmp_path: Path, headers: dict[str, Path]) -> None:
    from laya.config import load_settings

    out = tmp_path / "local.toml"
    done = subprocess.run([sys.executable, "-m", "laya", "init", "--model", str(headers["Qwen2.5-7B-Instruct"]),
                           "--ram", "32GiB", "--vram", "8GiB", "-o", str(out)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    settings = load_settings(out, environ={})
    assert settings.runtime.max_seq_len == 8192 and settings.model.quant_type == "Q4_K_M"
    assert "Q4_K_M of a 7-8B model" in out.read_text()
    again = subprocess.run([sys.executable, "-m", "laya", "init", "-o", str(out)], capture_output=True, text=True,
                           check=False)
    assert again.returncode == 2 and "exists" in again.stderr


AMX_CPU = frozenset({"avx2", "avx512f", "amx_tile", "amx_int8"})
ZEN4_CPU = frozenset({"avx2", "avx512f"})


@pytest.mark.parametrize(("setting", "flags", "enabled", "why"), [
    ("auto", AMX_CPU, False, "AMX"),
    ("auto", ZEN4_CPU, True, "no AMX"),
    ("on", AMX_CPU, True, '"on"'),
    ("off", ZEN4_CPU, False, '"off"'),
])
def test_extra_buffers_are_off_on_amx_cpus_unless_asked_for(headers: dict[str, Path], setting: str,
                                                           flags: frozenset[str], enabled: bool, why: str) -> None:
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    machine = Machine(32 * GiB, 32 * GiB, cpu_flags=flags)
    plan = make_plan(model, machine, PlanInput(cpu_extra_buffers=setting))  # type: ignore[arg-type]
    assert plan.extra_buffers.enabled is enabled and why in plan.extra_buffers.reason
    assert f"CPU extra buffers {'on' if enabled else 'off'}" in plan.table()


def test_the_repacked_copy_is_planned_for_the_types_the_cpu_repacks(headers: dict[str, Path]) -> None:
    """Q4_K_M is Q4_K with some Q6_K: an AVX2 CPU repacks the Q4_K matrices, AMX converts both."""
    model = read_model_info(headers["Qwen2.5-7B-Instruct"])
    layer_matrices = [t for t in model.tensors if t.layer is not None and len(t.shape) == 2]
    q4k = sum(t.nbytes for t in layer_matrices if t.type_name == "Q4_K")
    q6k = sum(t.nbytes for t in layer_matrices + [t for t in model.tensors if t.name == "output.weight"]
              if t.type_name == "Q6_K")
    assert q4k and q6k
    cpu = make_plan(model, Machine(64 * GiB, 64 * GiB, cpu_flags=ZEN4_CPU), PlanInput(cpu_extra_buffers="on"))
    assert cpu.devices[0].repacked == q4k
    assert cpu.devices[0].weights == model.weights_bytes + q4k
    amx = make_plan(model, Machine(64 * GiB, 64 * GiB, cpu_flags=AMX_CPU), PlanInput(cpu_extra_buffers="on"))
    assert amx.devices[0].repacked == q4k + q6k
    # All layers on a GPU: nothing is left on the CPU to repack (token embeddings are looked up, not multiplied).
    gpu = make_plan(model, SEED_DESKTOP, PlanInput(cpu_extra_buffers="on"))
    assert all(d.repacked == 0 for d in gpu.devices)
