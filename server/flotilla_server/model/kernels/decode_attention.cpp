// torch.ops.flotilla.paged_decode_attention(q [n, heads, d], k_pool, v_pool [num_slots, kv_heads, d],
// block_tables [n, max_blocks] int32, context_lens [n] int32, block_size, scale) -> [n, heads, d]: one query
// per sequence (a decode row) attends to the first context_lens[i] keys of its sequence, read straight from
// the layer's pools through its block table: softmax(q k^T * scale) v in float32, the heads h * group ..
// h * group + group - 1 sharing kv head h (model/attention.py calls it; scripts/build_kernels.py builds it).
//
// Why: the torch path gathers each sequence's blocks into a scratch copy (two index_select), builds a mask,
// and runs scaled_dot_product_attention on the copy: on this project's 2-core Xeon VM (family 6 model 167),
// SmolLM2-135M's attention at batch 1 and 150 keys took about 35 us a layer that way, mostly dispatch and
// copies; this reads each key and value once, where they lie.
//
// torch.ops.flotilla.decode_attention(qkv, cos, sin, k_pool, v_pool, slots, block_tables, context_lens,
// block_size, scale, heads, kv_heads) -> [n, heads * d]: decode_ops.cpp's rope_kv_write on a decode step's fused
// projection output, then this attention on its rotated q heads, in one call (model/llama.py's decode steps).
//
// How: a work item is one sequence, one kv head and a run of at most kChunkKeys keys. For up to
// kTileHeads query heads at a time it computes the scores (pass 1), their softmax (max, exp, sum; pass 2) and
// the weighted sum of the values (pass 3) with the scores in a buffer on the stack. A context longer than
// kChunkKeys is split into chunks at fixed key positions, each a work item that leaves its max, sum and
// unnormalised output; the chunks are then merged in order (flash-decoding's split), so that one long
// sequence keeps every thread busy.
//
// Rules:
// - each output element is computed by one thread, in an order fixed by the sequence's own context length
//   (chunks at multiples of kChunkKeys, lanes summed in decode_simd.h's fixed tree): the same bits on any
//   thread count, and a row's result does not depend on the other rows of the step;
// - the lanes follow the kernels' instruction set (decode_simd.h: AVX-512, AVX2 or SSE2; fewer where d is
//   not a multiple of them); the paths differ by float rounding only;
// - work items are split among torch's OpenMP threads in contiguous runs (a static schedule) once a call has
//   kParallelWork multiply-adds: each thread then streams its own sequences' blocks (llama-100m at batch 64,
//   2 threads: 17.0-17.5 ms of attention a step, against 22.5-23.0 dealt one item at a time and 18.1-18.4 four
//   at a time), and a long context's chunks are items of their own, so no run is much longer than another;
// - denormals are flushed to zero while it computes (decode_simd.h's FlushDenormals): tiny softmax weights
//   times values would otherwise cost ~100 cycles a product;
// - the block ids a sequence reads are checked to lie in the pools before anything is read.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "decode_simd.h"

