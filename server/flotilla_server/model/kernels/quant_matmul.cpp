// torch.ops.flotilla.quant_matmul(x [m, k] float32, blocks [n, k/32 * block_bytes] uint8, qtype) -> [m, n]:
// x @ dequantize(blocks).T for a weight kept in llama.cpp's GGUF blocks, qtype its GGML type id (Q4_0 = 2,
// Q4_1 = 3, Q8_0 = 8; Q5_0 = 6 and Q5_1 = 7, whose float-activation kernels are q5_matmul.cpp's; and the
// k-quants Q4_K = 12, Q5_K = 13, Q6_K = 14, whose blocks hold 256 weights, so k/256 of them a row, k a multiple
// of 256: their kernels are kquant_matmul.cpp's; this file's ops call both), without a float copy of the weight
// (model/quant_blocks.py calls it; scripts/build_kernels.py builds it).
// torch.ops.flotilla.kernel_isa(wanted) -> str: the instruction set the products run on, one of scalar, avx2,
// avx512, avx512_vnni; "" reads it, a name sets it (for comparisons), or the CPU's best where it lacks that
// one. torch.ops.flotilla.kernel_activations(wanted) -> str: the activations' form, auto (the default: int16
// where the products run on AVX2, float elsewhere), float, int8 or int16; "" reads it, a name sets it; the
// answer is "setting:form on the instruction set in use" (the rounded forms apply to Q8_0, Q4_0 and Q4_1, and
// int16 to Q5_0 and Q5_1 too, which take the float path in int8 mode; the k-quants have the float path only
// and take it in every mode).
// torch.ops.flotilla.dequantize_blocks(blocks [rows, k/32 * block_bytes] uint8, qtype, out [rows, k] float32):
// writes the rows' weights into out, with gguf.quants.dequantize's bits (model/quant_blocks.py's many-row
// path decodes a tile of weights with it, then multiplies the tile by torch.mm).
// torch.ops.flotilla.int8_matmul(x [m, k] float32, w [n, k] int8, scales [n] float32) -> [m, n]:
// x @ (w * scales[:, None]).T for `--quantization int8` (per-channel symmetric int8 weights; model/int8_weights.py
// calls it), k a multiple of 16; torch.ops.flotilla.dequantize_int8(w, scales, out [n, k] float32): w * scales
// into out, with torch's bits (its many-row path, as dequantize_blocks). Both follow kernel_isa, and
// int8_matmul has the same rules as the float path below (the section "int8 weights" says how).
//
// Why dequantize_blocks: from a few dozen activation rows the products are bound by arithmetic, not by
// reading the weights, and MKL's float32 sgemm (register blocking of x and w, well beyond this kernel's tiles
// of 4 rows) beats decoding in registers: at 64 rows on one core of this project's 2-core Xeon VM
// (family 6 model 167), the 49152 x 576 Q8_0 head takes 64 ms here against 35 ms decoded per 1.5 MiB tile into L2 and
// multiplied by torch.mm; SmolLM2's 1536 x 576 Q4_1 1.8 ms against 1.1. Decoding is cheap beside that
// (a 1.5 MiB tile in about 0.04 ms: AVX-512 or AVX2 conversions, stores into L2).
//
// Why: a GGUF model's weights stay in their block bytes (per weight 1.06 bytes for Q8_0, 0.56 for Q4_0,
// 0.63 for Q4_1, against 4 for float32), and a decode step reads every weight once, so its speed is the rate
// at which those bytes are read; decoding them to float first would read and write 4 bytes per weight.
//
// How, float activations (the default): x is used as it is; each block of 32 weights is decoded to float32
// in registers, to exactly the weights gguf.quants.dequantize gives (d * q, d * (nibble - 8), d * nibble + m),
// and multiplied with x by FMA. So the result is x @ dequantize(blocks).T up to float rounding only.
// How, int8 activations (FLOTILLA_KERNEL_ACTIVATIONS=int8, as llama.cpp's CPU backend does): each row of x
// is rounded once per call to int8 per block of 32, with a scale d_x = amax / 127 (llama.cpp's Q8_0; for
// Q4_1 also d_x * sum(q), as its Q8_1 keeps); then each pair of an activation block and a weight block is an
// exact integer dot product, scaled in float:
//   Q8_0: d_w d_x sum w q,   Q4_0: d_w d_x sum (nibble - 8) q,   Q4_1: d_w d_x sum nibble q + m_w d_x sum q.
// So the result is x' @ dequantize(blocks).T for x' the rounded x, whose elements are within amax / 254 of
// x's (amax: of their block), plus float rounding. The integer products: vpdpbusd (VNNI) on the weights'
// unsigned form started from a bias per activation block; vpmaddubsw (AVX2, AVX-512 without VNNI) on |w|
// and q with w's sign; plain C++ on w.
// Why float is the default (on AVX-512; AVX2 takes int16, below): SmolLM2-135M's Q4_1 file, teacher-forced over 1,024 tokens of text against the
// same weights dequantized to float32, agrees on the top-1 token at only 94-95 % of positions with int8
// activations (mean KL 0.009 nats; over 2,048 tokens 95.3 %, 0.0076), where the project asks for 98 % and
// 0.01; with float activations it is 100 % (KL 0 up to float rounding). The int8 form takes fewer vector
// instructions per weight, so it is faster where the float path is bound by instructions rather than by
// reading memory: at batch 1 on one core of the same Xeon VM (AVX-512 with VNNI), the 49152 x 576 Q8_0
// head 1.1 ms against 1.75, SmolLM2's Q4_1 layers 1.05-1.2x; at 4 and 16 rows 1.0-1.6x.
//
// Rules:
// - each output element is one thread's sum over its blocks in order, in fixed lanes, so the result has the
//   same bits on any thread count, and a row's result does not depend on the other rows of x (its tile);
//   the instruction sets differ from each other by float rounding only (int8: the rounded activations and
//   the integer dot products are the same on all; float: all multiply x by the exact weights);
// - weight rows are split over the threads of torch's OpenMP runtime, whose count torch.set_num_threads sets;
// - activation rows go in tiles of up to kTileRows, so that each weight block is read (and decoded) once per
//   tile;
// - int8, int16: x must be finite (a NaN's rounding is undefined); float: x is taken as it is; weights are taken as
//   they are (any fp16 scales);
// - the path is picked at load from the CPU's features, so one build runs anywhere: AVX-512 with VNNI,
//   AVX-512 (F, BW, VL), AVX2 (with FMA, F16C) or plain C++; FLOTILLA_KERNEL_ISA=avx512|avx2|scalar (read at
//   load) or kernel_isa() picks a lower one, never one the CPU lacks. The float path has no VNNI variant:
//   avx512_vnni and avx512 both run its AVX-512 code;
// - dequantize_blocks computes each weight in gguf's own operations (d * q, d * (nibble - 8), d * nibble + m),
//   so its bits are gguf's on every instruction set and thread count (rows split over the threads from 32 Ki
//   weights); it follows kernel_isa like the products (the k-quants' and Q5_0's and Q5_1's have the same
//   rules: kquant_matmul.cpp, q5_matmul.cpp);
// - FLOTILLA_KERNEL_ACTIVATIONS=auto|float|int8|int16 is read at load (another value: auto, with a line on stderr);
//   kernel_activations() changes it for the whole process (tests, benchmarks).
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "q5_blocks.h"

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

// the k-quants, Q4_K, Q5_K and Q6_K (kquant_matmul.cpp): super-blocks of 256 weights, float activations only
namespace flotilla::kquants {
enum class Path : int { plain = 0, avx2 = 1, avx512 = 2 };
int64_t block_bytes(int64_t qtype);  // 0 for a type that is not a k-quant
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path);
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path);
}  // namespace flotilla::kquants

// Q5_0 and Q5_1 (q5_matmul.cpp): blocks of 32 weights, float activations (int16: here, below)
namespace flotilla::q5 {
enum class Path : int { plain = 0, avx2 = 1, avx512 = 2 };
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path);
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path);
}  // namespace flotilla::q5

namespace {

namespace kquants = flotilla::kquants;
namespace q5 = flotilla::q5;

constexpr int64_t kBlockWeights = 32;
constexpr int64_t kSuperWeights = 256;  // the k-quants' blocks
constexpr int64_t kLanes = 8;         // int32 or float lanes of 32 bytes: 8 per block on the SIMD paths
constexpr int kTileRows = 4;          // activation rows that share one read of each weight block
constexpr int64_t kChunkRows = 8;     // weight rows per unit of a thread's work
constexpr int64_t kMinParallelRows = 64;
constexpr int64_t kPrefetchBytes = 2048;

enum class QType : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8 };

constexpr bool five_bit(QType q) { return q == QType::Q5_0 || q == QType::Q5_1; }

