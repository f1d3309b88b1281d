// llama.cpp's Q5_0 (GGML type 6) and Q5_1 (7), for torch.ops.flotilla.quant_matmul and dequantize_blocks:
// quant_matmul.cpp checks the arguments, picks the instruction set and calls matmul() or dequantize() here
// (scripts/build_kernels.py builds every kernel source into one library).
//
// Why: llama.cpp writes a tensor whose rows are not a multiple of 256 weights (a hidden size of 640, say) in
// Q5_0, Q5_1 or Q8_0 inside a k-quant file, and Q5_0 and Q5_1 files hold nearly all their matrices so: 5.5
// and 6 bits per weight, against 32 for a float32 copy. A decode step at batch 1 reads every weight once, so
// its speed is the bytes it reads; the torch fallback writes and reads a float tile of every weight instead.
//
// Layouts (ggml-common.h; a block is 32 consecutive weights of a row, little-endian):
//   Q5_0, 22 bytes: fp16 d, uint32 qh, uint8 qs[16]; weight i < 16 is the low nibble of qs[i], weight 16 + i
//     its high nibble, each with bit i (or 16 + i) of qh as its fifth bit, q in 0..31; w = d * (q - 16)
//   Q5_1, 24 bytes: fp16 d, fp16 m, uint32 qh, uint8 qs[16]; q as Q5_0's; w = d * q + m
// Exact weights: d * (q - 16) and d * q are exact in float32 (an fp16 times an integer of 5 bits), so a Q5_0
// weight is that product and a Q5_1 weight is rounded once, at the sum with m, which an FMA rounds the same
// way: every path here computes gguf.quants.dequantize's bits (-0 included, for a negative d and q = 16).
//
// How (products): as quant_matmul.cpp's float path for Q4_0 and Q4_1, x is used as it is, each block of 32
// weights is decoded to float32 in registers and multiplied with x by FMA, each row of a tile of up to 4 x
// rows into its own accumulators, summed in a fixed order at the end. AVX-512: per block a table of its 32
// possible weights in two vectors ((v - 16) * d or v * d + m for v = 0..31: two operations for 32 weights),
// and vpermt2ps picks each weight by its 5 bits: the nibble, and in bit 4 the weight's bit of qh, which one
// rotate of qh broadcast to every lane puts there (a masked OR with qh as a mask register measured 3-6 %
// slower); two blocks per step, 4 accumulators per row. AVX2 (vpermps there takes 8 entries): the block's
// 32 integers are put together as bytes in weight order (q5_blocks.h), then each 8 sign-extended, converted
// and scaled (Q5_1: one FMA with m). Plain C++ decodes a block to 32 floats, then multiplies them in 8 lanes
// per row. The fp16 scales of up to kScaleBlocks blocks of a row are converted at a time (one gather, one
// conversion per 8 blocks) into a buffer that each block's step broadcasts from, as quant_matmul.cpp's
// float path does.
// Activations: float here, in the float mode (the default on AVX-512 and in plain C++) and in the int8 mode
// (these types have no int8 path); in the int16 mode (the default on AVX2) quant_matmul.cpp multiplies them
// in Q4_0's and Q4_1's int16 code instead, with q5_blocks.h's integers: on AVX2 this float path is bound by
// its decode instructions, as Q4_1's is.
//
// Measured on one thread (torch.set_num_threads(1)) of this project's 2-core Xeon VM (Intel, family 6 model
// 167, AVX-512 with VNNI), ns per weight of a one-row product, the median of 11 rounds of 20 ms of calls in
// thread CPU time; gguf-quantized random weights, which these shapes keep in the core's L2 or the L3; AVX2
// forced by kernel_isa("avx2"), which FLOTILLA_KERNEL_ISA=avx2 sets at load; against Q4_1 in its blocks,
// the torch fallback that multiplied Q5_0 and Q5_1 before these kernels (1 MiB tiles of float weights, also
// what a build without a compiler runs) and F.linear on float32 weights:
//                  AVX-512 (float)       AVX2, int16 (its auto)    AVX2, float           torch fallback  F.linear
//   n x k          Q5_0   Q5_1   Q4_1    Q5_0   Q5_1   Q4_1        Q5_0   Q5_1   Q4_1    Q5_0   Q5_1     float32
//   1536 x 1024    0.069  0.070  0.051   0.070  0.080  0.061       0.108  0.103  0.072   4.58   4.06     0.146
//   4096 x 1024    0.069  0.068  0.051   0.070  0.081  0.061       0.109  0.104  0.073   4.63   4.22     0.152
//   1024 x 4096    0.067  0.068  0.046   0.068  0.077  0.060       0.106  0.101  0.071   4.61   4.18     0.148
//   49152 x 512    0.079  0.079  0.059   0.073  0.084  0.062       0.112  0.108  0.077   4.25   4.14     0.297
// So on AVX-512 a Q5 weight takes 1.3-1.5x Q4_1's time, for 1.1x (Q5_0) and 1.2x (Q5_1) its bytes, 52-69
// times less than the fallback's; on AVX2 1.1-1.35x Q4_1's int16 time. From memory (200 copies of the 4096 x
// 1024 matrix cycled, 0.5-0.6 GB, which no cache holds), one row took 0.41 ms in Q5_0 (7.0 GB/s of blocks),
// 0.44 in Q5_1 (7.2 GB/s) and 0.33 in Q4_1 (7.9 GB/s) on AVX-512; on AVX2 (int16) 0.37, 0.43 and 0.33 ms.
// From 32 rows model/quant_blocks.py takes its many-row path (tiles decoded by dequantize() and torch.mm) for
// these types as for the others: 1536 x 576 at 32 / 64 rows, 0.95 / 2.0 ms in the kernel, 0.64 / 1.05 that
// way, as Q4_1's (at 16 rows the kernel is faster: 0.47 against 0.49).
//
// Rules (those of quant_matmul.cpp):
// - each output element is one thread's sum over its blocks in order, in fixed lanes, so the result has the
//   same bits on any thread count, and a row's result does not depend on the other rows of x (its tile);
//   the instruction sets differ from each other by float rounding only (all multiply x by the exact weights);
// - weight rows are split over the threads of torch's OpenMP runtime in chunks of kChunkRows, from
//   kMinParallelRows rows; dequantize() splits rows from kMinParallelWeights weights;
// - k is a multiple of 32 (quant_matmul.cpp refuses another before calling in here);
// - one build runs anywhere: the caller passes the path its cpuid check (and FLOTILLA_KERNEL_ISA) picked;
//   AVX-512 (F, BW, VL), AVX2 (with FMA, F16C) or plain C++, never -march=native.
#include <c10/util/Half.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "q5_blocks.h"

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