namespace {

using namespace flotilla::decode;

constexpr int64_t kChunkKeys = 512;
constexpr int64_t kPrefetchKeys = 16;  // key and value rows are fetched this many keys ahead
constexpr int64_t kScoreRow = kChunkKeys + 16;  // a head's scores, and room for the last W keys' store
constexpr int kTileHeads = 4;
constexpr int64_t kMaxGroup = 64;  // query heads per kv head
// multiply-adds (keys x heads x d, twice) from which the items are shared among threads: at batch 1 with
// SmolLM2's 9 heads of 64 on the Xeon VM, a second thread gained nothing at 100 keys (6.3 us either way) and
// from 150 keys on 5-45 % (150: 7.8 -> 7.4 us, 600: 20.8 -> 15.5, 1000: 37.6 -> 20.4)
constexpr int64_t kParallelWork = 1 << 17;

struct Problem {
  const float* q;
  int64_t q_row_stride;  // query head j of row s at q + s * q_row_stride + j * d
  const float* k;
  const float* v;
  const int32_t* tables;
  int64_t table_stride;
  int64_t kv_heads, group, d, block_size;
  float scale;
};

struct Item {
  int64_t seq, kv_head, first_key, end_key, chunk;  // chunk: index among its sequence's chunks
};

// the pool offset (in floats, for kv head 0) of each key of the item, through its sequence's block table
INLINE int64_t key_rows(const Problem& P, const Item& it, int64_t* rows) {
  const int32_t* table = P.tables + it.seq * P.table_stride;
  const int64_t key_stride = P.kv_heads * P.d;
  for (int64_t t = it.first_key; t < it.end_key;) {
    const int64_t offset = t % P.block_size, run = std::min(P.block_size - offset, it.end_key - t);
    const int64_t row = (static_cast<int64_t>(table[t / P.block_size]) * P.block_size + offset) * key_stride;
    for (int64_t r = 0; r < run; ++r) rows[t - it.first_key + r] = row + r * key_stride;
    t += run;
  }
  return it.end_key - it.first_key;
}

// a row of d floats kPrefetchKeys keys ahead, into the caches (a prefetch never faults): each key's row of one
// kv head lies kv_heads * d floats from the next key's, a stride the hardware prefetcher does not follow
INLINE void prefetch_row(const float* base, const int64_t* rows, int64_t i, int64_t n, int64_t d) {
  if (i + kPrefetchKeys >= n) return;
  const char* row = reinterpret_cast<const char*>(base + rows[i + kPrefetchKeys]);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(row + b, 0, 3);
}

// out[g][:d] = sum_i p[g][i] v_i for GT heads, NV vectors of d at a time (accumulators stay in registers)
template <int W, int GT, int NV>
INLINE void weigh_values(const int64_t* rows, int64_t n, const float* v_head, const float (*p)[kScoreRow],
                         int64_t c0, int64_t d, float* const* out) {
  VecF<W> acc[GT][NV];
  for (int g = 0; g < GT; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = splat<W>(0.f);
  for (int64_t i = 0; i < n; ++i) {
    if (c0 == 0) prefetch_row(v_head, rows, i, n, d);
    VecF<W> value[NV];
    for (int j = 0; j < NV; ++j) value[j] = load<W>(v_head + rows[i] + c0 + j * W);
    for (int g = 0; g < GT; ++g) {
      const VecF<W> weight = splat<W>(p[g][i]);
      for (int j = 0; j < NV; ++j) acc[g][j] += weight * value[j];
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int j = 0; j < NV; ++j) store<W>(out[g] + c0 + j * W, acc[g][j]);
}

template <int W, int GT>
INLINE void attend_heads(const Problem& P, const int64_t* rows, int64_t n, const Item& it, int64_t first_head,
                         float* const* out, float* max_out, float* sum_out) {
  float p[GT][kScoreRow];
  const float* q[GT];
  for (int g = 0; g < GT; ++g) q[g] = P.q + it.seq * P.q_row_stride + (first_head + g) * P.d;
  const float* k_head = P.k + it.kv_head * P.d;
  const float* v_head = P.v + it.kv_head * P.d;
  // pass 1: scores, W keys at a time: each key's dot product in W lanes, the W keys' lanes summed together
  // (sums_of_lanes), times the scale
  for (int64_t i0 = 0; i0 < n; i0 += W) {
    VecF<W> partial[GT][W];
    for (int k = 0; k < W; ++k) {
      VecF<W> acc[GT];
      for (int g = 0; g < GT; ++g) acc[g] = splat<W>(0.f);
      if (i0 + k < n) {
        prefetch_row(k_head, rows, i0 + k, n, P.d);
        const float* key = k_head + rows[i0 + k];
        for (int64_t c = 0; c < P.d; c += W) {
          const VecF<W> lanes = load<W>(key + c);
          for (int g = 0; g < GT; ++g) acc[g] += load<W>(q[g] + c) * lanes;
        }
      }
      for (int g = 0; g < GT; ++g) partial[g][k] = acc[g];
    }
    for (int g = 0; g < GT; ++g) store<W>(&p[g][i0], sums_of_lanes<W>(partial[g]) * splat<W>(P.scale));
  }
  // pass 2: p = exp(score - max), and the sum of p
  for (int g = 0; g < GT; ++g) {
    float high = -HUGE_VALF;  // n >= 1: every item has a key
    int64_t i = 0;
    if (n >= W) {
      VecF<W> highs = load<W>(&p[g][0]);
      for (i = W; i + W <= n; i += W) highs = max<W>(highs, load<W>(&p[g][i]));
      high = max_lanes<W>(highs);
    }
    for (; i < n; ++i) high = std::max(high, p[g][i]);
    VecF<W> total = splat<W>(0.f);
    for (i = 0; i + W <= n; i += W) {
      const VecF<W> e = exp_lanes<W>(load<W>(&p[g][i]) - splat<W>(high));
      store<W>(&p[g][i], e);
      total += e;
    }
    float sum = sum_lanes<W>(total);
    for (; i < n; ++i) {
      p[g][i] = exp_lanes<1>(load<1>(&p[g][i]) - splat<1>(high))[0];
      sum += p[g][i];
    }
    max_out[g] = high;
    sum_out[g] = sum;
  }
  // pass 3: the weighted values, in tiles of at most 4 (AVX-512) or 2 vectors of d
  constexpr int64_t kMaxVectors = W == 16 ? 4 : 2;
  for (int64_t c0 = 0; c0 < P.d;) {
    const int64_t vectors = std::min(kMaxVectors, (P.d - c0) / W);
    if (vectors >= 4) weigh_values<W, GT, 4>(rows, n, v_head, p, c0, P.d, out);
    else if (vectors == 3) weigh_values<W, GT, 3>(rows, n, v_head, p, c0, P.d, out);
    else if (vectors == 2) weigh_values<W, GT, 2>(rows, n, v_head, p, c0, P.d, out);
    else weigh_values<W, GT, 1>(rows, n, v_head, p, c0, P.d, out);
    c0 += vectors * W;
  }
}

// one work item: every query head of its kv head, kTileHeads at a time; out[j]: head j's row of d floats
template <int W> INLINE void attend_item(const Problem& P, const Item& it, float* const* out, float* max_out,
                                         float* sum_out) {
  int64_t rows[kChunkKeys];
  const int64_t n = key_rows(P, it, rows);
  for (int64_t g0 = 0; g0 < P.group; g0 += kTileHeads) {
    const int64_t head = it.kv_head * P.group + g0;
    float* const* o = out + g0;
    switch (std::min<int64_t>(kTileHeads, P.group - g0)) {
      case 4: attend_heads<W, 4>(P, rows, n, it, head, o, max_out + g0, sum_out + g0); break;
      case 3: attend_heads<W, 3>(P, rows, n, it, head, o, max_out + g0, sum_out + g0); break;
      case 2: attend_heads<W, 2>(P, rows, n, it, head, o, max_out + g0, sum_out + g0); break;
      default: attend_heads<W, 1>(P, rows, n, it, head, o, max_out + g0, sum_out + g0); break;
    }
  }
}

using AttendItem = void (*)(const Problem&, const Item&, float* const*, float*, float*);
TARGET_AVX512 void attend_avx512(const Problem& P, const Item& it, float* const* o, float* m, float* l) {
  attend_item<16>(P, it, o, m, l);
}
TARGET_AVX2 void attend_avx2(const Problem& P, const Item& it, float* const* o, float* m, float* l) {
  attend_item<8>(P, it, o, m, l);
}
void attend_sse2(const Problem& P, const Item& it, float* const* o, float* m, float* l) {
  attend_item<4>(P, it, o, m, l);
}
void attend_plain(const Problem& P, const Item& it, float* const* o, float* m, float* l) {
  attend_item<1>(P, it, o, m, l);
}

AttendItem attend_for(Lanes lanes, int64_t d) {
  if (lanes == Lanes::avx512 && d % 16 == 0) return attend_avx512;
  if (lanes >= Lanes::avx2 && d % 8 == 0) return attend_avx2;
  return d % 4 == 0 ? attend_sse2 : attend_plain;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& tables,
                  const at::Tensor& context_lens, int64_t block_size) {
  const char* op = "paged_decode_attention";
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 &&
              q.stride(1) == q.size(2), op, ": q must be float32 [n, heads, d] on CPU with contiguous heads");
  for (const at::Tensor* pool : {&k_pool, &v_pool})
    TORCH_CHECK(pool->device().is_cpu() && pool->scalar_type() == at::kFloat && pool->is_contiguous() &&
                pool->dim() == 3 && pool->sizes() == k_pool.sizes() && pool->size(2) == q.size(2),
                op, ": k_pool and v_pool must be contiguous float32 [slots, kv_heads, ", q.size(2), "]");
  TORCH_CHECK(k_pool.size(1) > 0 && q.size(1) % k_pool.size(1) == 0 && q.size(1) / k_pool.size(1) <= kMaxGroup,
              op, ": ", q.size(1), " heads do not share ", k_pool.size(1), " kv heads evenly, at most ", kMaxGroup,
              " to one");
  TORCH_CHECK(block_size > 0 && k_pool.size(0) % block_size == 0, op, ": the pools do not hold whole blocks of ",
              block_size);
  TORCH_CHECK(tables.device().is_cpu() && tables.scalar_type() == at::kInt && tables.is_contiguous() &&
              tables.dim() == 2 && tables.size(0) == q.size(0), op, ": block_tables must be int32 [n, max_blocks]");
  TORCH_CHECK(context_lens.device().is_cpu() && context_lens.scalar_type() == at::kInt &&
              context_lens.is_contiguous() && context_lens.numel() == q.size(0), op,
              ": context_lens must be int32 [n]");
  const int64_t num_blocks = k_pool.size(0) / block_size, max_blocks = tables.size(1);
  const int32_t* ctx = context_lens.data_ptr<int32_t>();
  const int32_t* table = tables.data_ptr<int32_t>();
  for (int64_t s = 0; s < q.size(0); ++s) {
    TORCH_CHECK(ctx[s] >= 1 && ctx[s] <= max_blocks * block_size, op, ": context length ", ctx[s], " of row ", s,
                " is not in 1..", max_blocks * block_size);
    for (int64_t b = 0; b < (ctx[s] + block_size - 1) / block_size; ++b)
      TORCH_CHECK(table[s * max_blocks + b] >= 0 && table[s * max_blocks + b] < num_blocks, op, ": block ",
                  table[s * max_blocks + b], " of row ", s, " is outside the pools' ", num_blocks, " blocks");
  }
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t block_size,
                                  double scale) {
  check_inputs(q, k_pool, v_pool, block_tables, context_lens, block_size);
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k_pool.size(1), group = heads / kv_heads;
  at::Tensor out = at::empty({n, heads, d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (n == 0 || d == 0) return out;
  const Problem P{q.data_ptr<float>(), q.stride(0), k_pool.data_ptr<float>(), v_pool.data_ptr<float>(),
                  block_tables.data_ptr<int32_t>(), block_tables.size(1), kv_heads, group, d, block_size,
                  static_cast<float>(scale)};
  const int32_t* ctx = context_lens.data_ptr<int32_t>();
  // work items; a sequence of several chunks keeps partial outputs [chunks, heads] x (d + max + sum)
  std::vector<Item> items;
  std::vector<int64_t> partial_at(n, -1);  // a split sequence's first partial row
  int64_t partial_rows = 0, work = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t chunks = (ctx[s] + kChunkKeys - 1) / kChunkKeys;
    if (chunks > 1) partial_at[s] = std::exchange(partial_rows, partial_rows + chunks * heads);
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t c = 0; c < chunks; ++c)
        items.push_back({s, h, c * kChunkKeys, std::min<int64_t>(ctx[s], (c + 1) * kChunkKeys), c});
    work += 2 * ctx[s] * heads * d;
  }
  std::vector<float> partial(partial_rows * (d + 2));
  float* o = out.data_ptr<float>();
  const AttendItem attend = attend_for(active_lanes(), d);
  const int64_t count = static_cast<int64_t>(items.size());
  #pragma omp parallel for schedule(static) if (count > 1 && work >= kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    const FlushDenormals flush;
    const Item& it = items[i];
    float* rows[kMaxGroup];
    float stats[2 * kMaxGroup];
    float* max_out = stats;
    float* sum_out = stats + group;
    const bool split = partial_at[it.seq] >= 0;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t head = it.kv_head * group + g;
      rows[g] = split ? partial.data() + (partial_at[it.seq] + it.chunk * heads + head) * (d + 2)
                      : o + (it.seq * heads + head) * d;
    }
    attend(P, it, rows, max_out, sum_out);
    for (int64_t g = 0; g < group; ++g) {
      if (split) {
        rows[g][d] = max_out[g];
        rows[g][d + 1] = sum_out[g];
      } else {
        for (int64_t j = 0; j < d; ++j) rows[g][j] /= sum_out[g];
      }
    }
  }
  // merge the chunks of split sequences, in chunk order: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
  const FlushDenormals flush;
  for (int64_t s = 0; s < n; ++s) {
    if (partial_at[s] < 0) continue;
    const int64_t chunks = (ctx[s] + kChunkKeys - 1) / kChunkKeys;
    for (int64_t head = 0; head < heads; ++head) {
      const float* part = partial.data() + (partial_at[s] + head) * (d + 2);
      const int64_t part_stride = heads * (d + 2);
      float high = part[d];
      for (int64_t c = 1; c < chunks; ++c) high = std::max(high, part[c * part_stride + d]);
      float* y = o + (s * heads + head) * d;
      std::fill_n(y, d, 0.f);
      float total = 0.f;
      for (int64_t c = 0; c < chunks; ++c) {
        const float* pc = part + c * part_stride;
        const float w = std::exp(pc[d] - high);
        total += w * pc[d + 1];
        for (int64_t j = 0; j < d; ++j) y[j] += w * pc[j];
      }
      for (int64_t j = 0; j < d; ++j) y[j] /= total;
    }
  }
  return out;
}

// rope_kv_write, then paged_decode_attention on the rotated q heads of qkv, as [n, heads * d]: one call for a
// layer's whole attention between its projections in a decode step (each op call costs ~2 us of dispatch)
at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& slots,
                            const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t block_size,
                            double scale, int64_t heads, int64_t kv_heads) {
  rope_kv_write(qkv, cos, sin, k_pool, v_pool, slots, heads, kv_heads);
  const int64_t n = qkv.size(0), d = k_pool.size(2);
  const at::Tensor q = qkv.narrow(1, 0, heads * d).view({n, heads, d});
  return paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens, block_size, scale).view({n, heads * d});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flotilla, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor context_lens, "
        "int block_size, float scale) -> Tensor");
  m.def("decode_attention(Tensor(a!) qkv, Tensor cos, Tensor sin, Tensor(b!) k_pool, Tensor(c!) v_pool, Tensor slots, "
        "Tensor block_tables, Tensor context_lens, int block_size, float scale, int heads, int kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(flotilla, CPU, m) {
  m.impl("paged_decode_attention", paged_decode_attention);
  m.impl("decode_attention", decode_attention);
}