// offset: the block's integers w (Q8_0's signed bytes, Q4_0's nibble - 8, Q4_1's nibble) plus offset are
// 0..255, the unsigned form that vpdpbusd takes (Q8_0: the byte XOR 0x80; Q4_0, Q4_1: the nibble)
template <QType Q> struct Layout;
template <> struct Layout<QType::Q8_0> {
  static constexpr int64_t bytes = 34, quants_at = 2;
  static constexpr int32_t offset = 128;
  static constexpr bool has_min = false;
};
template <> struct Layout<QType::Q4_0> {
  static constexpr int64_t bytes = 18, quants_at = 2;
  static constexpr int32_t offset = 8;
  static constexpr bool has_min = false;
};
template <> struct Layout<QType::Q4_1> {
  static constexpr int64_t bytes = 20, quants_at = 4;
  static constexpr int32_t offset = 0;
  static constexpr bool has_min = true;
};
// Q5_0, Q5_1 (q5_blocks.h): their int16 path only (Activations16, tile16_avx2, tile_plain); offset: 16 or 0,
// subtracted from q (never used in the unsigned form: they have no int8 path)
template <> struct Layout<QType::Q5_0> : q5::Q5_0Layout {
  static constexpr int64_t quants_at = qs_at;
};
template <> struct Layout<QType::Q5_1> : q5::Q5_1Layout {
  static constexpr int64_t quants_at = qs_at;
};

// x rounded per block of 32, for rows of it:
//   q [m, k] int8 in -127..127;  scale8 [m, k/32, 8]: d_x, repeated in 8 lanes;
//   sum8 [m, k/32, 8] (Q4_1): d_x * sum(q) / 8, so that its 8 lanes add up to the block's sum;
//   bias [m, k/4] (VNNI, Q8_0 and Q4_0): -offset * the sum of each 4 q, so that vpdpbusd started from it
//   on the unsigned form gives sum w q.
struct Activations {
  int8_t* q;
  float* scale8;
  float* sum8;
  int32_t* bias;
  int64_t k, blocks;

  int8_t* q_at(int64_t row, int64_t block) const { return q + row * k + block * kBlockWeights; }
  float* scale_at(int64_t row, int64_t block) const { return scale8 + (row * blocks + block) * kLanes; }
  float* sum_at(int64_t row, int64_t block) const { return sum8 + (row * blocks + block) * kLanes; }
  int32_t* bias_at(int64_t row, int64_t block) const { return bias + (row * blocks + block) * kLanes; }
};

// ---- rounding the activations (the same bits on every path: max, one division, nearest-even rounding)

INLINE void round_block(const float* x, const Activations& a, int64_t row, int64_t b, int32_t offset) {
  float amax = 0.f;
  for (int64_t j = 0; j < kBlockWeights; ++j) amax = std::max(amax, std::fabs(x[j]));
  // a block whose scale would be subnormal (amax < 1.5e-36) rounds to 0: 1 / d would overflow
  const float d = amax / 127.f >= FLT_MIN ? amax / 127.f : 0.f, inverse = d > 0.f ? 1.f / d : 0.f;
  int8_t* q = a.q_at(row, b);
  int32_t sum = 0;
  for (int64_t j = 0; j < kBlockWeights; ++j) {
    const int32_t v = static_cast<int32_t>(std::nearbyint(x[j] * inverse));
    q[j] = static_cast<int8_t>(v);
    sum += v;
  }
  std::fill_n(a.scale_at(row, b), kLanes, d);
  if (a.sum8 != nullptr) std::fill_n(a.sum_at(row, b), kLanes, d * static_cast<float>(sum) / kLanes);
  if (a.bias != nullptr)
    for (int64_t lane = 0; lane < kLanes; ++lane)
      a.bias_at(row, b)[lane] = -offset * (q[4 * lane] + q[4 * lane + 1] + q[4 * lane + 2] + q[4 * lane + 3]);
}

INLINE void round_row(const float* x, const Activations& a, int64_t row, int32_t offset) {
  for (int64_t b = 0; b < a.blocks; ++b) round_block(x + b * kBlockWeights, a, row, b, offset);
}

// the same source compiled for AVX2, which the compiler vectorises
TARGET_AVX2 void round_row_avx2(const float* x, const Activations& a, int64_t row, int32_t offset) {
  round_row(x, a, row, offset);
}

void round_row_plain(const float* x, const Activations& a, int64_t row, int32_t offset) {
  round_row(x, a, row, offset);
}

// ---- the plain path: one block per step, its integers decoded to w

template <QType Q> INLINE void decode_plain(const uint8_t* block, int8_t w[kBlockWeights]) {
  const uint8_t* quants = block + Layout<Q>::quants_at;
  if constexpr (Q == QType::Q8_0) {
    std::memcpy(w, quants, kBlockWeights);
  } else if constexpr (five_bit(Q)) {
    q5::integers_plain<Layout<Q>>(block, w);
  } else {
    for (int64_t j = 0; j < kBlockWeights / 2; ++j) {
      w[j] = static_cast<int8_t>((quants[j] & 15) - Layout<Q>::offset);
      w[j + kBlockWeights / 2] = static_cast<int8_t>((quants[j] >> 4) - Layout<Q>::offset);
    }
  }
}

INLINE uint16_t half_bits(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return bits;
}

INLINE float half_plain(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(half_bits(p)); }

// a rounded block's scale d_x and d_x * sum(q), whichever form the rounding kept them in
INLINE float block_scale(const Activations& a, int64_t row, int64_t b) { return a.scale_at(row, b)[0]; }
INLINE float block_sum(const Activations& a, int64_t row, int64_t b) { return a.sum_at(row, b)[0] * kLanes; }

// the plain path of both rounded forms (Rows: Activations, int8; Activations16, int16, declared below)
template <QType Q, int R, typename Rows>
void tile_plain(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  float acc[R] = {};
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* block = w_row + b * Layout<Q>::bytes;
    int8_t w[kBlockWeights];
    decode_plain<Q>(block, w);
    const float d_w = half_plain(block), m_w = Layout<Q>::has_min ? half_plain(block + 2) : 0.f;
    for (int r = 0; r < R; ++r) {
      const auto* q = a.q_at(r0 + r, b);
      int32_t dot = 0;
      for (int64_t j = 0; j < kBlockWeights; ++j) dot += w[j] * q[j];
      acc[r] += d_w * block_scale(a, r0 + r, b) * static_cast<float>(dot);
      if constexpr (Layout<Q>::has_min) acc[r] += m_w * block_sum(a, r0 + r, b);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = acc[r];
}

// the weight bytes kPrefetchBytes ahead (the next rows' once near a row's end; a prefetch never faults): with
// it one row of the 49152 x 576 Q8_0 head read 10.1 GB/s from memory on one thread (8.8 without; a plain
// sum of floats 10.6), 28.6 from L3 (25.3)
INLINE void prefetch_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// ---- AVX2: one block (32 bytes of integers) per step; w_j q_j as |w_j| times q_j with w_j's sign, since
// vpmaddubsw takes unsigned times signed bytes and saturates past 2^15 (so not the unsigned form of Q8_0)

TARGET_AVX2 INLINE float half_f16c(const uint8_t* p) { return _cvtsh_ss(half_bits(p)); }

// 16 bytes of nibbles -> the block's 32 integers 0..15: the low nibbles, then the high ones
TARGET_AVX2 INLINE __m256i nibbles_avx2(const uint8_t* quants) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

template <QType Q> TARGET_AVX2 INLINE __m256i weights_avx2(const uint8_t* block) {
  const uint8_t* quants = block + Layout<Q>::quants_at;
  if constexpr (Q == QType::Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants));
  return _mm256_sub_epi8(nibbles_avx2(quants), _mm256_set1_epi8(Layout<Q>::offset));
}

TARGET_AVX2 INLINE float sum_lanes_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <QType Q, int R>
TARGET_AVX2 void tile_avx2(const uint8_t* w_row, const Activations& a, int64_t r0, float* y, int64_t y_stride) {
  using L = Layout<Q>;
  __m256 acc[R];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* block = w_row + b * L::bytes;
    prefetch_ahead(block);
    const __m256i w = weights_avx2<Q>(block);
    const __m256i magnitude = L::offset != 0 ? _mm256_sign_epi8(w, w) : w;
    const __m256 d_w = _mm256_set1_ps(half_f16c(block));
    const __m256 m_w = L::has_min ? _mm256_set1_ps(half_f16c(block + 2)) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q_at(r0 + r, b)));
      if constexpr (L::offset != 0) q = _mm256_sign_epi8(q, w);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, q), _mm256_set1_epi16(1));
      if constexpr (L::has_min) acc[r] = _mm256_fmadd_ps(m_w, _mm256_loadu_ps(a.sum_at(r0 + r, b)), acc[r]);
      const __m256 scale = _mm256_mul_ps(d_w, _mm256_loadu_ps(a.scale_at(r0 + r, b)));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_avx2(acc[r]);
}

