// Shared by decode_ops.cpp and decode_attention.cpp: float vectors of W lanes written once with GCC's vector
// extensions, and the instruction set the decode ops run on.
//
// Why vector extensions rather than intrinsics: a template on the lane count compiles for each instruction set
// from one source. The kernels are INLINE templates without a target; each is instantiated inside a small
// wrapper that carries the target (TARGET_AVX512 with W = 16, TARGET_AVX2 with W = 8, none with W = 4: SSE2,
// baseline x86-64), and GCC lowers the vector code with the wrapper's instructions. Intrinsics would need the
// target on the template itself, and GCC gives a template one target for all its instantiations.
//
// Rules:
// - a sum over lanes (`sum_lanes`, `sums_of_lanes`) adds halves in a fixed tree, so a result depends on W but
//   never on threads;
// - `exp_lanes` is Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial), within 2 ulp of
//   expf for x in [-87.3, 88.3] (clamped to that range: exp(-87.3) is 1.2e-38, still a normal float).
#pragma once

#include <ATen/ATen.h>
#include <xmmintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#define INLINE inline __attribute__((always_inline))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace flotilla::decode {

// flush-to-zero and denormals-are-zero for the scope (MXCSR, this thread): a softmax weight near exp(-87)
// times a value is a denormal, and each denormal product took ~100 cycles: SmolLM2's attention over a pool
// of zeros and one written key ran 40x slower without this. Results change below 1.2e-38 only.
struct FlushDenormals {
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

// the lanes a path computes with: the instruction set's vector width in floats
enum class Lanes : int { sse2 = 4, avx2 = 8, avx512 = 16 };

// the instruction set of the decode ops now: torch.ops.flotilla.kernel_isa's (quant_matmul.cpp; scalar runs
// the SSE2 path), capped at what this CPU has; FLOTILLA_KERNEL_ISA when that op is missing
Lanes active_lanes();

// decode_ops.cpp's op: rotates qkv's q and k heads in place and writes k, v to the pools' rows `slots`
void rope_kv_write(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_pool,
                   const at::Tensor& v_pool, const at::Tensor& slots, int64_t heads, int64_t kv_heads);

template <int W> struct Vec {
  typedef float f __attribute__((vector_size(W * sizeof(float))));
  typedef int32_t i __attribute__((vector_size(W * sizeof(int32_t))));
};
template <int W> using VecF = typename Vec<W>::f;
template <int W> using VecI = typename Vec<W>::i;

template <int W> INLINE VecF<W> load(const float* p) {
  VecF<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <int W> INLINE void store(float* p, VecF<W> v) { std::memcpy(p, &v, sizeof v); }

// every lane x (-0 may become +0): a scalar operand, which GCC compiles to one broadcast; a braced list of x or
// a loop of lane stores became up to 16 masked broadcasts in a loop (GCC 12)
template <int W> INLINE VecF<W> splat(float x) { return VecF<W>{} + x; }

// the W lanes folded into one by `op`, halves first (a fixed tree: the same bits on every call)
template <int W, typename Op> INLINE float fold_lanes(VecF<W> v, Op op) {
  if constexpr (W == 1) {
    return v[0];
  } else {
    VecF<W / 2> low, high;
    std::memcpy(&low, &v, sizeof low);
    std::memcpy(&high, reinterpret_cast<const char*>(&v) + sizeof low, sizeof high);
    return fold_lanes<W / 2>(op(low, high), op);
  }
}

template <int W> INLINE float sum_lanes(VecF<W> v) {
  return fold_lanes<W>(v, [](auto a, auto b) { return a + b; });
}

template <int W> INLINE float max_lanes(VecF<W> v) {
  return fold_lanes<W>(v, [](auto a, auto b) { return a > b ? a : b; });
}

// sums_of_lanes: W vectors' lane sums as one vector (lane k: the sum of a[k]'s lanes), by a tree of
// log2(W) levels: at each, a pair of vectors holding G keys' P partial sums each become one vector holding
// 2G keys' P/2 sums (each key's first half of lanes plus its second half), in key order. 45 shuffles and adds
// for 16 keys, against 16 x 8 for sum_lanes one key at a time. A key's sum depends on its own lanes only.
constexpr int fold_index(int W, int P, int o) {
  const int half = P / 2, keys = W / P, key = o / half, lane = o % half;
  return key < keys ? key * P + lane : W + (key - keys) * P + lane;
}

template <int W, int P, size_t... O> INLINE VecF<W> fold(VecF<W> x, VecF<W> y, std::index_sequence<O...>) {
  return __builtin_shufflevector(x, y, fold_index(W, P, O)...) +
         __builtin_shufflevector(x, y, (fold_index(W, P, O) + P / 2)...);
}

template <int W, int P = W> INLINE VecF<W> sums_of_lanes(VecF<W>* a) {
  if constexpr (P == 1) {
    return a[0];
  } else {
    for (int m = 0; m < P / 2; ++m) a[m] = fold<W, P>(a[2 * m], a[2 * m + 1], std::make_index_sequence<W>());
    return sums_of_lanes<W, P / 2>(a);
  }
}

template <int W> INLINE VecF<W> max(VecF<W> a, VecF<W> b) { return a > b ? a : b; }

template <int W> INLINE VecF<W> exp_lanes(VecF<W> x) {
  x = max<W>(x, splat<W>(-87.3f));
  x = x < splat<W>(88.3f) ? x : splat<W>(88.3f);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (round to nearest in the default mode)
  const VecF<W> magic = splat<W>(12582912.f);
  const VecF<W> n = (x * splat<W>(1.44269504088896341f) + magic) - magic;
  VecF<W> r = x - n * splat<W>(0.693359375f);
  r = r - n * splat<W>(-2.12194440e-4f);
  VecF<W> p = splat<W>(1.9875691500e-4f);
  p = p * r + splat<W>(1.3981999507e-3f);
  p = p * r + splat<W>(8.3334519073e-3f);
  p = p * r + splat<W>(4.1665795894e-2f);
  p = p * r + splat<W>(1.6666665459e-1f);
  p = p * r + splat<W>(5.0000001201e-1f);
  p = p * (r * r) + r + splat<W>(1.f);
  // times 2^n: n + 127 into the exponent bits (n in -126..127 after the clamp)
  const VecI<W> bits = (__builtin_convertvector(n, VecI<W>) + 127) << 23;
  VecF<W> scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace flotilla::decode
