// torch.ops.flotilla.lora_bgmv(x [T, in] f32, row_slots [T] i64, a [S, P*R, in] f32, b [S, R, out] f32,
//                              part_ends [P] i64, y [T, out] f32) -> (): adds each row's LoRA product in place,
// y[t, j] += sum_r (sum_i a[s, p*R + r, i] x[t, i]) b[s, r, j], with s = row_slots[t] (a row of slot -1, the
// base model, is left as it is) and p the part whose output columns hold j (part p: columns
// part_ends[p-1] .. part_ends[p]-1). model/lora_linear.py calls it for a step's rows (LoraSlots.add).
//
// Why: a step of 16 decode rows over 8 adapters took, per projection and adapter, a gather, three or four
// small products and a scatter in torch: about 60 us of operator overhead each, 26.6 ms a step on
// llama-100m (48 projections), where the arithmetic is a few microseconds. Here each slot's rows read its
// factors once (batched gather matrix-vector, "BGMV", as punica and vLLM's LoRA kernels do on GPUs): 13.6 ms,
// the time of reading 8 slots' 13 MB of float32 factors (one thread of the 2-core Xeon VM, family 6 model 167;
// model/lora_linear.py has the other row counts).
//
// Rules:
// - each output element is one thread's sum in a fixed order, so the result has the same bits on any thread
//   count, and a row's result does not depend on the other rows (their slots included);
// - rows are split over torch's OpenMP threads;
// - the path is picked at load from the CPU's features (AVX-512F, AVX2 with FMA, or plain C++), capped by
//   FLOTILLA_KERNEL_ISA (avx512, avx2, scalar) as the other kernels are; never -march=native.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace {

enum class Path : int { plain = 0, avx2 = 1, avx512 = 2 };
constexpr int64_t kChunkRows = 16;  // rows of one slot that share each read of its factors

Path pick_path() {
  Path best = Path::plain;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Path::avx2;
  if (__builtin_cpu_supports("avx512f")) best = Path::avx512;
  const char* wanted = std::getenv("FLOTILLA_KERNEL_ISA");
  if (wanted != nullptr) {
    if (std::strcmp(wanted, "scalar") == 0) return Path::plain;
    if (std::strcmp(wanted, "avx2") == 0 && best != Path::plain) return Path::avx2;
  }
  return best;
}

const Path kPath = pick_path();

float dot_plain(const float* a, const float* x, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * x[i + l];
  float sum = 0.f;
  for (int l = 0; l < 8; ++l) sum += lanes[l];
  for (; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* x, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(acc0, acc1));
  float sum = 0.f;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

__attribute__((target("avx512f,avx2,fma"))) float dot_avx512(const float* a, const float* x, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(x + i), acc0);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

// rows (at most kChunkRows of one slot) times that slot's factors: each row of A and of B is read once for
// all of them, while it is in L1 (a step's adapters' factors exceed the caches: read per row, they were read
// from memory once per row, 2x the time at 16 rows over 8 adapters)
template <class Dot, class Axpy>
void add_chunk_products(const float* x, const int64_t* rows, int64_t n, const float* a, const float* b,
                        const int64_t* part_ends, int64_t parts, int64_t rank, int64_t in, int64_t out, float* y,
                        float* xa, Dot dot, Axpy axpy) {
  const int64_t width = parts * rank;
  for (int64_t k = 0; k < width; ++k)
    for (int64_t i = 0; i < n; ++i) xa[i * width + k] = dot(a + k * in, x + rows[i] * in, in);
  int64_t begin = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t end = part_ends[p];
    for (int64_t r = 0; r < rank; ++r) {
      const float* b_row = b + r * out + begin;
      for (int64_t i = 0; i < n; ++i) {
        const float v = xa[i * width + p * rank + r];
        if (v != 0.f) axpy(v, b_row, y + rows[i] * out + begin, end - begin);
      }
    }
    begin = end;
  }
}

// y[j] += v * b[j]: plain loops the compiler vectorizes in each target (no reduction: no reassociation needed)
void axpy_plain(float v, const float* b, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += v * b[j];
}
__attribute__((target("avx2,fma"))) void axpy_avx2(float v, const float* b, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += v * b[j];
}
__attribute__((target("avx512f,avx2,fma"))) void axpy_avx512(float v, const float* b, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += v * b[j];
}

