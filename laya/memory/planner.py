"""The memory planner: decide before anything loads whether a configuration fits.

For a model (its GGUF header) and a machine (free RAM and VRAM) it computes,
per device::

    weights   tensors placed there (token embeddings stay on the CPU, as in llama.cpp)
    kv_cache  n_layer × cells × (n_head_kv × key_length × bytes_k + n_head_kv × value_length × bytes_v)
              with cells = max_seq_len rounded up to 256 (llama.cpp's padding) × sequences
    compute   llama.cpp's compute buffer, estimated from n_ubatch, the vocabulary and the context
    runtime   the process itself (Python and llama.cpp on the CPU; the CUDA context on a GPU)
    margin    memory.margin_mib

against a budget of ``memory.budget_fraction`` of what is free, and gives a verdict:

* ``fits``   — load as configured;
* ``shrink`` — the configured context does not fit, a smaller one (≥ 512 tokens) does: use it;
* ``refuse`` — nothing close fits; the plan lists what would (a smaller context, a quantised
  KV cache, a smaller quantisation, fewer GPU layers with explicit offload and its cost).

It never moves layers to the CPU unless the configuration asks for it
(``offload_policy = "explicit"`` with ``n_gpu_layers``).

On the CPU, llama.cpp can keep a second, rearranged copy of quantised matrix
weights in "extra buffer types" (repacked for AVX2/AVX-512 kernels, or converted
for AMX): faster matrix products, but the file's pages stay mapped as well, so
the plan counts that copy. Its AMX kernels crash on quantised models on the
Xeons we run on (llama.cpp issue #20824), so ``model.cpu_extra_buffers = "auto"``
turns extra buffers off on CPUs with AMX; :func:`extra_buffers` decides, and the
plan says what it decided and why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from laya.memory.machine import GiB, Machine, MiB, Threads, cpu_threads
from laya.memory.modelfile import ModelInfo

if TYPE_CHECKING:
    from laya.config import Settings

__all__ = ["ExtraBuffers", "Plan", "PlanInput", "compute_bytes", "extra_buffers", "kv_cache_bytes", "make_plan",
           "padded_ctx", "plan_input", "recommend_quant", "threads"]

CTX_PAD = 256
MIN_SHRINK_CTX = 512
KV_TYPES: dict[str, tuple[int, int]] = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}
"""KV element type → (elements per block, bytes per block)."""

RAM_RUNTIME = 72 * MiB
"""Resident size of a worker process with its libraries (Python, RQ, llama.cpp) before the model:
calibrated with bench/planner_rss.py on Linux x86-64 (llama-cpp-python 0.3.36, F16 and quantised models)."""
GPU_RUNTIME = 400 * MiB
"""CUDA context and cuBLAS workspace per process: a typical figure, not measured here (no GPU in CI)."""

# Bits per weight of common quantisations, for "a smaller quantisation would be about this big".
QUANT_BPW: dict[str, float] = {"F16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.69, "Q4_K_M": 4.85,
                               "Q4_0": 4.55, "Q3_K_M": 3.91, "Q2_K": 3.35}
CPU_TO_GPU_BANDWIDTH = 0.1
"""Decode speed follows memory bandwidth; a desktop CPU reads weights about 10x slower than its GPU."""


REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
"""Quantisations llama.cpp repacks for AVX2 CPUs (``ggml_repack_get_optimal_repack_type``); AVX-512 adds Q2_K."""
AMX_TYPES = frozenset({"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"})
"""Quantisations llama.cpp's AMX buffer type converts (``qtype_has_amx_kernels``)."""


@dataclass(frozen=True, slots=True)
class ExtraBuffers:
    """Whether llama.cpp may use its CPU extra buffer types, and why."""

    enabled: bool
    reason: str

    def describe(self) -> str:
        return f"CPU extra buffers {'on' if self.enabled else 'off'} ({self.reason})"


def extra_buffers(setting: str, machine: Machine) -> ExtraBuffers:
    """Resolve ``model.cpu_extra_buffers`` (auto, on, off) for this machine's CPU."""
    if setting == "on":
        return ExtraBuffers(True, "model.cpu_extra_buffers = \"on\"")
    if setting == "off":
        return ExtraBuffers(False, "model.cpu_extra_buffers = \"off\"")
    if machine.has_amx:
        return ExtraBuffers(False, "auto: this CPU has AMX, and llama.cpp's AMX kernels crash on quantised "
                                   "weights (llama.cpp #20824)")
    return ExtraBuffers(True, "auto: no AMX on this CPU; repacked weights speed up Q4_0/Q4_K matrix products")


