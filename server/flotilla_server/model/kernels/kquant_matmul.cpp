// llama.cpp's k-quants, Q4_K (GGML type 12), Q5_K (13) and Q6_K (14), for torch.ops.flotilla.quant_matmul and
// dequantize_blocks: quant_matmul.cpp checks the arguments, picks the instruction set and calls matmul() or
// dequantize() here (scripts/build_kernels.py builds both files into one library).
//
// Why: llama.cpp's Q4_K_M, Q5_K_M and Q6_K files hold most of their weights in these types, 4.5, 5.5 and
// 6.5625 bits per weight against 32 for a float32 copy, and a decode step at batch 1 reads every weight once, so its speed is
// the bytes it reads (and a pool's memory budget the bytes each model holds).
//
// Layouts (ggml-common.h; a super-block is 256 consecutive weights of a row, little-endian):
//   Q4_K, 144 bytes: fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]. 8 sub-blocks of 32 weights, each with
//     a 6-bit scale sc and a 6-bit min m packed in scales[] (q4k_six_bits). Weight 64 j + i (j < 4, i < 32) is
//     the low nibble q of qs[32 j + i], in sub-block 2 j; weight 64 j + 32 + i its high nibble, in sub-block
//     2 j + 1. w = (d * sc) * q - dmin * m.
//   Q5_K, 176 bytes: fp16 d, fp16 dmin, uint8 scales[12] (Q4_K's), uint8 qh[32], uint8 qs[128]. As Q4_K, with a
//     fifth bit: weight 64 j + i takes bit 2 j of qh[i], weight 64 j + 32 + i bit 2 j + 1, q in 0..31.
//   Q6_K, 210 bytes: uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d. 16 sub-blocks of 16 weights. Weight
//     128 h + 32 s + i (h < 2, s < 4, i < 32) has the low 4 bits of q from ql[64 h + 32 (s & 1) + i] (its low
//     nibble for s < 2, its high one for s >= 2) and the high 2 from bits 2 s, 2 s + 1 of qh[32 h + i].
//     w = (d * scales[w / 16]) * (q - 32).
// Exact weights: d * sc, dmin * m and d * scales are exact in float32 (an fp16 times an integer of 8 bits at
// most); so are (d * sc) * q (at most 11 + 6 + 4 significant bits) and (d * scale) * (q - 32) (odd parts at
// most 2047 * 127 * 31 < 2^24). So a Q6_K weight is an exact product, and a Q4_K weight is rounded once, at
// the subtraction of dmin * m, which an FMA (q * (d sc) - dmin m) rounds the same way (Q5_K's (d * sc) * q
// too: at most 11 + 6 + 5 significant bits): every path here
// computes gguf.quants.dequantize's bits (model/quant_blocks.py's torch fallback too).
//
// How (products): as the other types' float path (quant_matmul.cpp), x is used as it is and each super-block
// is decoded to float32 in registers and multiplied with x by FMA, 64 weights at a time (4 vectors of 16 on
// AVX-512, 8 of 8 on AVX2), each row of a tile of up to 4 x rows into its own accumulators. Q4_K on AVX-512:
// per 32-weight sub-block a table of its 16 possible weights (one FMA), and vpermps picks each weight by its
// nibble, as the Q4_0 and Q4_1 paths do (Q5_K: a table of 32 in two vectors, and vpermt2ps picks by the
// nibble and the fifth bit); on AVX2 (vpermps there takes 8 entries) each nibble is converted
// and scaled by one FMA. Q6_K: its integers less 32 are put together as bytes, 32 (AVX2) or 64 (AVX-512) at
// a time, from ql's nibbles and qh's pairs of bits; then each 8 or 16 are sign-extended, converted and scaled
// by their sub-block's d * scale. Plain C++ decodes a super-block to 256 floats, then multiplies them in 8
// lanes per row. In int8-activation mode (FLOTILLA_KERNEL_ACTIVATIONS=int8) the k-quants take this float
// path too (no int8 path here): their products are x's with the exact weights in either mode.
//
// Measured on one thread (torch.set_num_threads(1)) of this project's 2-core Xeon VM (family 6 model 167,
// AVX-512 with VNNI), median ms per call, float activations, random blocks; against the same shapes in Q4_1
// (kept in blocks, quant_matmul.cpp) and F.linear on float32 weights; n x k is weight rows x row length:
//                     AVX-512, 1 row                  AVX-512, 16 rows            AVX2, 1 row
//   n x k          Q4_K   Q6_K   Q4_1   F.linear    Q4_K   Q6_K   Q4_1   F.linear   Q4_K   Q6_K   Q4_1
//   1536 x 1024    0.081  0.108  0.080  0.223       0.61   0.77   0.60   0.68       0.111  0.145  0.112
//   4096 x 1024    0.209  0.281  0.200  0.590       1.73   2.13   1.68   1.88       0.297  0.389  0.299
//   1024 x 4096    0.211  0.280  0.191  0.592       2.31   2.49   2.08   2.17       0.299  0.383  0.283
//   49152 x 512    1.48   1.86   1.56   5.58        12.0   14.7   11.6   19.6       1.96   2.49   1.96
// These weights sit in the core's L2 or the L3, where the one-row products are bound by instructions: Q4_K
// at about Q4_1's time per weight, Q6_K at 1.3-1.4x it (it has 1.46x the bytes). From memory (256 copies of
// the 4096 x 1024 matrix cycled, 0.6-0.9 GB, which no cache holds), one row took 0.280 ms in Q4_K (8.4 GB/s
// of blocks), 0.394 in Q6_K (8.7 GB/s) and 0.313 in Q4_1 (8.4 GB/s), where a plain sum of the same bytes as
// floats reads 10.8-11.1 GB/s: a decode step's products read its weights at about 80 % of the core's rate
// from memory, as Q4_1's do. From 32 rows model/quant_blocks.py takes its many-row path instead (tiles
// decoded by dequantize() and torch.mm), for these types as for the others (1536 x 1024 at 64 rows: Q4_K
// 1.7 ms that way against 2.5 in the kernel, Q6_K 1.7 against 3.2; F.linear 1.4).
//
// Rules (those of quant_matmul.cpp):
// - each output element is one thread's sum over its super-blocks in order, in fixed lanes, so the result has
//   the same bits on any thread count, and a row's result does not depend on the other rows of x (its tile);
//   the instruction sets differ from each other by float rounding only (all multiply x by the exact weights);
// - weight rows are split over the threads of torch's OpenMP runtime in chunks of kChunkRows, from
//   kMinParallelRows rows; dequantize() splits rows from kMinParallelWeights weights;
// - k is a multiple of 256 (quant_matmul.cpp refuses another before calling in here);
// - one build runs anywhere: the caller passes the path its cpuid check (and FLOTILLA_KERNEL_ISA) picked;
//   AVX-512 (F, BW, VL), AVX2 (with FMA, F16C) or plain C++, never -march=native.
#include <c10/util/Half.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

