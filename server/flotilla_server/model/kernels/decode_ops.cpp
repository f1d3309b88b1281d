// The small float32 ops around a decode step's matmuls and attention (model/llama.py calls them through
// model/decode_ops.py; scripts/build_kernels.py builds them into the kernels' one library):
//   rms_norm(x [rows, dim], weight [dim], eps) -> [rows, dim]: x * rsqrt(mean(x^2) + eps) * weight, as
//     F.rms_norm up to float rounding;
//   add_rms_norm(h [rows, dim] (in place), x, weight, eps) -> [rows, dim]: h += x (torch's bits), then
//     rms_norm(h): a layer's residual add and the next norm in one pass;
//   silu_mul(gate_up [rows, 2 * inter]) -> [rows, inter]: silu(gate) * up, as F.silu(gate) * up up to the
//     rounding of exp (within 2 ulp);
//   rope_kv_write(qkv [T, (heads + 2 kv_heads) * d] (in place), cos [T, d], sin [T, d], k_pool, v_pool,
//     slots [T], heads, kv_heads): rotates every q and k head of the fused projection's output in place
//     (rotate_half's layout, with torch's bits: each product rounded, then the sum) and copies each token's
//     k and v heads to row slots[t] of the layer's pools [num_slots, kv_heads, d].
//
// Why: at batch 1 these are ops of a few hundred floats each, so each torch op's dispatch and allocation
// outweighs its arithmetic. On this project's 2-core Xeon VM (family 6 model 167), SmolLM2-135M's shapes at
// one row, 2 threads: a residual add and F.rms_norm 8.6 us (add_rms_norm 2.2), F.rms_norm 7.7 (2.0),
// silu(gate) * up 3.8 (2.1), RoPE by cat/mul/add and kv.write's two index_copy_ 17.0 (rope_kv_write 2.0):
// each op here is mostly torch's dispatch.
//
// Rules:
// - a row's result depends on that row only, computed by one thread in a fixed order: the same bits on any
//   thread count and batch; rows are split over torch's OpenMP threads from kParallelFloats floats;
// - rms_norm, add_rms_norm and silu_mul follow the kernels' instruction set (decode_simd.h, active_lanes):
//   AVX-512, AVX2 or SSE2 lanes, whose sums differ by float rounding only;
// - rope_kv_write is compiled for baseline x86-64 only, so no product is fused into an FMA: its bits are
//   torch's on every CPU, and its work (a few thousand floats a token) needs no wider path.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "decode_simd.h"

namespace flotilla::decode {

namespace {

constexpr int64_t kParallelFloats = 1 << 16;

void check_rows(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() >= 1,
              op, ": ", name, " must be a contiguous float32 CPU tensor");
}

Lanes best_lanes() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return Lanes::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Lanes::avx2;
  return Lanes::sse2;
}

const Lanes kBestLanes = best_lanes();

// kernel_isa's names (scalar, avx2, avx512, avx512_vnni) as lanes; an unknown name: the CPU's best
Lanes lanes_named(const char* isa) {
  const std::string name = isa == nullptr ? "" : isa;
  if (name == "scalar") return Lanes::sse2;
  if (name == "avx2") return Lanes::avx2;
  return Lanes::avx512;
}

using KernelIsa = c10::TypedOperatorHandle<std::string(const std::string&)>;

std::optional<KernelIsa> find_kernel_isa() {
  const auto op = c10::Dispatcher::singleton().findSchema({"flotilla::kernel_isa", ""});
  if (!op.has_value()) return std::nullopt;
  return op->typed<std::string(const std::string&)>();
}

}  // namespace

Lanes active_lanes() {
  // looked up on first use: quant_matmul.cpp registers the op in its own static initialisers
  static const std::optional<KernelIsa> kernel_isa = find_kernel_isa();
  static const Lanes from_env = lanes_named(std::getenv("FLOTILLA_KERNEL_ISA"));
  const Lanes wanted = kernel_isa.has_value() ? lanes_named(kernel_isa->call(std::string()).c_str()) : from_env;
  return static_cast<Lanes>(std::min(static_cast<int>(wanted), static_cast<int>(kBestLanes)));
}

// ---- rope_kv_write (baseline x86-64 only: see the rules above)