namespace flotilla::q5 {
enum class Path : int { plain = 0, avx2 = 1, avx512 = 2 };
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path);
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path);
}  // namespace flotilla::q5

namespace {

using flotilla::q5::Path;
namespace q5 = flotilla::q5;

constexpr int64_t kBlockWeights = 32;
constexpr int kTileRows = 4;               // x rows that share one decoding of each block
constexpr int64_t kChunkRows = 8;          // weight rows per unit of a thread's work
constexpr int64_t kMinParallelRows = 64;
constexpr int64_t kMinParallelWeights = 1 << 15;  // dequantize(): below, one thread (a fork costs a few us)
constexpr int64_t kDequantizeChunkRows = 4;
constexpr int64_t kPrefetchBytes = 2048;   // as quant_matmul.cpp's: the weight bytes read that far ahead
constexpr int64_t kScaleBlocks = 64;       // blocks whose scales are converted at a time; even (two per step)
constexpr int kLanes = 8;                  // the plain path's accumulators per row

enum class Type : int64_t { Q5_0 = 6, Q5_1 = 7 };

template <Type Q> struct Layout;  // q5_blocks.h's
template <> struct Layout<Type::Q5_0> : q5::Q5_0Layout {};
template <> struct Layout<Type::Q5_1> : q5::Q5_1Layout {};

INLINE uint16_t half_bits(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return bits;
}

// the weight bytes kPrefetchBytes ahead (a prefetch never faults)
INLINE void prefetch_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// ---- plain C++: a block decoded to 32 floats, then multiplied in 8 lanes per row

INLINE float half_plain(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(half_bits(p)); }

template <Type Q> INLINE void block_plain(const uint8_t* block, float* w) {
  int8_t q[kBlockWeights];
  q5::integers_plain<Layout<Q>>(block, q);
  const float d = half_plain(block), m = Layout<Q>::has_min ? half_plain(block + 2) : 0.f;
  for (int64_t j = 0; j < kBlockWeights; ++j)
    w[j] = Layout<Q>::has_min ? d * static_cast<float>(q[j]) + m : d * static_cast<float>(q[j]);
}

// x's rows, float32 [m, k]; blocks: blocks of 32 per row
struct Rows {
  const float* x;
  int64_t k, blocks;