// ---- int16 activations (Mode::int16, the default on AVX2): x rounded per block of 32 to int16, d_x = amax /
// 32767, and each activation block times a weight block an exact integer dot product by vpmaddwd (pairs of
// int16 products summed into int32: at most 2 * 128 * 32767 per lane and step, no overflow):
//   Q8_0: d_w d_x sum w q,   Q4_0: d_w d_x sum (nibble - 8) q,   Q4_1: d_w d_x sum nibble q + m_w d_x sum q,
//   and Q5_0, Q5_1 as Q4_0, Q4_1 with their 5-bit integers (q5_blocks.h; q - 16 for Q5_0).
// So the result is x' @ dequantize(blocks).T for x' within amax / 65534 of x per element (amax: of its block),
// plus float rounding: 256 times closer to x than int8's x'. Why: on AVX2 the float path decodes each weight
// to float (a conversion and an FMA) before its FMA with x, and is bound by those instructions, not by
// reading memory (SmolLM2's 3072 x 576 Q4_1 layer at 7.4 GB/s on one core of the Xeon VM, AVX2 forced, where
// a core reads 10); with int16 products it reads at 10 (docs/models.md, "Quantization").
//   q [m, k] int16;  scale [m, k/32]: d_x;  sum [m, k/32] (Q4_1): d_x * sum(q)
struct Activations16 {
  int16_t* q;
  float* scale;
  float* sum;
  int64_t k, blocks;

  const int16_t* q_at(int64_t row, int64_t block) const { return q + row * k + block * kBlockWeights; }
  float scale_at(int64_t row, int64_t block) const { return scale[row * blocks + block]; }
  float sum_at(int64_t row, int64_t block) const { return sum[row * blocks + block]; }
};

// the same bits on every path: max, one division, nearest-even rounding (as round_block); a block whose scale
// would be subnormal rounds to 0
INLINE void round_row16(const float* x, const Activations16& a, int64_t row) {
  for (int64_t b = 0; b < a.blocks; ++b) {
    const float* xb = x + b * kBlockWeights;
    float amax = 0.f;
    for (int64_t j = 0; j < kBlockWeights; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 32767.f >= FLT_MIN ? amax / 32767.f : 0.f, inverse = d > 0.f ? 1.f / d : 0.f;
    int16_t* q = a.q + row * a.k + b * kBlockWeights;
    int32_t sum = 0;
    for (int64_t j = 0; j < kBlockWeights; ++j) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[j] * inverse));
      q[j] = static_cast<int16_t>(v);
      sum += v;
    }
    a.scale[row * a.blocks + b] = d;
    if (a.sum != nullptr) a.sum[row * a.blocks + b] = d * static_cast<float>(sum);  // |sum| < 2^21: exact
  }
}

TARGET_AVX2 void round_row16_avx2(const float* x, const Activations16& a, int64_t row) { round_row16(x, a, row); }
void round_row16_plain(const float* x, const Activations16& a, int64_t row) { round_row16(x, a, row); }

INLINE float block_scale(const Activations16& a, int64_t row, int64_t b) { return a.scale_at(row, b); }
INLINE float block_sum(const Activations16& a, int64_t row, int64_t b) { return a.sum_at(row, b); }

// the block's 32 weights as int16, in two vectors: weights 0-15, then 16-31 (Q4: the low nibbles, the high)
template <QType Q> TARGET_AVX2 INLINE void weights16_avx2(const uint8_t* block, __m256i& first, __m256i& second) {
  const uint8_t* quants = block + Layout<Q>::quants_at;
  if constexpr (Q == QType::Q8_0) {
    first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants)));
    second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + 16)));
  } else if constexpr (five_bit(Q)) {
    const __m256i q = q5::integers_avx2<Layout<Q>>(block);  // q - offset, as bytes in weight order
    first = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    second = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m128i low = _mm_set1_epi8(0x0F);
    first = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low));
    second = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low));
    if constexpr (Layout<Q>::offset != 0) {
      const __m256i offset = _mm256_set1_epi16(static_cast<int16_t>(Layout<Q>::offset));
      first = _mm256_sub_epi16(first, offset);
      second = _mm256_sub_epi16(second, offset);
    }
  }
}

template <QType Q, int R>
TARGET_AVX2 void tile16_avx2(const uint8_t* w_row, const Activations16& a, int64_t r0, float* y, int64_t y_stride) {
  __m256 acc[R];
  float min_acc[R] = {};
  for (__m256& v : acc) v = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b) {
    const uint8_t* block = w_row + b * Layout<Q>::bytes;
    prefetch_ahead(block);
    __m256i first, second;
    weights16_avx2<Q>(block, first, second);
    const float d_w = half_f16c(block);
    for (int r = 0; r < R; ++r) {
      const int16_t* q = a.q_at(r0 + r, b);
      const __m256i dot = _mm256_add_epi32(
          _mm256_madd_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
          _mm256_madd_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16))));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d_w * a.scale_at(r0 + r, b)), acc[r]);
      if constexpr (Layout<Q>::has_min) min_acc[r] += half_f16c(block + 2) * a.sum_at(r0 + r, b);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_avx2(acc[r]) + min_acc[r];
}

// ---- AVX-512: two blocks per step, one in each 256-bit half (kTwo false: the odd last block, high half 0).
// With VNNI, vpdpbusd on the unsigned form started from the bias; without, AVX2's way, 512 bits wide.

// vpdpbusd: acc + per 4 bytes the sum of u_j * s_j (u unsigned, s signed), without saturation. Assembly
// rather than the intrinsic, so that both AVX-512 paths are one template compiled for AVX-512 F+BW+VL (GCC
// gives a template one target, not one per instantiation) and the path without VNNI holds no VNNI instruction.
TARGET_AVX512 INLINE __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

template <bool kTwo> TARGET_AVX512 INLINE __m512i load_two(const void* p) {
  if constexpr (kTwo) return _mm512_loadu_si512(p);
  return _mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}

template <bool kTwo> TARGET_AVX512 INLINE __m512 load_two(const float* p) {
  if constexpr (kTwo) return _mm512_loadu_ps(p);
  return _mm512_zextps256_ps512(_mm256_loadu_ps(p));
}

// the fp16 value `at` bytes into each of the two blocks, as floats in 8 lanes each: two 16-bit broadcasts,
// one conversion
template <QType Q, bool kTwo> TARGET_AVX512 INLINE __m512 halves_avx512(const uint8_t* block, int64_t at) {
  const __m256i first = _mm256_maskz_set1_epi16(0x00FF, half_bits(block + at));
  if constexpr (!kTwo) return _mm512_cvtph_ps(first);
  return _mm512_cvtph_ps(_mm256_mask_set1_epi16(first, 0xFF00, half_bits(block + Layout<Q>::bytes + at)));
}

// the two blocks' integers as stored: Q8_0's signed bytes, Q4_0's and Q4_1's nibbles (0..15)
template <QType Q, bool kTwo> TARGET_AVX512 INLINE __m512i stored_avx512(const uint8_t* block) {
  const uint8_t* quants = block + Layout<Q>::quants_at;
  const uint8_t* next = quants + Layout<Q>::bytes;
  if constexpr (Q == QType::Q8_0) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants));
    const __m256i high = kTwo ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(next)) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  } else {
    // 128-bit lanes: the first block's 16 bytes, again, the second block's, again; then the low nibbles of
    // lanes 0 and 2, the high nibbles of lanes 1 and 3
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m128i second = kTwo ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(next)) : _mm_setzero_si128();
    const __m512i packed = _mm512_castsi256_si512(_mm256_set_m128i(second, first));
    const __m512i doubled = _mm512_shuffle_i64x2(packed, packed, 0x50);
    return _mm512_and_si512(_mm512_mask_srli_epi16(doubled, 0xFF00FF00, doubled, 4), _mm512_set1_epi8(0x0F));
  }
}

template <QType Q, bool kTwo>
TARGET_AVX512 INLINE __m512 accumulate_avx512(__m512 acc, __m512i dot, __m512 d_w, __m512 m_w, const Activations& a,
                                              int64_t row, int64_t b) {
  if constexpr (Layout<Q>::has_min) acc = _mm512_fmadd_ps(m_w, load_two<kTwo>(a.sum_at(row, b)), acc);
  const __m512 scale = _mm512_mul_ps(d_w, load_two<kTwo>(a.scale_at(row, b)));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
}

