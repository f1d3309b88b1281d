// Q5_0's and Q5_1's blocks (ggml-common.h), shared by q5_matmul.cpp (their float-activation products and
// dequantize_blocks) and quant_matmul.cpp (their int16-activation products, Q4_0's and Q4_1's code): the
// layouts and the decoding of a block's 32 integers, in one place for both.
//
//   Q5_0, 22 bytes: fp16 d, uint32 qh, uint8 qs[16]; weight i < 16 is the low nibble of qs[i], weight 16 + i
//     its high nibble, each with bit i (or 16 + i) of qh as its fifth bit, q in 0..31; w = d * (q - 16)
//   Q5_1, 24 bytes: fp16 d, fp16 m, uint32 qh, uint8 qs[16]; q as Q5_0's; w = d * q + m
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

namespace flotilla::q5 {

// qh_at, qs_at: the byte offsets of the fifth bits and of the nibbles; offset: subtracted from q, so that
// w = d * (q - offset) + m (m: Q5_1's, at byte 2)
struct Q5_0Layout {
  static constexpr int64_t qtype = 6, bytes = 22, qh_at = 2, qs_at = 6;
  static constexpr int32_t offset = 16;
  static constexpr bool has_min = false;
};
struct Q5_1Layout {
  static constexpr int64_t qtype = 7, bytes = 24, qh_at = 4, qs_at = 8;
  static constexpr int32_t offset = 0;
  static constexpr bool has_min = true;
};

INLINE uint32_t fifth_bits(const uint8_t* block, int64_t qh_at) {
  uint32_t bits;
  std::memcpy(&bits, block + qh_at, sizeof bits);
  return bits;
}

// the block's 32 integers q - offset, in weight order
template <class L> INLINE void integers_plain(const uint8_t* block, int8_t q[32]) {
  const uint32_t qh = fifth_bits(block, L::qh_at);
  const uint8_t* qs = block + L::qs_at;
  for (int i = 0; i < 16; ++i) {
    q[i] = static_cast<int8_t>(((qs[i] & 15) | static_cast<int>(((qh >> i) & 1) << 4)) - L::offset);
    q[i + 16] = static_cast<int8_t>(((qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1) << 4)) - L::offset);
  }
}

// the same as bytes of one vector: the nibbles (the low ones of qs, then the high ones) OR 16 where qh has
// the weight's bit, less offset; qh's byte j broadcast to bytes 8 j .. 8 j + 7, each OR all bits but its own
// (bit i of byte 8 j + i), is all ones where that bit is set (llama.cpp's bytes_from_bits_32)
template <class L> TARGET_AVX2 INLINE __m256i integers_avx2(const uint8_t* block) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + L::qs_at));
  const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(fifth_bits(block, L::qh_at))),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE)),
                                        _mm256_set1_epi8(-1));
  const __m256i q = _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(16)));
  return L::offset != 0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(static_cast<char>(L::offset))) : q;
}

}  // namespace flotilla::q5