namespace {

// x[i] * cos[i] + rotated[i] * sin[i], rotated = (-x[half:], x[:half]): each product rounded, then the sum
void rotate_head(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] + -b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

}  // namespace

void rope_kv_write(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_pool,
                   const at::Tensor& v_pool, const at::Tensor& slots, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1,
              "rope_kv_write: qkv must be a float32 CPU tensor [tokens, width] with unit column stride");
  check_rows("rope_kv_write", cos, "cos");
  check_rows("rope_kv_write", sin, "sin");
  check_rows("rope_kv_write", k_pool, "k_pool");
  check_rows("rope_kv_write", v_pool, "v_pool");
  const int64_t tokens = qkv.size(0), d = cos.size(-1), kv_width = kv_heads * d;
  TORCH_CHECK(d % 2 == 0 && heads > 0 && kv_heads > 0 && qkv.size(1) == (heads + 2 * kv_heads) * d,
              "rope_kv_write: qkv ", qkv.sizes(), " is not ", heads, " + 2 * ", kv_heads, " heads of ", d);
  TORCH_CHECK(cos.numel() == tokens * d && sin.numel() == tokens * d, "rope_kv_write: cos and sin must hold [",
              tokens, ", ", d, "]");
  TORCH_CHECK(k_pool.dim() == 3 && k_pool.size(1) == kv_heads && k_pool.size(2) == d &&
              v_pool.sizes() == k_pool.sizes(), "rope_kv_write: pools ", k_pool.sizes(), ", ", v_pool.sizes(),
              " are not [slots, ", kv_heads, ", ", d, "]");
  TORCH_CHECK(slots.device().is_cpu() && slots.scalar_type() == at::kLong && slots.is_contiguous() &&
              slots.numel() == tokens, "rope_kv_write: slots must be int64 [", tokens, "]");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < k_pool.size(0), "rope_kv_write: slot ", slot[t], " is outside the pool");
  float* base = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kp = k_pool.data_ptr<float>(), *vp = v_pool.data_ptr<float>();
  const int64_t row_stride = qkv.stride(0);
  #pragma omp parallel for schedule(static) if (tokens > 1 && tokens * qkv.size(1) >= kParallelFloats)
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = base + t * row_stride;
    for (int64_t h = 0; h < heads + kv_heads; ++h) rotate_head(row + h * d, cp + t * d, sp + t * d, d / 2);
    std::memcpy(kp + slot[t] * kv_width, row + heads * d, kv_width * sizeof(float));
    std::memcpy(vp + slot[t] * kv_width, row + (heads + kv_heads) * d, kv_width * sizeof(float));
  }
}

}  // namespace flotilla::decode

namespace {

using namespace flotilla::decode;

// ---- rms_norm and add_rms_norm: one row; h == nullptr: norm of x; else h += x, then norm of h

template <int W>
INLINE void norm_row(float* h, const float* x, const float* weight, float* y, int64_t dim, float eps) {
  const float* src = h == nullptr ? x : h;
  VecF<W> acc = splat<W>(0.f);
  int64_t j = 0;
  for (; j + W <= dim; j += W) {
    VecF<W> v = load<W>(x + j);
    if (h != nullptr) {
      v = load<W>(h + j) + v;
      store<W>(h + j, v);
    }
    acc += v * v;
  }
  float squares = sum_lanes<W>(acc);
  for (; j < dim; ++j) {
    const float v = h == nullptr ? x[j] : (h[j] = h[j] + x[j]);
    squares += v * v;
  }
  const float inverse = 1.f / std::sqrt(squares / static_cast<float>(dim) + eps);
  j = 0;
  for (; j + W <= dim; j += W) store<W>(y + j, load<W>(src + j) * splat<W>(inverse) * load<W>(weight + j));
  for (; j < dim; ++j) y[j] = src[j] * inverse * weight[j];
}

// one row per call: the threads' loop stays outside the targeted functions (OpenMP outlines a loop body into a
// function of its own, without the enclosing function's target)
using NormRow = void (*)(float*, const float*, const float*, float*, int64_t, float);
TARGET_AVX512 void norm_row_avx512(float* h, const float* x, const float* w, float* y, int64_t d, float eps) {
  norm_row<16>(h, x, w, y, d, eps);
}
TARGET_AVX2 void norm_row_avx2(float* h, const float* x, const float* w, float* y, int64_t d, float eps) {
  norm_row<8>(h, x, w, y, d, eps);
}
void norm_row_sse2(float* h, const float* x, const float* w, float* y, int64_t d, float eps) {
  norm_row<4>(h, x, w, y, d, eps);
}

NormRow norm_row_for(Lanes lanes) {
  switch (lanes) {
    case Lanes::avx512: return norm_row_avx512;
    case Lanes::avx2: return norm_row_avx2;
    case Lanes::sse2: break;
  }
  return norm_row_sse2;
}

at::Tensor norm(const char* op, float* h, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(op, x, "x");
  check_rows(op, weight, "weight");
  const int64_t dim = x.size(-1), rows = dim == 0 ? 0 : x.numel() / dim;
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim, op, ": weight ", weight.sizes(), " does not match x ",
              x.sizes());
  at::Tensor y = at::empty_like(x);
  const NormRow run = norm_row_for(active_lanes());
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  #pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kParallelFloats)
  for (int64_t r = 0; r < rows; ++r)
    run(h == nullptr ? nullptr : h + r * dim, xp + r * dim, wp, yp + r * dim, dim, static_cast<float>(eps));
  return y;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return norm("rms_norm", nullptr, x, weight, eps);
}