template <QType Q, int R, bool kVnni, bool kTwo>
TARGET_AVX512 INLINE void step_avx512(const uint8_t* block, const Activations& a, int64_t r0, int64_t b,
                                      __m512 (&acc)[R]) {
  using L = Layout<Q>;
  const __m512i stored = stored_avx512<Q, kTwo>(block);
  const __m512 d_w = halves_avx512<Q, kTwo>(block, 0);
  const __m512 m_w = L::has_min ? halves_avx512<Q, kTwo>(block, 2) : _mm512_setzero_ps();
  if constexpr (kVnni) {
    const __m512i u = Q == QType::Q8_0 ? _mm512_xor_si512(stored, _mm512_set1_epi8(-128)) : stored;
    for (int r = 0; r < R; ++r) {
      const __m512i start = L::offset != 0 ? load_two<kTwo>(a.bias_at(r0 + r, b)) : _mm512_setzero_si512();
      const __m512i dot = dpbusd(start, u, load_two<kTwo>(a.q_at(r0 + r, b)));
      acc[r] = accumulate_avx512<Q, kTwo>(acc[r], dot, d_w, m_w, a, r0 + r, b);
    }
  } else {
    const __m512i w = Q == QType::Q4_0 ? _mm512_sub_epi8(stored, _mm512_set1_epi8(L::offset)) : stored;
    const __m512i magnitude = L::offset != 0 ? _mm512_abs_epi8(w) : w;
    const __mmask64 negative = L::offset != 0 ? _mm512_movepi8_mask(w) : 0;
    for (int r = 0; r < R; ++r) {
      const __m512i q = load_two<kTwo>(a.q_at(r0 + r, b));
      const __m512i signed_q = L::offset != 0 ? _mm512_mask_sub_epi8(q, negative, _mm512_setzero_si512(), q) : q;
      const __m512i dot = _mm512_madd_epi16(_mm512_maddubs_epi16(magnitude, signed_q), _mm512_set1_epi16(1));
      acc[r] = accumulate_avx512<Q, kTwo>(acc[r], dot, d_w, m_w, a, r0 + r, b);
    }
  }
}

template <QType Q, int R, bool kVnni>
TARGET_AVX512 void tile_avx512(const uint8_t* w_row, const Activations& a, int64_t r0, float* y, int64_t y_stride) {
  __m512 acc[R];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= a.blocks; b += 2) {
    prefetch_ahead(w_row + b * Layout<Q>::bytes);
    step_avx512<Q, R, kVnni, true>(w_row + b * Layout<Q>::bytes, a, r0, b, acc);
  }
  if (b < a.blocks) step_avx512<Q, R, kVnni, false>(w_row + b * Layout<Q>::bytes, a, r0, b, acc);
  for (int r = 0; r < R; ++r) y[r * y_stride] = _mm512_reduce_add_ps(acc[r]);
}

// ---- the float path: x as it is, each weight block decoded to float32 in registers and multiplied by FMA.
// The decoded weights are gguf's exactly: d * q (Q8_0), d * (nibble - 8) (Q4_0) and d * nibble are exact
// in float32 (an fp16 times an integer of at most 8 bits), and Q4_1's d * nibble + m is rounded once, as gguf
// rounds it (its product being exact). The scale goes into the weights, once per block and not per row:
// at 4 rows a tile then takes 2 FMAs per 16 weights and row, where scaling each row's sum would take a
// product, an FMA and the scale's FMA (and Q4_1's min term besides); measured on Q4_0, that way was as fast
// at batch 1 and 5-10 % slower at 4 and 16 rows. The exception is Q8_0 on AVX-512, whose integers take two
// conversions per 16 weights and whose per-row scaling measured faster at batch 1 (see float_step_avx512).
// Each row has its own accumulators (kFloatChains vectors on AVX-512, 2 on AVX2, 8 lanes in plain C++),
// summed in a fixed order at the end: a row's result does not depend on the tile it is in, nor on the
// thread that computes it.

// x's rows, float32 [m, k]
struct FloatRows {
  const float* x;
  int64_t k, blocks;

  // each of rows r0 .. r0 + R - 1, block b at [r][b * 32]
  template <int R> void rows(int64_t r0, const float* (&out)[R]) const {
    for (int r = 0; r < R; ++r) out[r] = x + (r0 + r) * k;
  }
};

template <QType Q> INLINE void dequantize_plain(const uint8_t* block, float w[kBlockWeights]) {
  int8_t q[kBlockWeights];
  decode_plain<Q>(block, q);  // Q8_0's bytes, Q4_0's nibble - 8, Q4_1's nibble
  const float d = half_plain(block), m = Layout<Q>::has_min ? half_plain(block + 2) : 0.f;
  for (int64_t j = 0; j < kBlockWeights; ++j) w[j] = Layout<Q>::has_min ? d * q[j] + m : d * q[j];
}

INLINE float sum_lanes_plain(const float (&v)[kLanes]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

template <QType Q, int R>
void float_tile_plain(const uint8_t* w_row, const FloatRows& a, int64_t r0, float* y, int64_t y_stride) {
  float acc[R][kLanes] = {};
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t b = 0; b < a.blocks; ++b) {
    float w[kBlockWeights];
    dequantize_plain<Q>(w_row + b * Layout<Q>::bytes, w);
    for (int r = 0; r < R; ++r) {
      const float* x = rows[r] + b * kBlockWeights;
      for (int64_t j = 0; j < kBlockWeights; j += kLanes)
        for (int64_t lane = 0; lane < kLanes; ++lane) acc[r][lane] += w[j + lane] * x[j + lane];
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_plain(acc[r]);
}

// The SIMD paths convert the fp16 scales of up to kScaleBlocks blocks at a time (one gather and one
// conversion per 8 blocks) into a buffer that the blocks' steps broadcast from memory: a load, where
// converting each block's scales on its own would take 3 or 4 shuffles and conversions per scale, as many
// as the block's products with a row.
constexpr int64_t kScaleBlocks = 64;  // even, so that only a row's last step can hold one block

// scales[2 i] = d and scales[2 i + 1] = m (Q4_1; 0 for the others) of the count blocks from `block`
template <QType Q> TARGET_AVX2 INLINE void scales_avx2(const uint8_t* block, int64_t count, float* scales) {
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

// AVX2: a block is 4 vectors of 8 weights (weights 0-7, 8-15, 16-23, 24-31), into 2 accumulators per row
template <QType Q> TARGET_AVX2 INLINE void dequantize_avx2(const uint8_t* block, const float* scale, __m256 (&w)[4]) {
  using L = Layout<Q>;
  const uint8_t* quants = block + L::quants_at;
  const __m256 d = _mm256_set1_ps(scale[0]);
  if constexpr (Q == QType::Q8_0) {
    for (int i = 0; i < 4; ++i) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + 8 * i));
      w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d);
    }
  } else {
    // Q4_0: d * nibble - 8 d, exact (it is d * (nibble - 8)); Q4_1: d * nibble + m
    const __m256 m = L::has_min ? _mm256_set1_ps(scale[1]) : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    const __m256i first = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants)));
    const __m256i second = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + 8)));
    const __m256i low = _mm256_set1_epi32(0x0F);
    const __m256i nibbles[4] = {_mm256_and_si256(first, low), _mm256_and_si256(second, low),
                                _mm256_srli_epi32(first, 4), _mm256_srli_epi32(second, 4)};
    for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nibbles[i]), d, m);
  }
}

template <QType Q, int R>
TARGET_AVX2 void float_tile_avx2(const uint8_t* w_row, const FloatRows& a, int64_t r0, float* y, int64_t y_stride) {
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
      dequantize_avx2<Q>(block, scales + 2 * (b - first), w);
      for (int r = 0; r < R; ++r) {
        const float* x = rows[r] + b * kBlockWeights;
        for (int i = 0; i < 4; ++i) acc[r][i & 1] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x + 8 * i), acc[r][i & 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
}

// AVX-512: two blocks per step (kTwo false: the odd last block), each 2 vectors of 16 weights (0-15, 16-31),
// into 4 accumulators per row (the first block's halves, the second's), so that a row's chains of dependent
// FMAs are 4 long per two blocks
constexpr int kFloatChains = 4;

template <QType Q> TARGET_AVX512 INLINE void scales_avx512(const uint8_t* block, int64_t count, float* scales) {
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

// Q4_0, Q4_1: the block's 16 weights, one per nibble value: d * value + m (Q4_1), d * (value - 8) (Q4_0); then
// each byte in a 32-bit lane, and vpermps (which reads the low 4 bits of each index) picks the low nibble's
// weight as it is, the high one's shifted down
template <QType Q>
TARGET_AVX512 INLINE void dequantize_avx512(const uint8_t* block, const float* scale, __m512& w_lo, __m512& w_hi) {
  using L = Layout<Q>;
  const float o = static_cast<float>(L::offset);
  const __m512 values = _mm512_setr_ps(0 - o, 1 - o, 2 - o, 3 - o, 4 - o, 5 - o, 6 - o, 7 - o, 8 - o, 9 - o,
                                       10 - o, 11 - o, 12 - o, 13 - o, 14 - o, 15 - o);
  const __m512 table = L::has_min ? _mm512_fmadd_ps(values, _mm512_set1_ps(scale[0]), _mm512_set1_ps(scale[1]))
                                  : _mm512_mul_ps(values, _mm512_set1_ps(scale[0]));
  const __m512i bytes = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + L::quants_at)));
  w_lo = _mm512_permutexvar_ps(bytes, table);
  w_hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