namespace flotilla::kquants {
enum class Path : int { plain = 0, avx2 = 1, avx512 = 2 };
int64_t block_bytes(int64_t qtype);
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path);
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path);
}  // namespace flotilla::kquants

namespace {

using flotilla::kquants::Path;

constexpr int64_t kSuperWeights = 256;
constexpr int kGroups = 4;                 // of 64 weights per super-block: the unit each decoder yields
constexpr int kTileRows = 4;               // x rows that share one decoding of each super-block
constexpr int64_t kChunkRows = 8;          // weight rows per unit of a thread's work
constexpr int64_t kMinParallelRows = 64;
constexpr int64_t kMinParallelWeights = 1 << 15;  // dequantize(): below, one thread (a fork costs a few us)
constexpr int64_t kDequantizeChunkRows = 4;
constexpr int64_t kPrefetchBytes = 2048;   // as quant_matmul.cpp's: the weight bytes read that far ahead

enum class KType : int64_t { Q4_K = 12, Q5_K = 13, Q6_K = 14 };
constexpr int64_t kQ4KBytes = 144, kQ5KBytes = 176, kQ6KBytes = 210;

INLINE uint16_t half_bits(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return bits;
}

// every 64-byte line of a super-block kPrefetchBytes ahead: addresses at most 64 bytes apart touch each line
template <int64_t kBytes> INLINE void prefetch_ahead(const uint8_t* block) {
  for (int64_t at = 0; at < kBytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchBytes + at, _MM_HINT_T0);
}

// After the scales are stored into their buffer: the compiler must read them back from memory (broadcast
// loads: the load ports), where it would otherwise keep them in registers and broadcast each by a shuffle
// (vpermd: port 5, which the products' own permutes and conversions fill). Without it Q4_K's one-row product
// on AVX-512 took 1.4x Q4_1's time per weight. (Q6_K's integers stay in registers: stored and read back
// instead, its 16-row products took 1.2x as long.)
template <class Buffer> INLINE void through_memory(Buffer& buffer) { asm volatile("" : "+m"(buffer)); }

// Q4_K's 8 scales (bytes 0-7) and 8 mins (8-15) from its 12 packed bytes, as llama.cpp's get_scale_min_k4
// unpacks them, four at a time in 32-bit words: for j < 4, sc[j] = s[j] & 63 and m[j] = s[j + 4] & 63; for
// j >= 4, the low 4 bits from s[j + 4] (sc: its low nibble, m: its high one) and the high 2 from the top two
// bits of s[j - 4] (sc) or s[j] (m)
INLINE void q4k_six_bits(const uint8_t* packed, uint8_t out[16]) {
  uint32_t s[3];
  std::memcpy(s, packed, sizeof s);
  constexpr uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, low2 = 0x03030303;
  const uint32_t words[4] = {s[0] & low6, (s[2] & low4) | (((s[0] >> 6) & low2) << 4),
                             s[1] & low6, ((s[2] >> 4) & low4) | (((s[1] >> 6) & low2) << 4)};
  std::memcpy(out, words, sizeof words);
}

// ---- plain C++: a super-block decoded to 256 floats, then multiplied in 8 lanes per row

INLINE float half_plain(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(half_bits(p)); }

void q4k_block_plain(const uint8_t* block, float* w) {
  const float d = half_plain(block), dmin = half_plain(block + 2);
  uint8_t six[16];
  q4k_six_bits(block + 4, six);
  const uint8_t* qs = block + 16;
  for (int j = 0; j < kGroups; ++j) {
    const float scale_lo = d * six[2 * j], min_lo = dmin * six[8 + 2 * j];
    const float scale_hi = d * six[2 * j + 1], min_hi = dmin * six[9 + 2 * j];
    for (int i = 0; i < 32; ++i) {
      w[64 * j + i] = scale_lo * static_cast<float>(qs[32 * j + i] & 15) - min_lo;
      w[64 * j + 32 + i] = scale_hi * static_cast<float>(qs[32 * j + i] >> 4) - min_hi;
    }
  }
}

// loops of constant shifts, which the compiler vectorises (SSE2: the build's baseline)
void q6k_block_plain(const uint8_t* block, float* w) {
  const uint8_t *ql = block, *qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = half_plain(block + 208);
  int8_t q[kSuperWeights];
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      const int low0 = ql[64 * h + i], low1 = ql[64 * h + 32 + i], high = qh[32 * h + i];
      q[128 * h + i] = static_cast<int8_t>(((low0 & 15) | ((high & 3) << 4)) - 32);
      q[128 * h + 32 + i] = static_cast<int8_t>(((low1 & 15) | (((high >> 2) & 3) << 4)) - 32);
      q[128 * h + 64 + i] = static_cast<int8_t>(((low0 >> 4) | (((high >> 4) & 3) << 4)) - 32);
      q[128 * h + 96 + i] = static_cast<int8_t>(((low1 >> 4) | (((high >> 6) & 3) << 4)) - 32);
    }
  for (int g = 0; g < 16; ++g) {
    const float scale = d * static_cast<float>(scales[g]);
    for (int i = 0; i < 16; ++i) w[16 * g + i] = scale * static_cast<float>(q[16 * g + i]);
  }
}