def threads(setting: int | None, machine: Machine) -> Threads:
    """Resolve ``model.n_threads``: the number set, else one per physical core this process may use."""
    if setting:
        return Threads(setting, f"model.n_threads = {setting}")
    found = machine.threads or cpu_threads()
    return Threads(found.count, f"model.n_threads unset: {found.reason}")


def repacked_bytes(model: ModelInfo, machine: Machine, cpu_layers: range, output_on_cpu: bool) -> int:
    """Size of the copy llama.cpp makes of the CPU's matrix weights in its extra buffer types."""
    types = set(REPACK_TYPES)
    if "avx512f" in machine.cpu_flags:
        types.add("Q2_K")
    if machine.has_amx:
        types |= AMX_TYPES
    total = 0
    for tensor in model.tensors:
        on_cpu = tensor.layer in cpu_layers if tensor.layer is not None else (
            output_on_cpu and tensor.name == "output.weight")
        if on_cpu and len(tensor.shape) == 2 and tensor.name.endswith(".weight") and tensor.type_name in types:
            total += tensor.nbytes
    return total


def padded_ctx(ctx: int) -> int:
    return max(CTX_PAD, math.ceil(ctx / CTX_PAD) * CTX_PAD)


def kv_cache_bytes(model: ModelInfo, ctx: int, n_seq: int, kv_type: str,
                   layers: range | None = None) -> tuple[int, int]:
    """(K bytes, V bytes) of llama.cpp's KV cache for ``ctx`` tokens per sequence.

    Every layer holds the whole context, sliding-window layers included: the worker asks llama.cpp
    for full-size sliding-window caches (``swa_full``), so the prompt cache can keep any prefix.
    """
    block, size = KV_TYPES[kv_type]
    cells = padded_ctx(ctx) * n_seq
    k = v = 0
    for layer in layers if layers is not None else range(model.n_layer):
        k += model.n_head_kv[layer] * model.key_length * cells // block * size
        v += model.n_head_kv[layer] * model.value_length * cells // block * size
    return k, v


def compute_bytes(model: ModelInfo, ctx: int, *, n_ubatch: int = 512, flash_attn: bool = False,
                  cpu: bool = False) -> int:
    """Estimate of llama.cpp's compute buffer: activations for one micro-batch, the logits, and the
    attention scores (f32) and mask over the whole context unless flash attention tiles them.

    A GPU reserves the whole buffer, sized for logits of every token of a micro-batch. On the CPU
    only the pages a graph touches become resident, and Laya asks for the logits of the last
    token only, so the CPU plan counts one row of logits; the CPU backend also converts the
    scores to f16 in a separate work buffer.
    """
    per_token = 4 * (2 * model.n_embd + model.n_ff + 3 * model.n_head * model.key_length)
    if not flash_attn:
        per_token += (4 * (model.n_head + 1) + (2 * model.n_head if cpu else 0)) * padded_ctx(ctx)
    logits = 4 * model.n_vocab * (1 if cpu else n_ubatch)
    return n_ubatch * per_token + logits


@dataclass(frozen=True, slots=True)
class PlanInput:
    ctx: int = 2048
    n_seq: int = 1
    kv_type: str = "f16"
    n_gpu_layers: int = -1
    offload_policy: Literal["disabled", "explicit"] = "disabled"
    budget_fraction: float = 0.85
    margin: int = 256 * MiB
    n_ubatch: int = 512
    cpu_extra_buffers: Literal["auto", "on", "off"] = "auto"
    n_threads: int | None = None


@dataclass
class DeviceUse:
    device: str
    weights: int
    kv_cache: int
    compute: int
    runtime: int
    margin: int
    budget: int
    free: int
    repacked: int = 0
    """Part of ``weights``: llama.cpp's extra-buffer copy of quantised weights (CPU only)."""

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.runtime + self.margin

    @property
    def fits(self) -> bool:
        return self.total <= self.budget


@dataclass
class Option:
    summary: str
    changes: dict[str, Any]