// Q8_0: the block's 32 integers as floats, unscaled (0-15, 16-31)
TARGET_AVX512 INLINE void integers_avx512(const uint8_t* block, __m512& q_lo, __m512& q_hi) {
  const uint8_t* quants = block + Layout<QType::Q8_0>::quants_at;
  q_lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants))));
  q_hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + 16))));
}

template <QType Q, int R, bool kTwo>
TARGET_AVX512 INLINE void float_step_avx512(const uint8_t* block, const float* scale, const float* (&rows)[R],
                                            int64_t b, __m512 (&acc)[R][kFloatChains]) {
  constexpr int count = kTwo ? 2 : 1;  // blocks
  __m512 w[4];
  if constexpr (Q == QType::Q8_0) {
    // each row's sum over a block, of the integers times x, scaled by d once (accumulators 0 and 1): at batch
    // 1 fewer instructions than scaling the weights (the head 1.63-1.66 ms against 1.78-1.93), the same time
    // at 4 and 16 rows (on AVX2 that way is 20 % slower at 4 rows and more: not there)
    for (int h = 0; h < count; ++h) integers_avx512(block + h * Layout<Q>::bytes, w[2 * h], w[2 * h + 1]);
    for (int r = 0; r < R; ++r) {
      const float* x = rows[r] + b * kBlockWeights;
      for (int h = 0; h < count; ++h) {
        const __m512 sum = _mm512_fmadd_ps(w[2 * h + 1], _mm512_loadu_ps(x + 32 * h + 16),
                                           _mm512_mul_ps(w[2 * h], _mm512_loadu_ps(x + 32 * h)));
        acc[r][h] = _mm512_fmadd_ps(sum, _mm512_set1_ps(scale[2 * h]), acc[r][h]);
      }
    }
  } else {
    for (int h = 0; h < count; ++h)
      dequantize_avx512<Q>(block + h * Layout<Q>::bytes, scale + 2 * h, w[2 * h], w[2 * h + 1]);
    for (int r = 0; r < R; ++r) {
      const float* x = rows[r] + b * kBlockWeights;
      for (int i = 0; i < 2 * count; ++i) acc[r][i] = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(x + 16 * i), acc[r][i]);
    }
  }
}

template <QType Q, int R>
TARGET_AVX512 void float_tile_avx512(const uint8_t* w_row, const FloatRows& a, int64_t r0, float* y,
                                     int64_t y_stride) {
  using L = Layout<Q>;
  __m512 acc[R][kFloatChains];
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
      float_step_avx512<Q, R, true>(w_row + b * L::bytes, scales + 2 * (b - first), rows, b, acc);
    }
    if (b < end) float_step_avx512<Q, R, false>(w_row + b * L::bytes, scales + 2 * (b - first), rows, b, acc);
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                                         _mm512_add_ps(acc[r][2], acc[r][3])));
}

// ---- dequantize_blocks: rows of blocks -> float32 rows, gguf.quants.dequantize's bits (for the many-row
// products of model/quant_blocks.py, which multiply a tile of decoded weights with torch.mm). Each weight is
// computed in gguf's own operations: d * q (Q8_0), d * (nibble - 8) (Q4_0; not d * nibble - 8 d, which gives
// +0 where gguf gives -0 for a negative d), d * nibble + m (Q4_1: by FMA, the same rounding since d * nibble
// is exact in float32).

template <QType Q> INLINE void dequantize_row_plain(const uint8_t* row, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) dequantize_plain<Q>(row + b * Layout<Q>::bytes, out + b * kBlockWeights);
}

template <QType Q> TARGET_AVX2 INLINE void dequantize_row_avx2(const uint8_t* row, int64_t blocks, float* out) {
  using L = Layout<Q>;
  for (int64_t b = 0; b < blocks; ++b, out += kBlockWeights) {
    const uint8_t* block = row + b * L::bytes;
    const uint8_t* quants = block + L::quants_at;
    const __m256 d = _mm256_set1_ps(half_f16c(block));
    if constexpr (Q == QType::Q8_0) {
      for (int i = 0; i < 4; ++i) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + 8 * i));
        _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d));
      }
    } else {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
      const __m128i low4 = _mm_set1_epi8(0x0F), offset = _mm_set1_epi8(static_cast<char>(L::offset));
      const __m128i halves[2] = {_mm_sub_epi8(_mm_and_si128(packed, low4), offset),
                                 _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), offset)};
      const __m256 m = _mm256_set1_ps(L::has_min ? half_f16c(block + 2) : 0.f);
      for (int i = 0; i < 4; ++i) {
        const __m128i eight = i & 1 ? _mm_srli_si128(halves[i >> 1], 8) : halves[i >> 1];
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
        _mm256_storeu_ps(out + 8 * i, L::has_min ? _mm256_fmadd_ps(q, d, m) : _mm256_mul_ps(q, d));
      }
    }
  }
}

template <QType Q> TARGET_AVX512 INLINE void dequantize_row_avx512(const uint8_t* row, int64_t blocks, float* out) {
  using L = Layout<Q>;
  for (int64_t b = 0; b < blocks; ++b, out += kBlockWeights) {
    const uint8_t* block = row + b * L::bytes;
    const uint8_t* quants = block + L::quants_at;
    const __m512 d = _mm512_set1_ps(half_f16c(block));
    __m512 q[2];
    if constexpr (Q == QType::Q8_0) {
      integers_avx512(block, q[0], q[1]);
    } else {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants)));
      const __m512i low4 = _mm512_set1_epi32(0x0F), offset = _mm512_set1_epi32(L::offset);
      q[0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(bytes, low4), offset));
      q[1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), offset));
    }
    const __m512 m = _mm512_set1_ps(L::has_min ? half_f16c(block + 2) : 0.f);
    for (int i = 0; i < 2; ++i)
      _mm512_storeu_ps(out + 16 * i, L::has_min ? _mm512_fmadd_ps(q[i], d, m) : _mm512_mul_ps(q[i], d));
  }
}

template <QType Q> void dequantize_rows_plain(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row_plain<Q>(w + r * blocks * Layout<Q>::bytes, blocks, out + r * blocks * kBlockWeights);
}
template <QType Q> TARGET_AVX2 void dequantize_rows_avx2(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row_avx2<Q>(w + r * blocks * Layout<Q>::bytes, blocks, out + r * blocks * kBlockWeights);
}
template <QType Q> TARGET_AVX512 void dequantize_rows_avx512(const uint8_t* w, int64_t rows, int64_t blocks,
                                                             float* out) {
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row_avx512<Q>(w + r * blocks * Layout<Q>::bytes, blocks, out + r * blocks * kBlockWeights);
}

// ---- int8 weights (`--quantization int8`): w int8 [n, k] per output channel, scales float32 [n];
// y = x @ (w * scales[:, None]).T. Each weight row's integers are converted to float32 in registers (exact:
// an int8 is a float), multiplied with x by FMA into the row's accumulators, and the row's sum is multiplied
// by its scale once at the end: so the result is x @ (w * s).T up to float rounding (one rounding of each
// product and sum, and one of the scale's product, where F.linear on the dequantized weights rounds each
// w * s instead). Rule: k is a multiple of kInt8Weights (16), so that a row is whole vectors of 16 weights
// on every path (the AVX-512 width; AVX2 takes two of 8): the loader refuses a model with another layer
// width before loading it (model/source.py, check_int8). Accumulators: kInt8Chains per row, vector v of 16
// weights (or 8 on AVX2) into chain v % kInt8Chains, summed in a fixed order at the end, so a row's result
// does not depend on its tile nor on the thread count; kInt8Chains = 4 hides the FMA latency at one row.

constexpr int64_t kInt8Weights = 16;  // k % 16 == 0
constexpr int kInt8Chains = 4;

struct Int8Weights {
  const int8_t* w;
  const float* scales;
  int64_t k;
};

template <int R>
void int8_tile_plain(const Int8Weights& W, int64_t i, const FloatRows& a, int64_t r0, float* y, int64_t y_stride) {
  const int8_t* w = W.w + i * W.k;
  float acc[R][kLanes] = {};
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t j = 0; j < W.k; j += kLanes)
    for (int r = 0; r < R; ++r)
      for (int64_t lane = 0; lane < kLanes; ++lane)
        acc[r][lane] += static_cast<float>(w[j + lane]) * rows[r][j + lane];
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_plain(acc[r]) * W.scales[i];
}

