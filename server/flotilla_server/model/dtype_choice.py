"""`--dtype auto`: the dtype a model's weights and KV cache take, from the device, how the weights are held
and what the CPU computes natively. A pure decision (`choose_dtype`) beside the one reader of the machine it
needs (`read_cpu_facts`), torch-free: the multi-model server sizes each model in its HTTP process.

Why: bfloat16 halves the bytes a decode step reads, and on a CPU that computes it (avx512_bf16 or AMX,
through oneDNN) it is faster than float32; on a CPU without those instructions oneDNN emulates it, and it
is slower where the step is bound by arithmetic. On this project's 2-core Xeon VM (family 6 model 167,
AVX-512 with bfloat16 and AMX), SmolLM2-135M dequantized (`flotilla-bench steps --model smollm2
--quantization none --batch 1 --batch 16`, one thread) decodes at 33.5 / 243.6 tok/s in bfloat16 against
27.1 / 132.5 in float32 at batch 1 / 16; with oneDNN and ATen capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2,
ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2), 29.9 / 56.7 in bfloat16 against
26.2 / 106.4 in float32. A 2-core AVX2-only AMD EPYC measured 12 tok/s in bfloat16 against float32's 42 at
16 clients over HTTP. Weights kept quantized on CPU (`gguf` blocks, `int8` rows) are multiplied by kernels
that take float32 activations (model/quant_blocks.py, model/int8_weights.py), so their dtype is float32.
A mixture of experts (model/moe.py) multiplies each expert's few rows of a step on its own, unpacked weight
(a packed copy of every expert would double the model's largest part), which oneDNN reorders on every
bfloat16 call (40 us a [2, 512] x [512, 384] product, against 10-13 us in float32, one thread); `flotilla-bench moe`
(docs/benchmarks.md, "Mixture of experts") decoded its Qwen3-MoE-shaped model at 105.9 / 237.8 tok/s at 1 / 16
streams in float32 against 67.9 / 206.4 in bfloat16 on the Xeon VM, so `auto` picks float32 for one.

Rules (`choose_dtype`):
- an explicit dtype is kept; bfloat16 on a CPU that lacks native bfloat16 carries a warning with the cost;
- `auto` on a GPU: bfloat16 (float16 where the GPU lacks bfloat16);
- `auto` on CPU: float32 for weights held as `gguf` or `int8`, and for a mixture of experts; otherwise bfloat16
  where the CPU computes it natively and oneDNN is not capped below it (ONEDNN_MAX_CPU_ISA), float32 elsewhere;
- every choice carries its reason, which the engine logs at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flotilla_contract.flags import DTYPES

AUTO = "auto"
# /proc/cpuinfo flags of instructions that compute bfloat16 (oneDNN's avx512_core_bf16 and avx512_core_amx)
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
# ONEDNN_MAX_CPU_ISA values that leave oneDNN its bfloat16 instructions: the caps named after them, and no cap
_BFLOAT16_ISA_WORDS = ("BF16", "AMX", "AVX10", "ALL", "DEFAULT")
EMULATED_BFLOAT16_COST = ("oneDNN emulates it: measured 1.9x slower than float32 at batch 16 with oneDNN capped at "
                          "AVX2, 3.5x at 16 clients on a 2-core AVX2-only AMD EPYC (docs/serving.md, \"dtype\")")


@dataclass(frozen=True)
class CpuFacts:
    flags: frozenset[str]  # /proc/cpuinfo's `flags`
    onednn_max_isa: str | None = None  # ONEDNN_MAX_CPU_ISA, as set

    @property
    def native_bfloat16(self) -> bool:
        if not any(f in self.flags for f in NATIVE_BFLOAT16_FLAGS):
            return False
        cap = (self.onednn_max_isa or "").upper()
        return not cap or any(word in cap for word in _BFLOAT16_ISA_WORDS)

    def describe(self) -> str:
        has = [f for f in NATIVE_BFLOAT16_FLAGS if f in self.flags]
        text = f"the CPU has {' and '.join(has)}" if has else f"the CPU has neither {' nor '.join(NATIVE_BFLOAT16_FLAGS)}"
        if has and not self.native_bfloat16:
            text += f", but ONEDNN_MAX_CPU_ISA={self.onednn_max_isa} caps oneDNN below them"
        return text


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # one of flags.DTYPES
    reason: str
    warning: str | None = None


def read_cpu_facts(environ: Mapping[str, str], cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    """This machine's CPU flags (none where /proc/cpuinfo cannot be read: float32 then) and oneDNN's cap."""
    flags: frozenset[str] = frozenset()
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("flags"):
                    flags = frozenset(line.partition(":")[2].split())
                    break
    except OSError:
        pass
    return CpuFacts(flags, environ.get("ONEDNN_MAX_CPU_ISA"))


def choose_dtype(requested: str, device: str, quantization: str, cpu: CpuFacts,
                 gpu_has_bfloat16: bool = True, moe: bool = False) -> DtypeChoice:
    """`requested`: flags.DTYPE_CHOICES; `quantization`: how the weights are held (resolved: none, gguf, int8);
    `moe`: the model is a mixture of experts (ModelConfig.moe)."""
    if requested != AUTO:
        if requested not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {requested!r}")
        warning = None
        if requested == "bfloat16" and device == "cpu" and not cpu.native_bfloat16:
            warning = (f"--dtype bfloat16 on a CPU without native bfloat16 ({cpu.describe()}): {EMULATED_BFLOAT16_COST}; "
                       "--dtype auto picks float32 here")
        return DtypeChoice(requested, f"--dtype {requested} as given", warning)
    if device != "cpu":
        if gpu_has_bfloat16:
            return DtypeChoice("bfloat16", "--dtype auto on a GPU: bfloat16")
        return DtypeChoice("float16", "--dtype auto on a GPU without bfloat16: float16")
    if quantization in ("gguf", "int8"):
        return DtypeChoice("float32", f"--dtype auto with weights held as {quantization} on CPU: float32, the "
                                      "activations its kernels multiply")
    if moe:
        return DtypeChoice("float32", "--dtype auto on CPU for a mixture of experts: float32, whose experts' few-row "
                                      "products run faster than bfloat16's (each expert's weight unpacked)")
    if cpu.native_bfloat16:
        return DtypeChoice("bfloat16", f"--dtype auto on CPU: bfloat16, since {cpu.describe()} (oneDNN computes it)")
    return DtypeChoice("float32", f"--dtype auto on CPU: float32, since {cpu.describe()} (bfloat16 would be "
                                  "emulated)")