@dataclass
class Plan:
    verdict: Literal["fits", "shrink", "refuse"]
    model: str
    file_type: str | None
    machine: str
    requested: PlanInput
    planned: PlanInput
    devices: list[DeviceUse]
    extra_buffers: ExtraBuffers
    reasons: list[str] = field(default_factory=list)
    options: list[Option] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    threads: Threads | None = None

    @property
    def kv_cache(self) -> int:
        return sum(d.kv_cache for d in self.devices)

    @property
    def ram_predicted(self) -> int:
        """Predicted resident memory of the worker process on the CPU side."""
        return next(d.total - d.margin for d in self.devices if d.device == "cpu")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for device, use in zip(data["devices"], self.devices):
            device["total"] = use.total
            device["fits"] = use.fits
        data["kv_cache"] = self.kv_cache
        return data

    def table(self) -> str:
        def mib(n: int) -> str:
            return f"{n / MiB:,.0f}"

        rows = [f"model   {self.model} ({self.file_type or 'unknown type'})", f"machine {self.machine}",
                (f"config  ctx {self.requested.ctx} × {self.requested.n_seq} seq, KV {self.requested.kv_type}, "
                 f"n_gpu_layers {self.requested.n_gpu_layers}, offload {self.requested.offload_policy}"), "",
                (f"{'MiB':<8}{'weights':>10}{'kv cache':>10}{'compute':>10}{'runtime':>10}{'margin':>9}"
                 f"{'total':>10}{'budget':>10}  fits")]
        for d in self.devices:
            rows.append(f"{d.device:<8}{mib(d.weights):>10}{mib(d.kv_cache):>10}{mib(d.compute):>10}"
                        f"{mib(d.runtime):>10}{mib(d.margin):>9}{mib(d.total):>10}{mib(d.budget):>10}  "
                        f"{'yes' if d.fits else 'NO'}")
        rows.append("")
        rows.append(self.extra_buffers.describe())
        if self.threads is not None:
            rows.append(self.threads.describe())
        repacked = sum(d.repacked for d in self.devices)
        if repacked:
            rows.append(f"  cpu weights include {mib(repacked)} MiB repacked by llama.cpp beside the mapped file")
        verdict = self.verdict.upper()
        if self.verdict == "shrink":
            verdict += f": max_seq_len {self.requested.ctx} → {self.planned.ctx}"
        rows += ["", f"verdict {verdict}"]
        rows += [f"  - {r}" for r in self.reasons]
        if self.options:
            rows.append("what would fit:")
            rows += [f"  - {o.summary}" for o in self.options]
        rows += [f"warning: {w}" for w in self.warnings]
        return "\n".join(rows)


def _gpu_layers(model: ModelInfo, n_gpu_layers: int) -> tuple[int, bool]:
    """(repeating layers on the GPU, output layer on the GPU), as llama.cpp counts them."""
    if n_gpu_layers < 0 or n_gpu_layers > model.n_layer:
        return model.n_layer, True
    return n_gpu_layers, False


def _usage(model: ModelInfo, machine: Machine, inp: PlanInput) -> list[DeviceUse]:
    flash = inp.kv_type != "f16"
    gpu = max(machine.gpus, key=lambda g: g.free) if machine.gpus and inp.n_gpu_layers != 0 else None
    n_gpu, output_on_gpu = _gpu_layers(model, inp.n_gpu_layers) if gpu else (0, False)
    first_gpu_layer = model.n_layer - n_gpu
    gpu_weights = sum(model.layer_bytes(i) for i in range(first_gpu_layer, model.n_layer))
    cpu_weights = sum(model.layer_bytes(i) for i in range(first_gpu_layer))
    top = model.non_layer_bytes
    for name, nbytes in top.items():
        on_gpu = output_on_gpu and name.startswith("output")
        gpu_weights += nbytes if on_gpu else 0
        cpu_weights += 0 if on_gpu else nbytes
    if output_on_gpu and "output.weight" not in top:  # tied embeddings: llama.cpp copies them to the GPU
        gpu_weights += top.get("token_embd.weight", 0)
    repacked = 0
    if extra_buffers(inp.cpu_extra_buffers, machine).enabled:
        repacked = repacked_bytes(model, machine, range(first_gpu_layer), output_on_cpu=not output_on_gpu)
    cpu_weights += repacked
    cpu_kv = sum(kv_cache_bytes(model, inp.ctx, inp.n_seq, inp.kv_type, range(first_gpu_layer)))
    gpu_kv = sum(kv_cache_bytes(model, inp.ctx, inp.n_seq, inp.kv_type, range(first_gpu_layer, model.n_layer)))
    compute = compute_bytes(model, inp.ctx, n_ubatch=inp.n_ubatch, flash_attn=flash, cpu=gpu is None)
    output_buffer = 4 * model.n_vocab * inp.n_seq
    ram_budget = int(machine.ram_available * inp.budget_fraction)
    if gpu is None:
        return [DeviceUse("cpu", cpu_weights, cpu_kv, compute + output_buffer, RAM_RUNTIME, inp.margin,
                          ram_budget, machine.ram_available, repacked)]
    host_compute = inp.n_ubatch * model.n_embd * 4 * 2 + output_buffer
    return [
        DeviceUse("gpu", gpu_weights, gpu_kv, compute, GPU_RUNTIME, inp.margin,
                  int(gpu.free * inp.budget_fraction), gpu.free),
        DeviceUse("cpu", cpu_weights, cpu_kv, host_compute, RAM_RUNTIME, inp.margin, ram_budget,
                  machine.ram_available, repacked),
    ]