void q5k_block_plain(const uint8_t* block, float* w) {
  const float d = half_plain(block), dmin = half_plain(block + 2);
  uint8_t six[16];
  q4k_six_bits(block + 4, six);
  const uint8_t *qh = block + 16, *qs = block + 48;
  for (int j = 0; j < kGroups; ++j) {
    const float scale_lo = d * six[2 * j], min_lo = dmin * six[8 + 2 * j];
    const float scale_hi = d * six[2 * j + 1], min_hi = dmin * six[9 + 2 * j];
    for (int i = 0; i < 32; ++i) {
      const int lo = (qs[32 * j + i] & 15) | (((qh[i] >> (2 * j)) & 1) << 4);
      const int hi = (qs[32 * j + i] >> 4) | (((qh[i] >> (2 * j + 1)) & 1) << 4);
      w[64 * j + i] = scale_lo * static_cast<float>(lo) - min_lo;
      w[64 * j + 32 + i] = scale_hi * static_cast<float>(hi) - min_hi;
    }
  }
}

template <KType Q> INLINE void block_plain(const uint8_t* block, float* w) {
  if constexpr (Q == KType::Q4_K) q4k_block_plain(block, w);
  else if constexpr (Q == KType::Q5_K) q5k_block_plain(block, w);
  else q6k_block_plain(block, w);
}