  template <int R> void rows(int64_t r0, const float* (&out)[R]) const {
    for (int r = 0; r < R; ++r) out[r] = x + (r0 + r) * k;
  }
};

template <Type Q, int R>
void tile_plain(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  float acc[R][kLanes] = {};
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t b = 0; b < a.blocks; ++b) {
    float w[kBlockWeights];
    block_plain<Q>(w_row + b * Layout<Q>::bytes, w);
    for (int r = 0; r < R; ++r) {
      const float* x = rows[r] + b * kBlockWeights;
      for (int64_t j = 0; j < kBlockWeights; j += kLanes)
        for (int lane = 0; lane < kLanes; ++lane) acc[r][lane] += w[j + lane] * x[j + lane];
    }
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) +
                      ((acc[r][4] + acc[r][5]) + (acc[r][6] + acc[r][7]));
}

template <Type Q> void dequantize_plain(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t b = 0; b < rows * blocks; ++b) block_plain<Q>(w + b * Layout<Q>::bytes, out + b * kBlockWeights);
}

// ---- AVX2: a block as 4 vectors of 8 weights (0-7, 8-15, 16-23, 24-31), into 2 accumulators per row

TARGET_AVX2 INLINE float half_f16c(const uint8_t* p) { return _cvtsh_ss(half_bits(p)); }

// scales[2 i] = d and scales[2 i + 1] = m (Q5_1; 0 for Q5_0) of the count blocks from `block`
template <Type Q> TARGET_AVX2 INLINE void scales_avx2(const uint8_t* block, int64_t count, float* scales) {
  constexpr int bytes = static_cast<int>(Layout<Q>::bytes);
  const __m256i offsets = _mm256_setr_epi32(0, bytes, 2 * bytes, 3 * bytes, 4 * bytes, 5 * bytes, 6 * bytes, 7 * bytes);
  const __m256i keep = _mm256_set1_epi32(Layout<Q>::has_min ? -1 : 0xFFFF);
  for (int64_t i = 0; i < count; i += 8) {
    const int* base = reinterpret_cast<const int*>(block + i * bytes);
    const __m256i some = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count - i)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i halves = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, offsets, some, 1);
    halves = _mm256_and_si256(halves, keep);
    _mm256_store_ps(scales + 2 * i, _mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
    _mm256_store_ps(scales + 2 * i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)));
  }
}

// d * (q - 16) (Q5_0) or d * q + m by FMA (Q5_1): gguf's bits. The integers go through a stack buffer, read
// back by 8-byte loads that sign-extend as they load: left to itself the compiler keeps them in registers
// and extracts each 8 by shuffles, on the port that the sign extensions take too
template <Type Q> TARGET_AVX2 INLINE void weights_avx2(const uint8_t* block, const float* scale, __m256 (&w)[4]) {
  alignas(32) int8_t q[kBlockWeights];
  _mm256_store_si256(reinterpret_cast<__m256i*>(q), q5::integers_avx2<Layout<Q>>(block));
  asm volatile("" : "+m"(q));  // the store happens, and the loads below read memory
  const __m256 d = _mm256_set1_ps(scale[0]);
  for (int i = 0; i < 4; ++i) {
    const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
    w[i] = Layout<Q>::has_min ? _mm256_fmadd_ps(v, d, _mm256_set1_ps(scale[1])) : _mm256_mul_ps(v, d);
  }
}

TARGET_AVX2 INLINE float sum_lanes_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <Type Q, int R>
TARGET_AVX2 void tile_avx2(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  __m256 acc[R][2];
  for (auto& row : acc) row[0] = row[1] = _mm256_setzero_ps();
  alignas(32) float scales[2 * kScaleBlocks];
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t first = 0; first < a.blocks; first += kScaleBlocks) {
    const int64_t end = std::min(a.blocks, first + kScaleBlocks);
    scales_avx2<Q>(w_row + first * Layout<Q>::bytes, end - first, scales);
    for (int64_t b = first; b < end; ++b) {
      const uint8_t* block = w_row + b * Layout<Q>::bytes;
      prefetch_ahead(block);
      __m256 w[4];
      weights_avx2<Q>(block, scales + 2 * (b - first), w);
      for (int r = 0; r < R; ++r) {
        const float* x = rows[r] + b * kBlockWeights;
        for (int i = 0; i < 4; ++i) acc[r][i & 1] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x + 8 * i), acc[r][i & 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
}

template <Type Q> TARGET_AVX2 void dequantize_avx2(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t b = 0; b < rows * blocks; ++b, out += kBlockWeights) {
    const uint8_t* block = w + b * Layout<Q>::bytes;
    const float scale[2] = {half_f16c(block), Layout<Q>::has_min ? half_f16c(block + 2) : 0.f};
    __m256 v[4];
    weights_avx2<Q>(block, scale, v);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, v[i]);
  }
}