def _fits(model: ModelInfo, machine: Machine, inp: PlanInput) -> bool:
    return all(d.fits for d in _usage(model, machine, inp))


def _largest_ctx(model: ModelInfo, machine: Machine, inp: PlanInput, below: int) -> int | None:
    """Largest multiple of 256 (≤ ``below``) that fits, by bisection (memory grows with the context)."""
    lo, hi = 0, padded_ctx(below) // CTX_PAD
    if hi * CTX_PAD > below:
        hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(model, machine, replace(inp, ctx=mid * CTX_PAD)):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD if lo else None


def _kv_quantisable(model: ModelInfo) -> bool:
    return model.key_length % 32 == 0 and model.value_length % 32 == 0


def _options(model: ModelInfo, machine: Machine, inp: PlanInput) -> list[Option]:
    options: list[Option] = []
    ctx = _largest_ctx(model, machine, inp, inp.ctx - 1) if inp.ctx > CTX_PAD else None
    if ctx:
        options.append(Option(f"max_seq_len = {ctx} ({inp.n_seq} sequence(s))", {"max_seq_len": ctx}))
    if inp.n_seq > 1:
        single = replace(inp, n_seq=1)
        if _fits(model, machine, single):
            options.append(Option(f"one sequence of {inp.ctx} tokens (n_parallel = 1; Laya queues the rest)",
                                  {"n_parallel": 1}))
        elif (ctx1 := _largest_ctx(model, machine, single, inp.ctx)) is not None:
            options.append(Option(f"one sequence of {ctx1} tokens", {"n_parallel": 1, "max_seq_len": ctx1}))
    if inp.kv_type == "f16" and _kv_quantisable(model):
        q8 = replace(inp, kv_type="q8_0")
        if _fits(model, machine, q8):
            options.append(Option(f"kv_cache_policy = \"q8_0\" at {inp.ctx} tokens (KV cache about half)",
                                  {"kv_cache_policy": "q8_0"}))
    current_bpw = 8 * model.weights_bytes / max(model.n_params, 1)
    for quant, bpw in QUANT_BPW.items():
        if bpw >= current_bpw - 0.05:
            continue
        scale = bpw / current_bpw
        smaller = _scaled(model, scale)
        if _fits(smaller, machine, inp):
            options.append(Option(f"a {quant} file of this model: about {smaller.weights_bytes / GiB:.1f} GiB of "
                                  f"weights instead of {model.weights_bytes / GiB:.1f} GiB", {"quant_type": quant}))
            break
    if machine.gpus and inp.n_gpu_layers != 0:
        explicit = replace(inp, offload_policy="explicit")
        for layers in range(model.n_layer - 1, -1, -1):
            if _fits(model, machine, replace(explicit, n_gpu_layers=layers)):
                options.append(Option(
                    f"n_gpu_layers = {layers} of {model.n_layer} with offload_policy = \"explicit\": "
                    f"about {_slowdown(model, layers):.1f}x slower decoding (CPU memory bandwidth)",
                    {"n_gpu_layers": layers, "offload_policy": "explicit"}))
                break
    return options


def _scaled(model: ModelInfo, scale: float) -> ModelInfo:
    tensors = tuple(replace(t, nbytes=int(t.nbytes * scale)) for t in model.tensors)
    return replace(model, tensors=tensors)


def _slowdown(model: ModelInfo, gpu_layers: int) -> float:
    gpu = sum(model.layer_bytes(i) for i in range(model.n_layer - gpu_layers, model.n_layer))
    total = model.weights_bytes
    cpu = total - gpu
    return (gpu * CPU_TO_GPU_BANDWIDTH + cpu) / (total * CPU_TO_GPU_BANDWIDTH)