template <KType Q> constexpr int64_t bytes_of() {
  return Q == KType::Q4_K ? kQ4KBytes : Q == KType::Q5_K ? kQ5KBytes : kQ6KBytes;
}

// x's rows, float32 [m, k]; blocks: super-blocks per row
struct Rows {
  const float* x;
  int64_t k, blocks;

  template <int R> void rows(int64_t r0, const float* (&out)[R]) const {
    for (int r = 0; r < R; ++r) out[r] = x + (r0 + r) * k;
  }
};

constexpr int kLanes = 8;

template <KType Q, int R>
void tile_plain(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  float acc[R][kLanes] = {};
  const float* rows[R];
  a.rows(r0, rows);
  for (int64_t b = 0; b < a.blocks; ++b) {
    float w[kSuperWeights];
    block_plain<Q>(w_row + b * bytes_of<Q>(), w);
    for (int r = 0; r < R; ++r) {
      const float* x = rows[r] + b * kSuperWeights;
      for (int64_t j = 0; j < kSuperWeights; j += kLanes)
        for (int lane = 0; lane < kLanes; ++lane) acc[r][lane] += w[j + lane] * x[j + lane];
    }
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) +
                      ((acc[r][4] + acc[r][5]) + (acc[r][6] + acc[r][7]));
}

template <KType Q> void dequantize_plain(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  for (int64_t b = 0; b < rows * blocks; ++b) block_plain<Q>(w + b * bytes_of<Q>(), out + b * kSuperWeights);
}

// The SIMD paths convert the scales of up to kScaleBlocks super-blocks of a row at a time into a buffer (16
// floats each: Q4_K's d * sc and dmin * m, Q6_K's d * scales), which the groups' steps then broadcast from
// memory (through_memory). Why ahead, not per super-block: a broadcast load right behind the store it reads
// waited for it (at 16 rows, Q4_K's product took 1.2-1.4x Q4_1's time per weight that way).
constexpr int64_t kScaleBlocks = 16;
using ScaleBuffer = float[kScaleBlocks][16];

// ---- AVX2: each group of 64 weights as 8 vectors of 8, into 2 accumulators per row (vector v into v & 1)

TARGET_AVX2 INLINE float half_f16c(const uint8_t* p) { return _cvtsh_ss(half_bits(p)); }

struct Q4KAvx2 {
  static constexpr int64_t bytes = kQ4KBytes;

  // d * sc (scale[0..7]) and dmin * m (scale[8..15])
  TARGET_AVX2 static INLINE void scales(const uint8_t* block, float* scale) {
    alignas(16) uint8_t six[16];
    q4k_six_bits(block + 4, six);
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(six));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)));
    _mm256_store_ps(scale, _mm256_mul_ps(sc, _mm256_set1_ps(half_f16c(block))));
    _mm256_store_ps(scale + 8, _mm256_mul_ps(m, _mm256_set1_ps(half_f16c(block + 2))));
  }

  // weights 64 j .. 64 j + 63: q * (d sc) - dmin m by one FMA (gguf's rounding: the product is exact)
  TARGET_AVX2 INLINE void group(const uint8_t* block, int j, const float* scale, __m256 (&w)[8]) {
    const uint8_t* qs = block + 16 + 32 * j;
    const __m256 d_lo = _mm256_set1_ps(scale[2 * j]), m_lo = _mm256_set1_ps(scale[8 + 2 * j]);
    const __m256 d_hi = _mm256_set1_ps(scale[2 * j + 1]), m_hi = _mm256_set1_ps(scale[9 + 2 * j]);
    for (int i = 0; i < 4; ++i) {
      const __m256i bytes8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i)));
      w[i] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes8, _mm256_set1_epi32(15))), d_lo, m_lo);
      w[4 + i] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes8, 4)), d_hi, m_hi);
    }
  }
};