template <int R>
TARGET_AVX2 void int8_tile_avx2(const Int8Weights& W, int64_t i, const FloatRows& a, int64_t r0, float* y,
                                int64_t y_stride) {
  const int8_t* w = W.w + i * W.k;
  __m256 acc[R][kInt8Chains];
  for (auto& row : acc)
    for (__m256& v : row) v = _mm256_setzero_ps();
  const float* rows[R];
  a.rows(r0, rows);
  int64_t j = 0;
  for (; j + 8 * kInt8Chains <= W.k; j += 8 * kInt8Chains) {
    prefetch_ahead(reinterpret_cast<const uint8_t*>(w + j));
    __m256 f[kInt8Chains];
    for (int c = 0; c < kInt8Chains; ++c)
      f[c] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + j + 8 * c))));
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kInt8Chains; ++c) acc[r][c] = _mm256_fmadd_ps(f[c], _mm256_loadu_ps(rows[r] + j + 8 * c), acc[r][c]);
  }
  for (int c = 0; j < W.k; j += 8, ++c) {  // the last 16 weights where k % 32 == 16: chains 0 and 1
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + j))));
    for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(f, _mm256_loadu_ps(rows[r] + j), acc[r][c]);
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = sum_lanes_avx2(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),
                                                   _mm256_add_ps(acc[r][2], acc[r][3]))) * W.scales[i];
}

template <int R>
TARGET_AVX512 void int8_tile_avx512(const Int8Weights& W, int64_t i, const FloatRows& a, int64_t r0, float* y,
                                    int64_t y_stride) {
  const int8_t* w = W.w + i * W.k;
  __m512 acc[R][kInt8Chains];
  for (auto& row : acc)
    for (__m512& v : row) v = _mm512_setzero_ps();
  const float* rows[R];
  a.rows(r0, rows);
  int64_t j = 0;
  for (; j + 16 * kInt8Chains <= W.k; j += 16 * kInt8Chains) {
    prefetch_ahead(reinterpret_cast<const uint8_t*>(w + j));
    __m512 f[kInt8Chains];
    for (int c = 0; c < kInt8Chains; ++c)
      f[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j + 16 * c))));
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kInt8Chains; ++c) acc[r][c] = _mm512_fmadd_ps(f[c], _mm512_loadu_ps(rows[r] + j + 16 * c), acc[r][c]);
  }
  for (int c = 0; j < W.k; j += 16, ++c) {  // up to 3 vectors left: chains 0, 1, 2
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j))));
    for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(f, _mm512_loadu_ps(rows[r] + j), acc[r][c]);
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                                         _mm512_add_ps(acc[r][2], acc[r][3]))) * W.scales[i];
}

// dequantize_int8: float(w) * scale, one rounding, as torch's w.float() * scales[:, None]; the same source for
// each instruction set, which the compiler vectorises (the products are independent: the same bits on each)
INLINE void dequantize_int8_rows(const int8_t* w, const float* scales, int64_t rows, int64_t k, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scales[r];
    for (int64_t j = 0; j < k; ++j) out[r * k + j] = static_cast<float>(w[r * k + j]) * s;
  }
}
using DequantizeInt8 = void (*)(const int8_t* w, const float* s, int64_t rows, int64_t k, float* out);
void dequantize_int8_plain(const int8_t* w, const float* s, int64_t rows, int64_t k, float* out) {
  dequantize_int8_rows(w, s, rows, k, out);
}
TARGET_AVX2 void dequantize_int8_avx2(const int8_t* w, const float* s, int64_t rows, int64_t k, float* out) {
  dequantize_int8_rows(w, s, rows, k, out);
}
TARGET_AVX512 void dequantize_int8_avx512(const int8_t* w, const float* s, int64_t rows, int64_t k, float* out) {
  dequantize_int8_rows(w, s, rows, k, out);
}

// ---- picking the path

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512_vnni = 3 };
constexpr std::array<const char*, 4> kIsaNames = {"scalar", "avx2", "avx512", "avx512_vnni"};

const char* isa_name(Isa isa) { return kIsaNames[static_cast<int>(isa)]; }

bool parse_isa(const std::string& name, Isa& isa) {
  for (size_t i = 0; i < kIsaNames.size(); ++i)
    if (name == kIsaNames[i]) {
      isa = static_cast<Isa>(i);
      return true;
    }
  return false;
}

Isa best_isa() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (!avx2) return Isa::scalar;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
    return Isa::avx2;
  return __builtin_cpu_supports("avx512vnni") ? Isa::avx512_vnni : Isa::avx512;
}

const Isa kBestIsa = best_isa();

Isa at_most_best(Isa wanted) { return std::min(wanted, kBestIsa); }

Isa isa_at_load() {
  const char* wanted = std::getenv("FLOTILLA_KERNEL_ISA");
  Isa isa = kBestIsa;
  if (wanted != nullptr && *wanted != '\0' && !parse_isa(wanted, isa))
    std::fprintf(stderr, "flotilla kernels: FLOTILLA_KERNEL_ISA=%s is none of scalar, avx2, avx512, "
                 "avx512_vnni; using %s\n", wanted, isa_name(kBestIsa));
  return at_most_best(isa);
}

std::atomic<Isa> g_isa{isa_at_load()};

std::string kernel_isa(const std::string& wanted) {
  if (!wanted.empty()) {
    Isa isa;
    TORCH_CHECK(parse_isa(wanted, isa), "kernel_isa: '", wanted,
                "' is none of scalar, avx2, avx512, avx512_vnni (or '' to read the current one)");
    g_isa.store(at_most_best(isa));
  }
  return isa_name(g_isa.load());
}

// the activations' form: float (x as it is), int8 (rounded per block of 32, as llama.cpp), int16 (rounded per
// block of 32 to int16), or auto (the default): int16 where the products run on AVX2, float elsewhere
enum class Mode : int { float32 = 0, int8 = 1, int16 = 2, automatic = 3 };
constexpr std::array<const char*, 4> kModeNames = {"float", "int8", "int16", "auto"};
constexpr const char* kModeChoices = "float, int8, int16 or auto";

const char* mode_name(Mode mode) { return kModeNames[static_cast<int>(mode)]; }

bool parse_mode(const std::string& name, Mode& mode) {
  for (size_t i = 0; i < kModeNames.size(); ++i)
    if (name == kModeNames[i]) {
      mode = static_cast<Mode>(i);
      return true;
    }
  return false;
}

Mode mode_at_load() {
  const char* wanted = std::getenv("FLOTILLA_KERNEL_ACTIVATIONS");
  Mode mode = Mode::automatic;
  if (wanted != nullptr && *wanted != '\0' && !parse_mode(wanted, mode)) {
    std::fprintf(stderr, "flotilla kernels: FLOTILLA_KERNEL_ACTIVATIONS=%s is none of %s; using auto\n", wanted,
                 kModeChoices);
    mode = Mode::automatic;
  }
  return mode;
}

std::atomic<Mode> g_mode{mode_at_load()};

// the form the products take on `isa` under `mode`
Mode effective_mode(Mode mode, Isa isa) {
  if (mode != Mode::automatic) return mode;
  return isa == Isa::avx2 ? Mode::int16 : Mode::float32;
}

// wanted: "" reads the setting, a name sets it; returns the setting, then ':', then the form it takes on the
// instruction set in use ("auto:int16" on AVX2)
std::string kernel_activations(const std::string& wanted) {
  if (!wanted.empty()) {
    Mode mode;
    TORCH_CHECK(parse_mode(wanted, mode), "kernel_activations: '", wanted, "' is none of ", kModeChoices,
                " (or '' to read the current one)");
    g_mode.store(mode);
  }
  const Mode mode = g_mode.load();
  return std::string(mode_name(mode)) + ":" + mode_name(effective_mode(mode, g_isa.load()));
}

template <typename Rows> using TileOf = void (*)(const uint8_t* w_row, const Rows& a, int64_t r0, float* y,
                                                 int64_t y_stride);
template <typename Rows> using Tiles = std::array<TileOf<Rows>, kTileRows>;  // [rows - 1]

template <QType Q, int R> TileOf<Activations> tile_for(Isa isa) {
  switch (isa) {
    case Isa::avx512_vnni: return tile_avx512<Q, R, true>;
    case Isa::avx512: return tile_avx512<Q, R, false>;
    case Isa::avx2: return tile_avx2<Q, R>;
    case Isa::scalar: break;
  }
  return tile_plain<Q, R, Activations>;
}

template <QType Q, int R> TileOf<FloatRows> float_tile_for(Isa isa) {
  switch (isa) {
    case Isa::avx512_vnni:
    case Isa::avx512: return float_tile_avx512<Q, R>;
    case Isa::avx2: return float_tile_avx2<Q, R>;
    case Isa::scalar: break;
  }
  return float_tile_plain<Q, R>;
}

static_assert(kTileRows == 4, "tiles_for lists one tile per row count");
template <QType Q> Tiles<Activations> tiles_for(Isa isa) {
  return {tile_for<Q, 1>(isa), tile_for<Q, 2>(isa), tile_for<Q, 3>(isa), tile_for<Q, 4>(isa)};
}

