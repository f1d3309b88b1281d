"""The native decode ops (model/decode_ops.py; model/kernels/decode_ops.cpp, decode_attention.cpp) against the
torch code they replace, on each instruction set this CPU has (forced through quant_blocks.force_isa), and
their torch fallbacks (decode_ops.NATIVE forced off) against the same references.

- paged_decode_attention: against softmax(q k^T * scale) v in float64 on each row's keys gathered through its
  block table (random pools, shuffled blocks, grouped-query heads 1, 3 and 4 to a kv head, contexts 1 to
  1000, batches 1, 3 and 16); the same bits on one thread and two, and a row's output the same bits alone and
  among other rows (batch invariance);
- rms_norm, add_rms_norm, silu_mul: against F.rms_norm and F.silu(gate) * up up to float rounding;
- rope_kv_write: torch's bits (rotate_half, then index_copy_ into the pools);
- the model: the tiny model's hidden states with the native ops within float rounding of the fallbacks'.

The native tests skip when the kernels are not built.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model import decode_ops
from flotilla_server.model.attention import AttentionBatch
from flotilla_server.model.kv_tensors import KVCacheTensors
from flotilla_server.model.quant_blocks import force_isa
from flotilla_server.model.rope import inverse_frequencies, rope_cos_sin

from .kernel_isas import available_isas

native = pytest.mark.skipif(not decode_ops.NATIVE, reason="native kernels not built (make setup)")
ISAS = available_isas() if decode_ops.NATIVE else []
CONTEXTS = (1, 15, 16, 17, 150, 1000)
BLOCK = 16


def _problem(batch: int, group: int, seed: int, head_dim: int = 64, kv_heads: int = 2, contexts=CONTEXTS):
    """q [batch, heads, d], pools with room for every row, int32 tables of shuffled blocks and lengths."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [contexts[(seed + i) % len(contexts)] for i in range(batch)]
    widths = [-(-c // BLOCK) for c in lengths]
    num_blocks = sum(widths) + 3
    blocks = random.Random(seed).sample(range(num_blocks), num_blocks)
    tables = [[blocks.pop() for _ in range(w)] for w in widths]
    width = max(widths)
    k_pool = torch.randn(num_blocks * BLOCK, kv_heads, head_dim, generator=gen)
    v_pool = torch.randn(num_blocks * BLOCK, kv_heads, head_dim, generator=gen)
    q = torch.randn(batch, kv_heads * group, head_dim, generator=gen)
    tables_t = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return q, k_pool, v_pool, tables_t, torch.tensor(lengths, dtype=torch.int32)


def _reference(q, k_pool, v_pool, tables, lengths, scale):
    """float64 attention of each row over its gathered keys."""
    group = q.shape[1] // k_pool.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, (table, length) in enumerate(zip(tables.tolist(), lengths.tolist(), strict=True)):
        slots = torch.tensor([table[t // BLOCK] * BLOCK + t % BLOCK for t in range(length)])
        keys = k_pool[slots].double().repeat_interleave(group, dim=1)  # [C, heads, d]
        values = v_pool[slots].double().repeat_interleave(group, dim=1)
        weights = (torch.einsum("hd,chd->hc", q[i].double(), keys) * scale).softmax(-1)
        out[i] = torch.einsum("hc,chd->hd", weights, values)
    return out


def _attend(q, k_pool, v_pool, tables, lengths, scale=0.125):
    with torch.inference_mode():
        return decode_ops.paged_decode_attention(q, k_pool, v_pool, tables, lengths, BLOCK, scale)


@native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_attention_matches_the_reference(isa, group, batch, restore_isa):
    force_isa(isa)
    for seed in range(len(CONTEXTS) if batch == 1 else 1):  # batch 1: each context in turn
        problem = _problem(batch, group, seed)
        torch.testing.assert_close(_attend(*problem).double(), _reference(*problem, 0.125), atol=2e-6, rtol=1e-5)


@native
@pytest.mark.parametrize("head_dim", [80, 40, 12, 6])
def test_attention_takes_head_dims_of_any_width(head_dim, restore_isa):
    """80: AVX-512 lanes; 40: AVX2's (not a multiple of 16); 12: SSE2's; 6: one lane."""
    for isa in ISAS:
        force_isa(isa)
        problem = _problem(5, 2, 1, head_dim=head_dim)
        torch.testing.assert_close(_attend(*problem, scale=0.3).double(), _reference(*problem, 0.3), atol=2e-6,
                                   rtol=1e-5)


@native
def test_attention_has_the_same_bits_on_one_thread_and_two(threads, restore_isa):
    problem = _problem(16, 3, 2, contexts=(1000, 17, 600, 150, 1))  # long rows are split into chunks
    for isa in ISAS:
        force_isa(isa)
        torch.set_num_threads(1)
        one = _attend(*problem)
        torch.set_num_threads(2)
        assert torch.equal(_attend(*problem), one), isa


@native
def test_a_rows_attention_does_not_depend_on_the_other_rows(threads, restore_isa):
    q, k_pool, v_pool, tables, lengths = _problem(16, 4, 3)
    torch.set_num_threads(2)
    for isa in ISAS:
        force_isa(isa)
        together = _attend(q, k_pool, v_pool, tables, lengths)
        for i in (0, 5, 15):
            own_blocks = tables[i:i + 1, : -(-int(lengths[i]) // BLOCK)]
            alone = _attend(q[i:i + 1], k_pool, v_pool, own_blocks, lengths[i:i + 1])
            assert torch.equal(alone[0], together[i]), (isa, i)


@native
def test_attention_reads_strided_queries_and_survives_underflowing_weights():
    """q as a view into a fused projection's rows; keys of zeros beside one large score: every other weight
    underflows (flushed to zero, not left as slow denormals), and the result is still the reference's."""
    q, k_pool, v_pool, tables, lengths = _problem(3, 3, 4)
    k_pool[:] = 0
    k_pool[tables[:, 0].long() * BLOCK] = 30.0  # each row's first key
    fused = torch.cat([q.reshape(3, -1), torch.randn(3, 50)], dim=1)
    strided = fused[:, : q[0].numel()].view(q.shape)
    assert not strided.is_contiguous()
    torch.testing.assert_close(_attend(strided, k_pool, v_pool, tables, lengths, scale=1.0).double(),
                               _reference(q, k_pool, v_pool, tables, lengths, 1.0), atol=2e-6, rtol=1e-5)


@native
def test_attention_refuses_blocks_outside_the_pools():
    q, k_pool, v_pool, tables, lengths = _problem(2, 1, 5)
    tables[1, 0] = k_pool.shape[0] // BLOCK
    with pytest.raises(RuntimeError, match="outside the pools"):
        _attend(q, k_pool, v_pool, tables, lengths)


def test_the_attention_fallback_matches_the_reference(monkeypatch):
    monkeypatch.setattr(decode_ops, "NATIVE", False)
    problem = _problem(3, 3, 6)
    torch.testing.assert_close(_attend(*problem).double(), _reference(*problem, 0.125), atol=2e-6, rtol=1e-5)


def test_the_step_layout_gives_decode_rows_their_tables():
    batch = AttentionBatch.build([3, 1, 1], [5, 18, 40], [[7], [2, 4, 9], [1, 3, 5, 6]], block_size=16, device="cpu")
    if not decode_ops.NATIVE:
        assert batch.decode_tables is None
        return
    assert batch.decode_tables.dtype == torch.int32 and batch.decode_tables.tolist() == [[2, 4, 0], [1, 3, 5]]
    assert batch.decode_context_lens.tolist() == [18, 40]


@pytest.mark.parametrize("native_ops", [True, False])
@pytest.mark.parametrize(("rows", "dim"), [(1, 576), (5, 64), (3, 13)])
def test_rms_norms_match_torch(native_ops, rows, dim, monkeypatch, restore_isa):
    if native_ops and not decode_ops.NATIVE:
        pytest.skip("native kernels not built (make setup)")
    monkeypatch.setattr(decode_ops, "NATIVE", native_ops)
    gen = torch.Generator().manual_seed(rows * dim)
    x, h, w = (torch.randn(rows, dim, generator=gen) * 3 for _ in range(3))
    w = w[0]
    for isa in ISAS or ["torch"]:
        force_isa(isa)
        with torch.inference_mode():
            torch.testing.assert_close(decode_ops.rms_norm(x, w, 1e-5), F.rms_norm(x, (dim,), w, 1e-5))
            h_after = h.clone()
            normed = decode_ops.add_rms_norm(h_after, x, w, 1e-6)
        assert torch.equal(h_after, h + x)  # the residual add has torch's bits
        torch.testing.assert_close(normed, F.rms_norm(h + x, (dim,), w, 1e-6))


@pytest.mark.parametrize("native_ops", [True, False])
@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (4, 37)])
def test_silu_mul_matches_torch(native_ops, rows, inter, monkeypatch, restore_isa):
    if native_ops and not decode_ops.NATIVE:
        pytest.skip("native kernels not built (make setup)")
    monkeypatch.setattr(decode_ops, "NATIVE", native_ops)
    gate_up = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 8
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, -90.0, 0.0])  # exp's clamps and zero
    gate, up = gate_up.chunk(2, dim=-1)
    for isa in ISAS or ["torch"]:
        force_isa(isa)
        with torch.inference_mode():
            out = decode_ops.silu_mul(gate_up)
        torch.testing.assert_close(out, F.silu(gate) * up, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("native_ops", [True, False])
@pytest.mark.parametrize("tokens", [1, 7])
def test_rope_kv_write_has_torchs_bits(native_ops, tokens, monkeypatch):
    if native_ops and not decode_ops.NATIVE:
        pytest.skip("native kernels not built (make setup)")
    monkeypatch.setattr(decode_ops, "NATIVE", native_ops)
    heads, kv_heads, d = 9, 3, 64
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen)
    cos, sin = rope_cos_sin(torch.arange(tokens) * 37 + 5, inverse_frequencies(d, 10000.0, None), torch.float32)
    slots = torch.randperm(64, generator=gen)[:tokens]
    k_pool, v_pool = torch.randn(64, kv_heads, d, generator=gen), torch.randn(64, kv_heads, d, generator=gen)
    # the reference: torch's rotation of the q and k heads side by side, then index_copy_ of k and v
    qk = qkv[:, : (heads + kv_heads) * d].view(tokens, -1, d)
    rotated = torch.cat((-qk[..., d // 2:], qk[..., : d // 2]), dim=-1)
    want_qk = qk * cos[:, None] + rotated * sin[:, None]
    want_k, want_v = k_pool.clone(), v_pool.clone()
    want_k.index_copy_(0, slots, want_qk[:, heads:])
    want_v.index_copy_(0, slots, qkv[:, (heads + kv_heads) * d:].view(tokens, kv_heads, d))
    with torch.inference_mode():
        decode_ops.rope_kv_write(qkv, cos[:, None], sin[:, None], k_pool, v_pool, slots, heads, kv_heads)
    assert torch.equal(qkv[:, : (heads + kv_heads) * d].view(tokens, -1, d), want_qk)
    assert torch.equal(k_pool, want_k) and torch.equal(v_pool, want_v)


@native
def test_decode_attention_is_rope_kv_write_then_attention():
    """The fused op of a decode step: the same bits as its two ops, and the same rotated qkv and pools."""
    q, k_pool, v_pool, tables, lengths = _problem(3, 3, 7)
    heads, kv_heads, d = q.shape[1], k_pool.shape[1], q.shape[2]
    qkv = torch.randn(3, (heads + 2 * kv_heads) * d)
    cos, sin = rope_cos_sin(lengths.long() - 1, inverse_frequencies(d, 10000.0, None), torch.float32)
    slots = torch.stack([tables[i, (c - 1) // BLOCK].long() * BLOCK + (c - 1) % BLOCK
                         for i, c in enumerate(lengths.tolist())])
    two = (qkv.clone(), k_pool.clone(), v_pool.clone())
    with torch.inference_mode():
        fused = decode_ops.native.decode_attention(qkv, cos, sin, k_pool, v_pool, slots, tables, lengths, BLOCK,
                                                   0.125, heads, kv_heads)
        decode_ops.native.rope_kv_write(two[0], cos, sin, two[1], two[2], slots, heads, kv_heads)
        apart = _attend(two[0][:, : heads * d].view(3, heads, d), two[1], two[2], tables, lengths)
    assert torch.equal(fused, apart.view(3, -1))
    assert all(torch.equal(a, b) for a, b in zip((qkv, k_pool, v_pool), two, strict=True))


@native
def test_the_models_native_layers_match_the_fallbacks(monkeypatch):
    """The tiny model (4 heads to 2 kv heads): a prefill of 20 tokens, then two decode rows beside a prefill
    chunk, then a decode step of three rows; hidden states with the native ops and with the fallbacks."""
    from flotilla_server.model.tiny import build_tiny_model

    model = build_tiny_model()
    cfg = model.config

    def run() -> list[torch.Tensor]:
        kv = KVCacheTensors.allocate(cfg.num_layers, 16, 8, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
        steps = [([20], [20], [[0, 1, 2]]), ([5, 1, 1], [5, 21, 1], [[3], [0, 1, 2], [4]]),
                 ([1, 1, 1], [6, 22, 2], [[3], [0, 1, 2], [4]])]
        outs = []
        for query_lens, context_lens, tables in steps:
            batch = AttentionBatch.build(query_lens, context_lens, tables, 8, "cpu")
            positions = torch.cat([torch.arange(c - q, c) for q, c in zip(query_lens, context_lens, strict=True)])
            ids = (positions * 7 + 3) % cfg.vocab_size
            with torch.inference_mode():
                outs.append(model(ids, positions, batch, kv))
        return outs

    native_outs = run()
    monkeypatch.setattr(decode_ops, "NATIVE", False)
    for got, want in zip(native_outs, run(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