// Q4_K's scales; each nibble gets its fifth bit from qh (bit 2 j or 2 j + 1 of qh[i]) before the FMA
struct Q5KAvx2 {
  static constexpr int64_t bytes = kQ5KBytes;

  TARGET_AVX2 static INLINE void scales(const uint8_t* block, float* scale) { Q4KAvx2::scales(block, scale); }

  TARGET_AVX2 INLINE void group(const uint8_t* block, int j, const float* scale, __m256 (&w)[8]) {
    const uint8_t *qs = block + 48 + 32 * j, *qh = block + 16;
    const __m256 d_lo = _mm256_set1_ps(scale[2 * j]), m_lo = _mm256_set1_ps(scale[8 + 2 * j]);
    const __m256 d_hi = _mm256_set1_ps(scale[2 * j + 1]), m_hi = _mm256_set1_ps(scale[9 + 2 * j]);
    const __m128i shift = _mm_cvtsi32_si128(2 * j);
    const __m256i low4 = _mm256_set1_epi32(15), bit4 = _mm256_set1_epi32(16);
    for (int i = 0; i < 4; ++i) {
      const __m256i bytes8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i)));
      const __m256i high8 = _mm256_srl_epi32(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + 8 * i))), shift);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(bytes8, low4),
                                         _mm256_and_si256(_mm256_slli_epi32(high8, 4), bit4));
      const __m256i hi = _mm256_or_si256(_mm256_srli_epi32(bytes8, 4),
                                         _mm256_and_si256(_mm256_slli_epi32(high8, 3), bit4));
      w[i] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(lo), d_lo, m_lo);
      w[4 + i] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(hi), d_hi, m_hi);
    }
  }
};

struct Q6KAvx2 {
  static constexpr int64_t bytes = kQ6KBytes;
  alignas(32) int8_t q[128];  // one half's integers q - 32, in weight order

  // d * scales[g] (scale[g])
  TARGET_AVX2 static INLINE void scales(const uint8_t* block, float* scale) {
    const __m256 d = _mm256_set1_ps(half_f16c(block + 208));
    for (int i = 0; i < 2; ++i) {
      const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 192 + 8 * i));
      _mm256_store_ps(scale + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight))));
    }
  }

  // weights 128 h .. 128 h + 127 into q, 32 at a time (s = 0..3: see the layout); 16-bit shifts carry bits
  // of the neighbouring byte in, which the masks drop
  TARGET_AVX2 INLINE void half(const uint8_t* block, int h) {
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
    const __m256i six[4] = {
        _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
        _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
    for (int s = 0; s < 4; ++s)
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 32 * s), _mm256_sub_epi8(six[s], bias));
  }

  TARGET_AVX2 INLINE void group(const uint8_t* block, int j, const float* scale, __m256 (&w)[8]) {
    if ((j & 1) == 0) half(block, j / 2);
    const int8_t* quants = q + 64 * (j & 1);
    for (int v = 0; v < 8; ++v) {
      const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants + 8 * v));
      w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), _mm256_set1_ps(scale[4 * j + v / 2]));
    }
  }
};