at::Tensor add_rms_norm(const at::Tensor& h, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows("add_rms_norm", h, "h");
  TORCH_CHECK(h.sizes() == x.sizes(), "add_rms_norm: h ", h.sizes(), " and x ", x.sizes(), " differ");
  return norm("add_rms_norm", h.data_ptr<float>(), x, weight, eps);
}

// ---- silu_mul

template <int W> INLINE void silu_mul_row(const float* gate, const float* up, float* y, int64_t n) {
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const VecF<W> g = load<W>(gate + j);
    store<W>(y + j, g / (splat<W>(1.f) + exp_lanes<W>(-g)) * load<W>(up + j));
  }
  for (; j < n; ++j) {
    const VecF<1> g = load<1>(gate + j);
    y[j] = (g / (splat<1>(1.f) + exp_lanes<1>(-g)))[0] * up[j];
  }
}

using SiluMulRow = void (*)(const float*, const float*, float*, int64_t);
TARGET_AVX512 void silu_mul_avx512(const float* g, const float* u, float* y, int64_t n) {
  silu_mul_row<16>(g, u, y, n);
}
TARGET_AVX2 void silu_mul_avx2(const float* g, const float* u, float* y, int64_t n) { silu_mul_row<8>(g, u, y, n); }
void silu_mul_sse2(const float* g, const float* u, float* y, int64_t n) { silu_mul_row<4>(g, u, y, n); }

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows("silu_mul", gate_up, "gate_up");
  const int64_t width = gate_up.size(-1), n = width / 2, rows = width == 0 ? 0 : gate_up.numel() / width;
  TORCH_CHECK(width % 2 == 0, "silu_mul: the last dimension (", width, ") must be even: gate, then up");
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = n;
  at::Tensor y = at::empty(shape, gate_up.options());
  if (rows == 0 || n == 0) return y;
  SiluMulRow run = silu_mul_sse2;
  switch (active_lanes()) {
    case Lanes::avx512: run = silu_mul_avx512; break;
    case Lanes::avx2: run = silu_mul_avx2; break;
    case Lanes::sse2: break;
  }
  const float* gp = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  #pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kParallelFloats)
  for (int64_t r = 0; r < rows; ++r) run(gp + 2 * r * n, gp + (2 * r + 1) * n, yp + r * n, n);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flotilla, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) h, Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rope_kv_write(Tensor(a!) qkv, Tensor cos, Tensor sin, Tensor(b!) k_pool, Tensor(c!) v_pool, Tensor slots, "
        "int heads, int kv_heads) -> ()");
}

TORCH_LIBRARY_IMPL(flotilla, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("add_rms_norm", add_rms_norm);
  m.impl("silu_mul", silu_mul);
  m.impl("rope_kv_write", flotilla::decode::rope_kv_write);
}