// ---- AVX-512: two blocks per step (kTwo false: the odd last block), each 2 vectors of 16 weights (0-15,
// 16-31), into 4 accumulators per row (the first block's halves, the second's)

template <Type Q> TARGET_AVX512 INLINE void scales_avx512(const uint8_t* block, int64_t count, float* scales) {
  constexpr int bytes = static_cast<int>(Layout<Q>::bytes);
  const __m256i offsets = _mm256_setr_epi32(0, bytes, 2 * bytes, 3 * bytes, 4 * bytes, 5 * bytes, 6 * bytes, 7 * bytes);
  const __m256i keep = _mm256_set1_epi32(Layout<Q>::has_min ? -1 : 0xFFFF);
  for (int64_t i = 0; i < count; i += 8) {
    const int* base = reinterpret_cast<const int*>(block + i * bytes);
    const __mmask8 some = static_cast<__mmask8>(count - i >= 8 ? 0xFF : (1u << (count - i)) - 1);
    const __m256i halves = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), some, offsets, base, 1);
    _mm512_store_ps(scales + 2 * i, _mm512_cvtph_ps(_mm256_and_si256(halves, keep)));
  }
}

// the block's 32 possible weights, (v - 16) * d or v * d + m (by FMA) for v = 0..15 (low) and 16..31 (high):
// gguf's bits; vpermt2ps picks each weight by the low 5 bits of its index (it ignores the others): the nibble,
// and in bit 4 the weight's bit of qh. qh broadcast to every lane and rotated right by i - 4 in lane i holds
// weight i's bit in bit 4 and weight 16 + i's in bit 20
template <Type Q>
TARGET_AVX512 INLINE void weights_avx512(const uint8_t* block, const float* scale, __m512& w_lo, __m512& w_hi) {
  using L = Layout<Q>;
  const float o = static_cast<float>(L::offset);
  const __m512 low = _mm512_setr_ps(0 - o, 1 - o, 2 - o, 3 - o, 4 - o, 5 - o, 6 - o, 7 - o, 8 - o, 9 - o, 10 - o,
                                    11 - o, 12 - o, 13 - o, 14 - o, 15 - o);
  const __m512 high = _mm512_add_ps(low, _mm512_set1_ps(16.f));  // exact: small integers
  const __m512 d = _mm512_set1_ps(scale[0]);
  const __m512 table_lo = L::has_min ? _mm512_fmadd_ps(low, d, _mm512_set1_ps(scale[1])) : _mm512_mul_ps(low, d);
  const __m512 table_hi = L::has_min ? _mm512_fmadd_ps(high, d, _mm512_set1_ps(scale[1])) : _mm512_mul_ps(high, d);
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + L::qs_at)));
  const __m512i qh = _mm512_set1_epi32(static_cast<int>(q5::fifth_bits(block, L::qh_at)));
  const __m512i fifth = _mm512_rorv_epi32(qh, _mm512_setr_epi32(28, 29, 30, 31, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  constexpr int kSelect = 0xE4;  // vpternlogd: bits of the first operand where the third's are set, else the second's
  const __m512i nibble = _mm512_set1_epi32(15);
  const __m512i lo = _mm512_ternarylogic_epi32(bytes, fifth, nibble, kSelect);
  const __m512i hi =
      _mm512_ternarylogic_epi32(_mm512_srli_epi32(bytes, 4), _mm512_srli_epi32(fifth, 16), nibble, kSelect);
  w_lo = _mm512_permutex2var_ps(table_lo, lo, table_hi);
  w_hi = _mm512_permutex2var_ps(table_lo, hi, table_hi);
}

template <Type Q, int R, bool kTwo>
TARGET_AVX512 INLINE void step_avx512(const uint8_t* block, const float* scale, const float* (&rows)[R], int64_t b,
                                      __m512 (&acc)[R][4]) {
  constexpr int count = kTwo ? 2 : 1;  // blocks
  __m512 w[4];
  for (int h = 0; h < count; ++h)
    weights_avx512<Q>(block + h * Layout<Q>::bytes, scale + 2 * h, w[2 * h], w[2 * h + 1]);
  for (int r = 0; r < R; ++r) {
    const float* x = rows[r] + b * kBlockWeights;
    for (int i = 0; i < 2 * count; ++i) acc[r][i] = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(x + 16 * i), acc[r][i]);
  }
}