TARGET_AVX2 INLINE float sum_lanes_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <class D, int R>
TARGET_AVX2 void tile_avx2(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  __m256 acc[R][2];
  for (auto& row : acc) row[0] = row[1] = _mm256_setzero_ps();
  const float* rows[R];
  a.rows(r0, rows);
  alignas(32) ScaleBuffer scales;
  D decoder;
  for (int64_t first = 0; first < a.blocks; first += kScaleBlocks) {
    const int64_t end = std::min(a.blocks, first + kScaleBlocks);
    for (int64_t b = first; b < end; ++b) D::scales(w_row + b * D::bytes, scales[b - first]);
    through_memory(scales);
    for (int64_t b = first; b < end; ++b) {
      const uint8_t* block = w_row + b * D::bytes;
      prefetch_ahead<D::bytes>(block);
      for (int j = 0; j < kGroups; ++j) {
        __m256 w[8];
        decoder.group(block, j, scales[b - first], w);
        for (int r = 0; r < R; ++r) {
          const float* x = rows[r] + b * kSuperWeights + 64 * j;
          for (int v = 0; v < 8; ++v) acc[r][v & 1] = _mm256_fmadd_ps(w[v], _mm256_loadu_ps(x + 8 * v), acc[r][v & 1]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = sum_lanes_avx2(_mm256_add_ps(acc[r][0], acc[r][1]));
}

template <class D> TARGET_AVX2 void dequantize_avx2(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  alignas(32) float scale[16];
  D decoder;
  for (int64_t b = 0; b < rows * blocks; ++b, out += kSuperWeights) {
    const uint8_t* block = w + b * D::bytes;
    D::scales(block, scale);
    for (int j = 0; j < kGroups; ++j) {
      __m256 v[8];
      decoder.group(block, j, scale, v);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + 64 * j + 8 * i, v[i]);
    }
  }
}

// ---- AVX-512: each group of 64 weights as 4 vectors of 16, into 4 accumulators per row (vector i into i)

struct Q4KAvx512 {
  static constexpr int64_t bytes = kQ4KBytes;

  // d * sc (scale[0..7]) and dmin * m (scale[8..15])
  TARGET_AVX512 static INLINE void scales(const uint8_t* block, float* scale) {
    alignas(16) uint8_t six[16];
    q4k_six_bits(block + 4, six);
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(six));
    const __m512 integers = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(packed));
    const __m512 d = _mm512_mask_mov_ps(_mm512_set1_ps(half_f16c(block)), 0xFF00,
                                        _mm512_set1_ps(half_f16c(block + 2)));
    _mm512_store_ps(scale, _mm512_mul_ps(integers, d));
  }

  // per sub-block its 16 possible weights (v * (d sc) - dmin m, one FMA: gguf's bits), then vpermps picks
  // each weight by the low 4 bits of its byte (the low nibble) or of the byte shifted down by 4
  TARGET_AVX512 INLINE void group(const uint8_t* block, int j, const float* scale, __m512 (&w)[4]) {
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 lo = _mm512_fmsub_ps(values, _mm512_set1_ps(scale[2 * j]), _mm512_set1_ps(scale[8 + 2 * j]));
    const __m512 hi = _mm512_fmsub_ps(values, _mm512_set1_ps(scale[2 * j + 1]), _mm512_set1_ps(scale[9 + 2 * j]));
    const uint8_t* qs = block + 16 + 32 * j;
    const __m512i first = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m512i second = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
    w[0] = _mm512_permutexvar_ps(first, lo);
    w[1] = _mm512_permutexvar_ps(second, lo);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(first, 4), hi);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(second, 4), hi);
  }
};

// Q4_K's scales; per sub-block its 32 possible weights in two vectors (v * (d sc) - dmin m, one FMA each), and
// vpermt2ps picks each weight by its 5 bits: the nibble, and bit 4 (the table) from qh
struct Q5KAvx512 {
  static constexpr int64_t bytes = kQ5KBytes;

  TARGET_AVX512 static INLINE void scales(const uint8_t* block, float* scale) { Q4KAvx512::scales(block, scale); }