void lora_bgmv(const at::Tensor& x, const at::Tensor& row_slots, const at::Tensor& a, const at::Tensor& b,
               const at::Tensor& part_ends, at::Tensor y) {
  TORCH_CHECK(x.dim() == 2 && a.dim() == 3 && b.dim() == 3 && y.dim() == 2 && row_slots.dim() == 1,
              "lora_bgmv: x [T, in], row_slots [T], a [S, P*R, in], b [S, R, out], y [T, out]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                  y.scalar_type() == at::kFloat && row_slots.scalar_type() == at::kLong &&
                  part_ends.scalar_type() == at::kLong,
              "lora_bgmv: float32 x, a, b, y and int64 row_slots, part_ends");
  TORCH_CHECK(x.is_contiguous() && a.is_contiguous() && b.is_contiguous() && y.is_contiguous() &&
                  row_slots.is_contiguous() && part_ends.is_contiguous() && x.device().is_cpu(),
              "lora_bgmv: contiguous CPU tensors");
  const int64_t rows = x.size(0), in = x.size(1), slots = a.size(0), rank = b.size(1), out = b.size(2);
  const int64_t parts = part_ends.numel();
  TORCH_CHECK(a.size(2) == in && a.size(1) == parts * rank && b.size(0) == slots && y.size(0) == rows &&
                  y.size(1) == out && row_slots.size(0) == rows && parts > 0 &&
                  part_ends.data_ptr<int64_t>()[parts - 1] == out,
              "lora_bgmv: shapes do not agree");
  const float* xp = x.data_ptr<float>();
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const int64_t* sp = row_slots.data_ptr<int64_t>();
  const int64_t* ends = part_ends.data_ptr<int64_t>();
  float* yp = y.data_ptr<float>();
  for (int64_t t = 0; t < rows; ++t)
    TORCH_CHECK(sp[t] >= -1 && sp[t] < slots, "lora_bgmv: row ", t, "'s slot ", sp[t], " is outside -1..", slots - 1);
  // work: chunks of at most kChunkRows rows of one slot, in slot order, rows in step order within a slot
  std::vector<std::vector<int64_t>> by_slot(slots);
  for (int64_t t = 0; t < rows; ++t)
    if (sp[t] >= 0) by_slot[sp[t]].push_back(t);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (slot, first index into by_slot[slot])
  for (int64_t s = 0; s < slots; ++s)
    for (int64_t i = 0; i < static_cast<int64_t>(by_slot[s].size()); i += kChunkRows) chunks.emplace_back(s, i);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t first, int64_t last) {
    std::vector<float> xa(kChunkRows * parts * rank);
    for (int64_t c = first; c < last; ++c) {
      const auto [s, at] = chunks[c];
      const int64_t* chunk_rows = by_slot[s].data() + at;
      const int64_t n = std::min<int64_t>(kChunkRows, static_cast<int64_t>(by_slot[s].size()) - at);
      const float* a_slot = ap + s * parts * rank * in;
      const float* b_slot = bp + s * rank * out;
      switch (kPath) {
        case Path::avx512:
          add_chunk_products(xp, chunk_rows, n, a_slot, b_slot, ends, parts, rank, in, out, yp, xa.data(), dot_avx512,
                             axpy_avx512);
          break;
        case Path::avx2:
          add_chunk_products(xp, chunk_rows, n, a_slot, b_slot, ends, parts, rank, in, out, yp, xa.data(), dot_avx2,
                             axpy_avx2);
          break;
        default:
          add_chunk_products(xp, chunk_rows, n, a_slot, b_slot, ends, parts, rank, in, out, yp, xa.data(), dot_plain,
                             axpy_plain);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flotilla, m) {
  m.def("lora_bgmv(Tensor x, Tensor row_slots, Tensor a, Tensor b, Tensor part_ends, Tensor(a!) y) -> ()");
}

TORCH_LIBRARY_IMPL(flotilla, CPU, m) { m.impl("lora_bgmv", &lora_bgmv); }
