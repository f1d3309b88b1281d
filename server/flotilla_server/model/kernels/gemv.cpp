// torch.ops.flotilla.gemv_one_row(x [1, k] float32, w [n, k] float32 row-major) -> [1, n]: one row times a
// weight, for a decode step at batch 1 on CPU (model/native_gemv.py loads it; scripts/build_kernels.py builds it).
//
// Why: at one row a matmul reads every weight once and does one multiply-add per 4 bytes, so its speed is
// the memory read rate. MKL's one-row kernel ran on one core whatever the thread count on the AMD
// development machine and oneDNN's packed one read at ~60 % of what a plain streaming dot product reads
// (docs/benchmarks.md, "Single-stream speed").
//
// Rules:
// - each output element is one thread's dot product over k, summed in a fixed order (16 lanes, then the
//   lanes, then the tail), so the result has the same bits on any thread count;
// - rows are split over the threads of torch's OpenMP runtime, whose count torch.set_num_threads sets;
// - the AVX-512 or AVX2 path is chosen at run time from the CPU's features, so a build runs anywhere.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <immintrin.h>

namespace {

__attribute__((target("avx512f"))) float dot_avx512(const float* w, const float* x, int64_t k) {
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(x + j), acc);
  float s = _mm512_reduce_add_ps(acc);
  for (; j < k; ++j) s += w[j] * x[j];
  return s;
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* w, const float* x, int64_t k) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = 0.f;
  for (float lane : lanes) s += lane;
  for (; j < k; ++j) s += w[j] * x[j];
  return s;
}

float dot_plain(const float* w, const float* x, int64_t k) {
  float s = 0.f;
  for (int64_t j = 0; j < k; ++j) s += w[j] * x[j];
  return s;
}

using Dot = float (*)(const float*, const float*, int64_t);

Dot pick_dot() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return dot_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return dot_avx2;
  return dot_plain;
}

const Dot kDot = pick_dot();

at::Tensor gemv_one_row(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "gemv_one_row: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "gemv_one_row: float32 only");
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && w.dim() == 2 && x.size(1) == w.size(1),
              "gemv_one_row: x must be [1, k] and w [n, k], got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(w.is_contiguous(), "gemv_one_row: w must be row-major (contiguous)");
  const at::Tensor xc = x.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor y = at::empty({1, n}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // one static share of the rows per thread, on torch's OpenMP runtime (libgomp, which torch.set_num_threads
  // sets): at::parallel_for split the same rows too, but gained nothing from a second thread here
  // (llama-100m's 64 matrices: 17-20 ms on one thread or two, 14-15 ms with this loop on two)
  #pragma omp parallel for schedule(static) if (n >= 64)
  for (int64_t i = 0; i < n; ++i) yp[i] = kDot(wp + i * k, xp, k);
  return y;
}

}  // namespace

TORCH_LIBRARY(flotilla, m) { m.def("gemv_one_row(Tensor x, Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(flotilla, CPU, m) { m.impl("gemv_one_row", gemv_one_row); }