  TARGET_AVX512 INLINE void group(const uint8_t* block, int j, const float* scale, __m512 (&w)[4]) {
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 upper = _mm512_add_ps(values, _mm512_set1_ps(16));
    const __m512 d_lo = _mm512_set1_ps(scale[2 * j]), m_lo = _mm512_set1_ps(scale[8 + 2 * j]);
    const __m512 d_hi = _mm512_set1_ps(scale[2 * j + 1]), m_hi = _mm512_set1_ps(scale[9 + 2 * j]);
    const __m512 lo0 = _mm512_fmsub_ps(values, d_lo, m_lo), lo1 = _mm512_fmsub_ps(upper, d_lo, m_lo);
    const __m512 hi0 = _mm512_fmsub_ps(values, d_hi, m_hi), hi1 = _mm512_fmsub_ps(upper, d_hi, m_hi);
    const uint8_t *qs = block + 48 + 32 * j, *qh = block + 16;
    const __m128i shift = _mm_cvtsi32_si128(2 * j);
    const __m512i low4 = _mm512_set1_epi32(15), bit4 = _mm512_set1_epi32(16);
    for (int half = 0; half < 2; ++half) {
      const __m512i bytes16 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * half)));
      const __m512i high16 = _mm512_srl_epi32(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * half))), shift);
      const __m512i lo = _mm512_or_si512(_mm512_and_si512(bytes16, low4),
                                         _mm512_and_si512(_mm512_slli_epi32(high16, 4), bit4));
      const __m512i hi = _mm512_or_si512(_mm512_srli_epi32(bytes16, 4),
                                         _mm512_and_si512(_mm512_slli_epi32(high16, 3), bit4));
      w[half] = _mm512_permutex2var_ps(lo0, lo, lo1);
      w[2 + half] = _mm512_permutex2var_ps(hi0, hi, hi1);
    }
  }
};

struct Q6KAvx512 {
  static constexpr int64_t bytes = kQ6KBytes;
  __m512i q[2];  // one half's integers q - 32, in weight order (kept in registers: stored and read back,
                 // they were slower at 16 rows)

  // d * scales[g] (scale[g])
  TARGET_AVX512 static INLINE void scales(const uint8_t* block, float* scale) {
    const __m512i scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)));
    _mm512_store_ps(scale, _mm512_mul_ps(_mm512_set1_ps(half_f16c(block + 208)), _mm512_cvtepi32_ps(scales)));
  }

  // weights 128 h .. 128 h + 127, 64 at a time: ql's 64 bytes with qh's 32 and qh's 32 shifted down 2
  // (s = 0, 1: low nibbles; s = 2, 3: high nibbles)
  TARGET_AVX512 INLINE void half(const uint8_t* block, int h) {
    const __m512i ql = _mm512_loadu_si512(block + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
    const __m512i pairs = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
    const __m512i first = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                          _mm512_and_si512(_mm512_slli_epi16(pairs, 4), bits45));
    const __m512i second = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                           _mm512_and_si512(pairs, bits45));
    q[0] = _mm512_sub_epi8(first, bias);
    q[1] = _mm512_sub_epi8(second, bias);
  }

  TARGET_AVX512 INLINE void group(const uint8_t* block, int j, const float* scale, __m512 (&w)[4]) {
    if ((j & 1) == 0) half(block, j / 2);
    const __m512i quants = q[j & 1];
    const __m128i sixteen[4] = {_mm512_castsi512_si128(quants), _mm512_extracti32x4_epi32(quants, 1),
                                _mm512_extracti32x4_epi32(quants, 2), _mm512_extracti32x4_epi32(quants, 3)};
    for (int i = 0; i < 4; ++i)
      w[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen[i])), _mm512_set1_ps(scale[4 * j + i]));
  }
};