def make_plan(model: ModelInfo, machine: Machine, inp: PlanInput) -> Plan:
    gpu_plan = bool(machine.gpus) and inp.n_gpu_layers != 0
    machine_text = f"RAM {machine.ram_available / GiB:.1f} of {machine.ram_total / GiB:.1f} GiB free"
    # A GPU given with --vram has no name of its own ("given"): the line says GPU, and the source says given.
    machine_text += "".join(f", GPU {'' if g.name == 'given' else g.name + ': '}{g.free / GiB:.1f} of "
                            f"{g.total / GiB:.1f} GiB free" for g in machine.gpus)
    if not machine.gpus:
        machine_text += ", no GPU (CPU plan)"
    plan = Plan("fits", str(model.name or model.path.name), model.file_type, f"{machine_text} ({machine.source})",
                inp, inp, _usage(model, machine, inp), extra_buffers(inp.cpu_extra_buffers, machine),
                threads=threads(inp.n_threads, machine))
    if model.truncated:
        plan.warnings.append(f"{model.path} is {model.file_size / MiB:,.0f} MiB but its tensors need "
                             f"{model.weights_bytes / MiB:,.0f} MiB: a truncated download? llama.cpp will not load it")
    if inp.kv_type != "f16" and not _kv_quantisable(model):
        plan.verdict = "refuse"
        plan.reasons.append(f"a {inp.kv_type} KV cache needs head sizes divisible by 32; this model's are "
                            f"{model.key_length}/{model.value_length}: use kv_cache_policy = \"f16\"")
        return plan
    if gpu_plan and inp.offload_policy == "disabled":
        on_gpu, _ = _gpu_layers(model, inp.n_gpu_layers)
        if on_gpu < model.n_layer:
            plan.verdict = "refuse"
            plan.reasons.append(f"n_gpu_layers = {inp.n_gpu_layers} leaves {model.n_layer - on_gpu} layers on the "
                                "CPU but offload_policy is \"disabled\"; set offload_policy = \"explicit\" to "
                                "accept the slowdown, or n_gpu_layers = -1")
            return plan
    for device in plan.devices:
        if not device.fits:
            plan.reasons.append(f"{device.device}: needs {device.total / MiB:,.0f} MiB, budget is "
                                f"{device.budget / MiB:,.0f} MiB ({inp.budget_fraction:.0%} of "
                                f"{device.free / MiB:,.0f} MiB free)")
    if not plan.reasons:
        if model.context_length and inp.ctx > model.context_length:
            plan.warnings.append(f"max_seq_len {inp.ctx} is beyond the model's training context "
                                 f"{model.context_length}")
        return plan
    ctx = _largest_ctx(model, machine, inp, inp.ctx - 1)
    if ctx is not None and ctx >= MIN_SHRINK_CTX:
        plan.verdict = "shrink"
        plan.planned = replace(inp, ctx=ctx)
        plan.devices = _usage(model, machine, plan.planned)
        plan.reasons.append(f"max_seq_len {inp.ctx} does not fit; {ctx} is the largest that does")
    else:
        plan.verdict = "refuse"
    plan.options = _options(model, machine, inp)
    return plan


def recommend_quant(machine: Machine) -> str:
    """The quantisation of a 7-8B model that fits the largest GPU's memory, by the field report's rule of thumb."""
    vram = max((g.total for g in machine.gpus), default=0)
    if vram >= 16 * GiB:
        return "Q8_0 of a 7-8B model (about 8 GB of weights): near-lossless with room for context"
    if vram >= 8 * GiB - 512 * MiB:
        return "Q4_K_M of a 7-8B model (about 4.4-4.9 GB): 30-55 tokens/s on an 8 GB card"
    if vram >= 6 * GiB - 512 * MiB:
        return "Q4_0 of a 7B model (about 4.1 GB) with a short context, or a 3B model in Q4_K_M"
    if vram > 0:
        return "a 3B model in Q4_K_M (about 2 GB), or CPU only"
    return ("no GPU: a 3B model in Q4_K_M (about 2 GB) on the CPU gives a few tokens/s; "
            "a 7B Q4_K_M needs about 6 GB of RAM and decodes at roughly 2-5 tokens/s")


def plan_input(settings: Settings, *, ctx: int | None = None, n_seq: int | None = None,
               kv_type: str | None = None, n_gpu_layers: int | None = None,
               offload_policy: str | None = None) -> PlanInput:
    """The planner's view of a configuration, with optional what-if overrides."""
    return PlanInput(
        ctx=ctx or settings.runtime.max_seq_len,
        n_seq=n_seq or settings.runtime.n_parallel,
        kv_type=kv_type or settings.memory.kv_cache_policy,
        n_gpu_layers=settings.model.n_gpu_layers if n_gpu_layers is None else n_gpu_layers,
        offload_policy=(offload_policy or settings.memory.offload_policy),  # type: ignore[arg-type]
        budget_fraction=settings.memory.budget_fraction,
        margin=settings.memory.margin_mib * MiB,
        n_ubatch=min(settings.runtime.n_batch, 512),
        cpu_extra_buffers=settings.model.cpu_extra_buffers,
        n_threads=settings.model.n_threads,
    )