template <Type Q, int R>
TARGET_AVX512 void tile_avx512(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  using L = Layout<Q>;
  __m512 acc[R][4];
  for (auto& row : acc)
    for (__m512& v : row) v = _mm512_setzero_ps();
  alignas(64) float scales[2 * kScaleBlocks];
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t first = 0; first < a.blocks; first += kScaleBlocks) {
    const int64_t end = std::min(a.blocks, first + kScaleBlocks);
    scales_avx512<Q>(w_row + first * L::bytes, end - first, scales);
    int64_t b = first;
    for (; b + 2 <= end; b += 2) {
      prefetch_ahead(w_row + b * L::bytes);
      step_avx512<Q, R, true>(w_row + b * L::bytes, scales + 2 * (b - first), rows, b, acc);
    }
    if (b < end) step_avx512<Q, R, false>(w_row + b * L::bytes, scales + 2 * (b - first), rows, b, acc);
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                                         _mm512_add_ps(acc[r][2], acc[r][3])));
}

template <Type Q> TARGET_AVX512 void dequantize_avx512(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t b = 0; b < rows * blocks; ++b, out += kBlockWeights) {
    const uint8_t* block = w + b * Layout<Q>::bytes;
    const float scale[2] = {half_f16c(block), Layout<Q>::has_min ? half_f16c(block + 2) : 0.f};
    __m512 lo, hi;
    weights_avx512<Q>(block, scale, lo, hi);
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  }
}

// ---- picking the path

// qtype: Q5_0 or Q5_1 (quant_matmul.cpp calls in with no other)
int64_t bytes_of(int64_t qtype) {
  return static_cast<Type>(qtype) == Type::Q5_0 ? Layout<Type::Q5_0>::bytes : Layout<Type::Q5_1>::bytes;
}

using Tile = void (*)(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride);
using Tiles = std::array<Tile, kTileRows>;  // [rows - 1]
using DequantizeRows = void (*)(const uint8_t* w, int64_t rows, int64_t blocks, float* out);

static_assert(kTileRows == 4, "tiles_for lists one tile per row count");
template <Type Q> Tiles tiles_for(Path path) {
  switch (path) {
    case Path::avx512: return {tile_avx512<Q, 1>, tile_avx512<Q, 2>, tile_avx512<Q, 3>, tile_avx512<Q, 4>};
    case Path::avx2: return {tile_avx2<Q, 1>, tile_avx2<Q, 2>, tile_avx2<Q, 3>, tile_avx2<Q, 4>};
    case Path::plain: break;
  }
  return {tile_plain<Q, 1>, tile_plain<Q, 2>, tile_plain<Q, 3>, tile_plain<Q, 4>};
}

template <Type Q> DequantizeRows dequantize_for(Path path) {
  switch (path) {
    case Path::avx512: return dequantize_avx512<Q>;
    case Path::avx2: return dequantize_avx2<Q>;
    case Path::plain: break;
  }
  return dequantize_plain<Q>;
}

}  // namespace

namespace flotilla::q5 {

// x [m, k] float32 @ dequantize(w [n, k / 32 * bytes]).T into y [m, n]; qtype Q5_0 or Q5_1, k % 32 == 0
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path) {
  const Tiles tiles =
      static_cast<Type>(qtype) == Type::Q5_0 ? tiles_for<Type::Q5_0>(path) : tiles_for<Type::Q5_1>(path);
  const Rows a{x, k, k / kBlockWeights};
  const int64_t row_bytes = a.blocks * bytes_of(qtype);
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  #pragma omp parallel for schedule(static) if (n >= kMinParallelRows)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kChunkRows, end = std::min(n, first + kChunkRows);
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const Tile tile = tiles[std::min<int64_t>(kTileRows, m - r0) - 1];
      for (int64_t i = first; i < end; ++i) tile(w + i * row_bytes, a, r0, y + r0 * n + i, n);
    }
  }
}

// rows of w [rows, k / 32 * bytes] into out [rows, k] float32, gguf.quants.dequantize's bits
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path) {
  const DequantizeRows run_rows = static_cast<Type>(qtype) == Type::Q5_0 ? dequantize_for<Type::Q5_0>(path)
                                                                         : dequantize_for<Type::Q5_1>(path);
  const int64_t blocks = k / kBlockWeights, row_bytes = blocks * bytes_of(qtype);
  const int64_t chunks = (rows + kDequantizeChunkRows - 1) / kDequantizeChunkRows;
  #pragma omp parallel for schedule(static) if (rows * k >= kMinParallelWeights)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kDequantizeChunkRows, count = std::min(kDequantizeChunkRows, rows - first);
    run_rows(w + first * row_bytes, count, blocks, out + first * k);
  }
}

}  // namespace flotilla::q5