template <class D, int R>
TARGET_AVX512 void tile_avx512(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride) {
  __m512 acc[R][4];
  for (auto& row : acc)
    for (__m512& v : row) v = _mm512_setzero_ps();
  const float* rows[R];
  a.rows(r0, rows);
  alignas(64) ScaleBuffer scales;
  D decoder;
  for (int64_t first = 0; first < a.blocks; first += kScaleBlocks) {
    const int64_t end = std::min(a.blocks, first + kScaleBlocks);
    for (int64_t b = first; b < end; ++b) D::scales(w_row + b * D::bytes, scales[b - first]);
    through_memory(scales);
    for (int64_t b = first; b < end; ++b) {
      const uint8_t* block = w_row + b * D::bytes;
      prefetch_ahead<D::bytes>(block);
      for (int j = 0; j < kGroups; ++j) {
        __m512 w[4];
        decoder.group(block, j, scales[b - first], w);
        for (int r = 0; r < R; ++r) {
          const float* x = rows[r] + b * kSuperWeights + 64 * j;
          for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_fmadd_ps(w[i], _mm512_loadu_ps(x + 16 * i), acc[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                                         _mm512_add_ps(acc[r][2], acc[r][3])));
}

template <class D> TARGET_AVX512 void dequantize_avx512(const uint8_t* w, int64_t rows, int64_t blocks, float* out) {
  alignas(64) float scale[16];
  D decoder;
  for (int64_t b = 0; b < rows * blocks; ++b, out += kSuperWeights) {
    const uint8_t* block = w + b * D::bytes;
    D::scales(block, scale);
    for (int j = 0; j < kGroups; ++j) {
      __m512 v[4];
      decoder.group(block, j, scale, v);
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + 64 * j + 16 * i, v[i]);
    }
  }
}

// ---- picking the path

using Tile = void (*)(const uint8_t* w_row, const Rows& a, int64_t r0, float* y, int64_t y_stride);
using Tiles = std::array<Tile, kTileRows>;  // [rows - 1]
using DequantizeRows = void (*)(const uint8_t* w, int64_t rows, int64_t blocks, float* out);

static_assert(kTileRows == 4, "tiles_for lists one tile per row count");
template <KType Q, class Avx2, class Avx512> Tiles tiles_for(Path path) {
  switch (path) {
    case Path::avx512: return {tile_avx512<Avx512, 1>, tile_avx512<Avx512, 2>, tile_avx512<Avx512, 3>,
                               tile_avx512<Avx512, 4>};
    case Path::avx2: return {tile_avx2<Avx2, 1>, tile_avx2<Avx2, 2>, tile_avx2<Avx2, 3>, tile_avx2<Avx2, 4>};
    case Path::plain: break;
  }
  return {tile_plain<Q, 1>, tile_plain<Q, 2>, tile_plain<Q, 3>, tile_plain<Q, 4>};
}

template <KType Q, class Avx2, class Avx512> DequantizeRows dequantize_for(Path path) {
  switch (path) {
    case Path::avx512: return dequantize_avx512<Avx512>;
    case Path::avx2: return dequantize_avx2<Avx2>;
    case Path::plain: break;
  }
  return dequantize_plain<Q>;
}

}  // namespace

namespace flotilla::kquants {

int64_t block_bytes(int64_t qtype) {
  switch (static_cast<KType>(qtype)) {
    case KType::Q4_K: return kQ4KBytes;
    case KType::Q5_K: return kQ5KBytes;
    case KType::Q6_K: return kQ6KBytes;
  }
  return 0;
}

// x [m, k] float32 @ dequantize(w [n, k / 256 * bytes]).T into y [m, n]; qtype Q4_K, Q5_K or Q6_K, k % 256 == 0
void matmul(int64_t qtype, const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, float* y, Path path) {
  const KType type = static_cast<KType>(qtype);
  const Tiles tiles = type == KType::Q4_K   ? tiles_for<KType::Q4_K, Q4KAvx2, Q4KAvx512>(path)
                      : type == KType::Q5_K ? tiles_for<KType::Q5_K, Q5KAvx2, Q5KAvx512>(path)
                                            : tiles_for<KType::Q6_K, Q6KAvx2, Q6KAvx512>(path);
  const Rows a{x, k, k / kSuperWeights};
  const int64_t row_bytes = a.blocks * block_bytes(qtype);
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

// rows of w [rows, k / 256 * bytes] into out [rows, k] float32, gguf.quants.dequantize's bits
void dequantize(int64_t qtype, const uint8_t* w, int64_t rows, int64_t k, float* out, Path path) {
  const KType type = static_cast<KType>(qtype);
  const DequantizeRows run_rows = type == KType::Q4_K   ? dequantize_for<KType::Q4_K, Q4KAvx2, Q4KAvx512>(path)
                                  : type == KType::Q5_K ? dequantize_for<KType::Q5_K, Q5KAvx2, Q5KAvx512>(path)
                                                        : dequantize_for<KType::Q6_K, Q6KAvx2, Q6KAvx512>(path);
  const int64_t blocks = k / kSuperWeights, row_bytes = blocks * block_bytes(qtype);
  const int64_t chunks = (rows + kDequantizeChunkRows - 1) / kDequantizeChunkRows;
  #pragma omp parallel for schedule(static) if (rows * k >= kMinParallelWeights)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kDequantizeChunkRows, count = std::min(kDequantizeChunkRows, rows - first);
    run_rows(w + first * row_bytes, count, blocks, out + first * k);
  }
}

}  // namespace flotilla::kquants