template <QType Q, int R> TileOf<Activations16> tile16_for(Isa isa) {
  return isa == Isa::scalar ? tile_plain<Q, R, Activations16> : tile16_avx2<Q, R>;  // AVX-512 CPUs run the AVX2 tile
}

template <QType Q> Tiles<Activations16> tiles16_for(Isa isa) {
  return {tile16_for<Q, 1>(isa), tile16_for<Q, 2>(isa), tile16_for<Q, 3>(isa), tile16_for<Q, 4>(isa)};
}

template <QType Q> Tiles<FloatRows> float_tiles_for(Isa isa) {
  return {float_tile_for<Q, 1>(isa), float_tile_for<Q, 2>(isa), float_tile_for<Q, 3>(isa), float_tile_for<Q, 4>(isa)};
}

// ---- the op

template <QType Q, typename Rows>
void multiply(const Rows& a, const uint8_t* w, int64_t n, int64_t m, float* y, const Tiles<Rows>& tiles) {
  const int64_t row_bytes = a.blocks * Layout<Q>::bytes;
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  #pragma omp parallel for schedule(static) if (n >= kMinParallelRows)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kChunkRows, end = std::min(n, first + kChunkRows);
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const TileOf<Rows> tile = tiles[std::min<int64_t>(kTileRows, m - r0) - 1];
      for (int64_t i = first; i < end; ++i) tile(w + i * row_bytes, a, r0, y + r0 * n + i, n);
    }
  }
}

// int8: rounds x into one scratch buffer (one allocation per call), then multiplies
template <QType Q> void run_int8(const at::Tensor& x, const uint8_t* w, at::Tensor& y, Isa isa) {
  using L = Layout<Q>;
  const int64_t m = x.size(0), k = x.size(1), nb = k / kBlockWeights;
  const int64_t with_sums = L::has_min, with_bias = isa == Isa::avx512_vnni && L::offset != 0;
  const int64_t lanes = m * nb * kLanes;  // of scale8, and of sum8 and bias where they are
  at::Tensor scratch = at::empty({lanes * 4 * (1 + with_sums + with_bias) + m * k}, x.options().dtype(at::kByte));
  float* scale8 = reinterpret_cast<float*>(scratch.data_ptr<uint8_t>());
  float* sum8 = with_sums ? scale8 + lanes : nullptr;
  int32_t* bias = with_bias ? reinterpret_cast<int32_t*>(scale8 + lanes * (1 + with_sums)) : nullptr;
  int8_t* q = reinterpret_cast<int8_t*>(scale8 + lanes * (1 + with_sums + with_bias));
  const Activations a{q, scale8, sum8, bias, k, nb};

  const auto round_row_isa = isa == Isa::scalar ? round_row_plain : round_row_avx2;
  const at::Tensor xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  #pragma omp parallel for schedule(static) if (m >= kMinParallelRows)
  for (int64_t r = 0; r < m; ++r) round_row_isa(xp + r * k, a, r, L::offset);
  multiply<Q>(a, w, y.size(1), m, y.data_ptr<float>(), tiles_for<Q>(isa));
}

// int16: rounds x into one scratch buffer (one allocation per call), then multiplies
template <QType Q> void run_int16(const at::Tensor& x, const uint8_t* w, at::Tensor& y, Isa isa) {
  const int64_t m = x.size(0), k = x.size(1), nb = k / kBlockWeights;
  const int64_t with_sums = Layout<Q>::has_min;
  at::Tensor scratch = at::empty({m * nb * (1 + with_sums) * 4 + m * k * 2}, x.options().dtype(at::kByte));
  float* scale = reinterpret_cast<float*>(scratch.data_ptr<uint8_t>());
  float* sum = with_sums ? scale + m * nb : nullptr;
  int16_t* q = reinterpret_cast<int16_t*>(scale + m * nb * (1 + with_sums));
  const Activations16 a{q, scale, sum, k, nb};
  const auto round = isa == Isa::scalar ? round_row16_plain : round_row16_avx2;
  const at::Tensor xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  #pragma omp parallel for schedule(static) if (m >= kMinParallelRows)
  for (int64_t r = 0; r < m; ++r) round(xp + r * k, a, r);
  multiply<Q>(a, w, y.size(1), m, y.data_ptr<float>(), tiles16_for<Q>(isa));
}

// float: multiplies x as it is (no scratch)
template <QType Q> void run_float(const at::Tensor& x, const uint8_t* w, at::Tensor& y, Isa isa) {
  const at::Tensor xc = x.contiguous();
  const FloatRows a{xc.data_ptr<float>(), x.size(1), x.size(1) / kBlockWeights};
  multiply<Q>(a, w, y.size(1), x.size(0), y.data_ptr<float>(), float_tiles_for<Q>(isa));
}

template <QType Q> void run(const at::Tensor& x, const uint8_t* w, at::Tensor& y, Isa isa, Mode mode) {
  switch (effective_mode(mode, isa)) {
    case Mode::int8: run_int8<Q>(x, w, y, isa); break;
    case Mode::int16: run_int16<Q>(x, w, y, isa); break;
    default: run_float<Q>(x, w, y, isa); break;
  }
}

// which file's kernels multiply a type: this one's (Q8_0, Q4_0, Q4_1), q5_matmul.cpp's or kquant_matmul.cpp's
enum class Kernels { here, q5, kquants };

// a type's block: its weights (32, or 256 for the k-quants of kquant_matmul.cpp) and its bytes
struct BlockShape {
  int64_t weights, bytes;
  Kernels kernels;
  bool kquant() const { return kernels == Kernels::kquants; }
};

BlockShape block_shape(const char* op, int64_t qtype) {
  switch (static_cast<QType>(qtype)) {
    case QType::Q8_0: return {kBlockWeights, Layout<QType::Q8_0>::bytes, Kernels::here};
    case QType::Q4_0: return {kBlockWeights, Layout<QType::Q4_0>::bytes, Kernels::here};
    case QType::Q4_1: return {kBlockWeights, Layout<QType::Q4_1>::bytes, Kernels::here};
    case QType::Q5_0: return {kBlockWeights, Layout<QType::Q5_0>::bytes, Kernels::q5};
    case QType::Q5_1: return {kBlockWeights, Layout<QType::Q5_1>::bytes, Kernels::q5};
  }
  const int64_t kquant_bytes = kquants::block_bytes(qtype);
  TORCH_CHECK(kquant_bytes > 0, op, ": qtype ", qtype, " is none of Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), "
              "Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14)");
  return {kSuperWeights, kquant_bytes, Kernels::kquants};
}

// the path of the other files' kernels (P: kquants::Path or q5::Path, the same values) for the instruction
// set: they have one AVX-512 path (no VNNI variant)
template <typename P> P simd_path(Isa isa) {
  switch (isa) {
    case Isa::avx512_vnni:
    case Isa::avx512: return P::avx512;
    case Isa::avx2: return P::avx2;
    case Isa::scalar: break;
  }
  return P::plain;
}

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype) {
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "quant_matmul: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "quant_matmul: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(blocks.scalar_type() == at::kByte, "quant_matmul: blocks must be uint8, got ", blocks.scalar_type());
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 2, "quant_matmul: x must be [m, k] and blocks [n, bytes per row], got ",
              x.sizes(), " and ", blocks.sizes());
  const BlockShape block = block_shape("quant_matmul", qtype);
  const int64_t m = x.size(0), k = x.size(1), n = blocks.size(0), bytes = block.bytes, per = block.weights;
  TORCH_CHECK(k > 0 && k % per == 0, "quant_matmul: k = ", k, " must be a positive multiple of ", per,
              block.kquant() ? " (the weights of a k-quant's super-block)" : "");
  TORCH_CHECK(blocks.size(1) == k / per * bytes, "quant_matmul: blocks has ", blocks.size(1),
              " bytes per row; k = ", k, " takes ", k / per * bytes, " (", k / per, " blocks of ", bytes, " bytes)");
  TORCH_CHECK(blocks.is_contiguous(), "quant_matmul: blocks must be contiguous");
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const Isa isa = g_isa.load();
  const Mode mode = g_mode.load();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  if (block.kernels == Kernels::q5 && effective_mode(mode, isa) == Mode::int16) {  // Q4's int16 path
    if (qtype == static_cast<int64_t>(QType::Q5_0)) run_int16<QType::Q5_0>(x, w, y, isa);
    else run_int16<QType::Q5_1>(x, w, y, isa);
    return y;
  }
  if (block.kernels != Kernels::here) {  // float activations in the other modes (kquant_matmul.cpp, q5_matmul.cpp)
    const at::Tensor xc = x.contiguous();
    if (block.kquant())
      kquants::matmul(qtype, xc.data_ptr<float>(), m, k, w, n, y.data_ptr<float>(), simd_path<kquants::Path>(isa));
    else
      q5::matmul(qtype, xc.data_ptr<float>(), m, k, w, n, y.data_ptr<float>(), simd_path<q5::Path>(isa));
    return y;
  }
  switch (static_cast<QType>(qtype)) {
    case QType::Q8_0: run<QType::Q8_0>(x, w, y, isa, mode); break;
    case QType::Q4_0: run<QType::Q4_0>(x, w, y, isa, mode); break;
    case QType::Q4_1: run<QType::Q4_1>(x, w, y, isa, mode); break;
    case QType::Q5_0:
    case QType::Q5_1: break;  // above
  }
  return y;
}

