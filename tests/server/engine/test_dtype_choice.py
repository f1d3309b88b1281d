"""`--dtype auto` (model/dtype_choice.py): a table of the decision, its properties, the machine reader, and
the engine that takes the choice (its weights, its KV cache, its log)."""

from __future__ import annotations

import logging

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.model.dtype_choice import CpuFacts, choose_dtype, read_cpu_facts
from hypothesis import given
from hypothesis import strategies as st

AMX = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
BF16 = CpuFacts(frozenset({"avx2", "avx512f", "avx512_bf16"}))
AVX512 = CpuFacts(frozenset({"avx2", "avx512f", "avx512bw"}))
EPYC = CpuFacts(frozenset({"avx2", "fma", "f16c"}))
AMX_CAPPED = CpuFacts(AMX.flags, onednn_max_isa="AVX2")


@pytest.mark.parametrize(("requested", "device", "quantization", "cpu", "dtype", "says"), [
    ("auto", "cpu", "none", AMX, "bfloat16", "the CPU has avx512_bf16 and amx_bf16"),
    ("auto", "cpu", "none", BF16, "bfloat16", "the CPU has avx512_bf16"),
    ("auto", "cpu", "none", AVX512, "float32", "neither avx512_bf16 nor amx_bf16"),
    ("auto", "cpu", "none", EPYC, "float32", "bfloat16 would be emulated"),
    ("auto", "cpu", "none", AMX_CAPPED, "float32", "ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN below them"),
    ("auto", "cpu", "none", CpuFacts(AMX.flags, "AVX512_CORE_AMX"), "bfloat16", "amx_bf16"),
    ("auto", "cpu", "gguf", AMX, "float32", "weights held as gguf"),
    ("auto", "cpu", "int8", AMX, "float32", "weights held as int8"),
    ("auto", "cuda", "none", EPYC, "bfloat16", "on a GPU"),
    ("auto", "cuda:1", "gguf", EPYC, "bfloat16", "on a GPU"),
    ("float32", "cpu", "none", AMX, "float32", "as given"),
    ("bfloat16", "cpu", "gguf", EPYC, "bfloat16", "as given"),
    ("float16", "cuda", "none", EPYC, "float16", "as given"),
])
def test_the_choice_and_its_reason(requested, device, quantization, cpu, dtype, says):
    choice = choose_dtype(requested, device, quantization, cpu)
    assert choice.dtype == dtype
    assert says in choice.reason


@pytest.mark.parametrize(("device", "quantization", "dtype"), [
    ("cpu", "none", "float32"), ("cpu", "gguf", "float32"), ("cuda", "none", "bfloat16")])
def test_a_mixture_of_experts_on_cpu_is_float32_even_where_bfloat16_is_native(device, quantization, dtype):
    choice = choose_dtype("auto", device, quantization, AMX, moe=True)
    assert choice.dtype == dtype
    if (device, quantization) == ("cpu", "none"):
        assert "mixture of experts" in choice.reason
    assert choose_dtype("bfloat16", "cpu", "none", AMX, moe=True).dtype == "bfloat16"  # as given


def test_the_engine_serves_a_mixture_of_experts_directory_in_float32_under_auto(hf_model, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # bfloat16 native here, were it dense
    path, _ = hf_model("mixtral")
    core = EngineCore(EngineConfig(model=str(path), dtype="auto", num_kv_blocks=8))
    assert str(core.loaded.model.compute_dtype) == "torch.float32"


def test_a_gpu_without_bfloat16_gets_float16():
    assert choose_dtype("auto", "cuda", "none", EPYC, gpu_has_bfloat16=False).dtype == "float16"


@pytest.mark.parametrize(("cpu", "warns"), [(EPYC, True), (AVX512, True), (AMX_CAPPED, True), (AMX, False)])
def test_an_explicit_bfloat16_warns_with_the_cost_only_where_it_is_emulated(cpu, warns):
    warning = choose_dtype("bfloat16", "cpu", "none", cpu).warning
    assert (warning is not None) is warns
    if warns:
        assert "1.9x slower than float32" in warning and "--dtype auto picks float32 here" in warning
    assert choose_dtype("bfloat16", "cuda", "none", EPYC).warning is None  # a GPU's is not emulated


def test_an_unknown_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype must be auto or one of float32, bfloat16, float16, got 'int8'"):
        choose_dtype("int8", "cpu", "none", AMX)


@given(flags=st.frozensets(st.sampled_from(["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"])),
       cap=st.sampled_from([None, "AVX2", "AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL"]),
       quantization=st.sampled_from(["none", "gguf", "int8"]))
def test_auto_on_cpu_never_picks_an_emulated_or_a_half_dtype(flags, cap, quantization):
    cpu = CpuFacts(flags, cap)
    choice = choose_dtype("auto", "cpu", quantization, cpu)
    assert choice.dtype in ("float32", "bfloat16") and choice.warning is None
    if choice.dtype == "bfloat16":
        assert quantization == "none" and flags & {"avx512_bf16", "amx_bf16"} and cap not in ("AVX2", "AVX512_CORE")


def test_the_reader_takes_the_flags_line_and_the_onednn_cap(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n\nflags\t: other\n")
    facts = read_cpu_facts({"ONEDNN_MAX_CPU_ISA": "AVX2"}, cpuinfo)
    assert facts == CpuFacts(frozenset({"fpu", "avx2", "avx512_bf16"}), "AVX2")
    assert read_cpu_facts({}, tmp_path / "missing") == CpuFacts(frozenset())  # unreadable: float32 then


@pytest.mark.parametrize("cap", [None, "AVX2"])
def test_the_engine_serves_in_the_chosen_dtype_and_logs_why(cap, monkeypatch, caplog):
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    expected = choose_dtype("auto", "cpu", "none", read_cpu_facts({"ONEDNN_MAX_CPU_ISA": cap} if cap else {}))
    with caplog.at_level(logging.INFO, logger="flotilla.engine"):
        core = EngineCore(EngineConfig(model="tiny", dtype="auto", num_kv_blocks=8))
    assert str(core.loaded.model.compute_dtype) == f"torch.{expected.dtype}"
    assert core.runner.kv.k[0].dtype == core.loaded.model.compute_dtype  # the KV cache too
    assert f"dtype {expected.dtype}: {expected.reason}" in caplog.text
    if cap == "AVX2":
        assert expected.dtype == "float32"


def test_an_engine_given_bfloat16_where_it_is_emulated_serves_it_and_warns_with_the_cost(monkeypatch, caplog):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN capped below any bfloat16 instruction
    with caplog.at_level(logging.INFO, logger="flotilla.engine"):
        core = EngineCore(EngineConfig(model="tiny", dtype="bfloat16", num_kv_blocks=8))
    assert str(core.loaded.model.compute_dtype) == "torch.bfloat16"
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING and "bfloat16" in r.getMessage()]
    assert "1.9x slower than float32" in warning.getMessage()