// dequantize_blocks: rows of blocks into out, float32 [rows, k], split over the threads by rows (each weight
// is computed alone, so the bits do not depend on the thread count nor on the instruction set)
using DequantizeRows = void (*)(const uint8_t* w, int64_t rows, int64_t blocks, float* out);

template <QType Q> DequantizeRows dequantize_rows_for(Isa isa) {
  switch (isa) {
    case Isa::avx512_vnni:
    case Isa::avx512: return dequantize_rows_avx512<Q>;
    case Isa::avx2: return dequantize_rows_avx2<Q>;
    case Isa::scalar: break;
  }
  return dequantize_rows_plain<Q>;
}

constexpr int64_t kMinParallelWeights = 1 << 15;  // below, one thread: a fork and join costs a few us
constexpr int64_t kDequantizeChunkRows = 4;

void dequantize_blocks(const at::Tensor& blocks, int64_t qtype, const at::Tensor& out) {
  TORCH_CHECK(blocks.device().is_cpu() && out.device().is_cpu(), "dequantize_blocks: CPU tensors only");
  TORCH_CHECK(blocks.scalar_type() == at::kByte, "dequantize_blocks: blocks must be uint8, got ",
              blocks.scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kFloat, "dequantize_blocks: out must be float32, got ", out.scalar_type());
  TORCH_CHECK(blocks.dim() == 2 && out.dim() == 2, "dequantize_blocks: blocks must be [rows, bytes per row] and "
              "out [rows, k], got ", blocks.sizes(), " and ", out.sizes());
  const BlockShape block = block_shape("dequantize_blocks", qtype);
  const int64_t rows = blocks.size(0), k = out.size(1), bytes = block.bytes, per = block.weights;
  TORCH_CHECK(out.size(0) == rows && k % per == 0 && blocks.size(1) == k / per * bytes,
              "dequantize_blocks: blocks ", blocks.sizes(), " of ", bytes, "-byte blocks of ", per,
              " weights do not fill out ", out.sizes());
  TORCH_CHECK(blocks.is_contiguous() && out.is_contiguous(), "dequantize_blocks: blocks and out must be contiguous");
  if (rows == 0 || k == 0) return;
  const Isa isa = g_isa.load();
  if (block.kquant()) {
    kquants::dequantize(qtype, blocks.data_ptr<uint8_t>(), rows, k, out.data_ptr<float>(),
                        simd_path<kquants::Path>(isa));
    return;
  }
  if (block.kernels == Kernels::q5) {
    q5::dequantize(qtype, blocks.data_ptr<uint8_t>(), rows, k, out.data_ptr<float>(), simd_path<q5::Path>(isa));
    return;
  }
  DequantizeRows run_rows = nullptr;
  switch (static_cast<QType>(qtype)) {
    case QType::Q8_0: run_rows = dequantize_rows_for<QType::Q8_0>(isa); break;
    case QType::Q4_0: run_rows = dequantize_rows_for<QType::Q4_0>(isa); break;
    case QType::Q4_1: run_rows = dequantize_rows_for<QType::Q4_1>(isa); break;
    case QType::Q5_0:
    case QType::Q5_1: return;  // above
  }
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  const int64_t nb = k / kBlockWeights, chunks = (rows + kDequantizeChunkRows - 1) / kDequantizeChunkRows;
  #pragma omp parallel for schedule(static) if (rows * k >= kMinParallelWeights)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kDequantizeChunkRows, count = std::min(kDequantizeChunkRows, rows - first);
    run_rows(w + first * nb * bytes, count, nb, y + first * k);
  }
}


// ---- int8_matmul and dequantize_int8 (the int8 kernels above)

using Int8TileOf = void (*)(const Int8Weights& W, int64_t i, const FloatRows& a, int64_t r0, float* y, int64_t y_stride);
using Int8Tiles = std::array<Int8TileOf, kTileRows>;  // [rows - 1]

Int8Tiles int8_tiles_for(Isa isa) {
  switch (isa) {
    case Isa::avx512_vnni:
    case Isa::avx512: return {int8_tile_avx512<1>, int8_tile_avx512<2>, int8_tile_avx512<3>, int8_tile_avx512<4>};
    case Isa::avx2: return {int8_tile_avx2<1>, int8_tile_avx2<2>, int8_tile_avx2<3>, int8_tile_avx2<4>};
    case Isa::scalar: break;
  }
  return {int8_tile_plain<1>, int8_tile_plain<2>, int8_tile_plain<3>, int8_tile_plain<4>};
}

void check_int8_weights(const char* op, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(w.device().is_cpu() && scales.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(w.scalar_type() == at::kChar, op, ": w must be int8, got ", w.scalar_type());
  TORCH_CHECK(scales.scalar_type() == at::kFloat, op, ": scales must be float32, got ", scales.scalar_type());
  TORCH_CHECK(w.dim() == 2 && scales.dim() == 1 && scales.size(0) == w.size(0), op,
              ": w must be [n, k] and scales [n], got ", w.sizes(), " and ", scales.sizes());
  TORCH_CHECK(w.is_contiguous() && scales.is_contiguous(), op, ": w and scales must be contiguous");
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  check_int8_weights("int8_matmul", w, scales);
  TORCH_CHECK(x.device().is_cpu(), "int8_matmul: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_matmul: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1), "int8_matmul: x must be [m, k] for w [n, k], got ", x.sizes(),
              " and ", w.sizes());
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(k > 0 && k % kInt8Weights == 0, "int8_matmul: k = ", k, " must be a positive multiple of ",
              kInt8Weights);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const at::Tensor xc = x.contiguous();
  const FloatRows a{xc.data_ptr<float>(), k, 0};
  const Int8Weights W{w.data_ptr<int8_t>(), scales.data_ptr<float>(), k};
  const Int8Tiles tiles = int8_tiles_for(g_isa.load());
  float* yp = y.data_ptr<float>();
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  #pragma omp parallel for schedule(static) if (n >= kMinParallelRows)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kChunkRows, end = std::min(n, first + kChunkRows);
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const Int8TileOf tile = tiles[std::min<int64_t>(kTileRows, m - r0) - 1];
      for (int64_t i = first; i < end; ++i) tile(W, i, a, r0, yp + r0 * n + i, n);
    }
  }
  return y;
}

void dequantize_int8(const at::Tensor& w, const at::Tensor& scales, const at::Tensor& out) {
  check_int8_weights("dequantize_int8", w, scales);
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous(),
              "dequantize_int8: out must be a contiguous float32 CPU tensor");
  TORCH_CHECK(out.sizes() == w.sizes(), "dequantize_int8: out ", out.sizes(), " is not w's shape ", w.sizes());
  const int64_t rows = w.size(0), k = w.size(1);
  if (rows == 0 || k == 0) return;
  DequantizeInt8 run_rows = dequantize_int8_plain;
  switch (g_isa.load()) {
    case Isa::avx512_vnni:
    case Isa::avx512: run_rows = dequantize_int8_avx512; break;
    case Isa::avx2: run_rows = dequantize_int8_avx2; break;
    case Isa::scalar: break;
  }
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const int64_t chunks = (rows + kDequantizeChunkRows - 1) / kDequantizeChunkRows;
  #pragma omp parallel for schedule(static) if (rows * k >= kMinParallelWeights)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kDequantizeChunkRows, count = std::min(kDequantizeChunkRows, rows - first);
    run_rows(wp + first * k, sp + first, count, k, y + first * k);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flotilla, m) {
  m.def("quant_matmul(Tensor x, Tensor blocks, int qtype) -> Tensor");
  m.def("kernel_isa(str wanted) -> str", &kernel_isa);
  m.def("kernel_activations(str wanted) -> str", &kernel_activations);
  m.def("dequantize_blocks(Tensor blocks, int qtype, Tensor(a!) out) -> ()");
  m.def("int8_matmul(Tensor x, Tensor w, Tensor scales) -> Tensor");
  m.def("dequantize_int8(Tensor w, Tensor scales, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(flotilla, CPU, m) {
  m.impl("quant_matmul", quant_matmul);
  m.impl("dequantize_blocks", dequantize_blocks);
  m.impl("int8_matmul", int8_matmul);
  m.impl("dequantize_int8", dequantize_int8);
}
