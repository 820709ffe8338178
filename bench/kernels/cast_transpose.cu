// FP8 cast-transpose lab: times the cast-transpose kernel (ops/cuda/fp8_cast_transpose.cuh, the
// kernel behind fp8_quantize_transpose and the fused SwiGLU, RoPE and norm casts) in several tile
// shapes on the llama-3b shapes it runs on in training (activations 4096 x 3072, the fc1 and fc2
// weights, SwiGLU's 4096 x 2 x 8192 gradient), bf16 -> e4m3 with q and q_t written and amax taken,
// beside a device-to-device copy of the same bytes as the ceiling, and the two-output path
// (SwiGLU's backward: dgate and dup from one kernel) on the tensor as two column blocks. Prints
// microseconds per call (median of 20 CUDA-event timings after 3 warm-ups) and the bandwidth
// counting bytes read and written, and checks that every shape writes the same bytes as the
// shipped one (DefaultCastTile).
//
// Build from the repository root, after building the library into build/<dir>:
//   nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -Isrc bench/kernels/cast_transpose.cu \
//        build/<dir>/libmegatron.a -o build/cast_transpose_bench
// Run: build/cast_transpose_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "megatron/ops/cuda/fp8_cast_transpose.cuh"

namespace {

using megatron::ops::cuda::fp8::CastTile;
using megatron::ops::cuda::fp8::PlainSource;
using Source = PlainSource<__nv_bfloat16>;

// x (rows, 2 cols) as two column blocks: the two-output path (SwiGLU's backward casts dgate and
// dup so), which writes the same bytes as the plain cast of x.
struct SplitSource {
  static constexpr int kOutputs = 2;
  const __nv_bfloat16* x;
  int64_t cols;  // of one block
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[2][8]) const {
    for (int o = 0; o < 2; ++o) megatron::ops::cuda::load_floats<8>(x + r * 2 * cols + o * cols + c, v[o]);
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[2]) const {
    for (int o = 0; o < 2; ++o) v[o] = __bfloat162float(x[r * 2 * cols + o * cols + c]);
  }
};

#define LAB_CHECK(call)                                                                             \
  do {                                                                                              \
    const cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

// Median microseconds of fn over 20 timed calls after 3 warm-ups.
double median_us(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  LAB_CHECK(cudaEventCreate(&start));
  LAB_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    LAB_CHECK(cudaEventRecord(start));
    fn();
    LAB_CHECK(cudaEventRecord(stop));
    LAB_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LAB_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1e3 * ms);
  }
  LAB_CHECK(cudaEventDestroy(start));
  LAB_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Buffers {
  __nv_bfloat16* x;
  __nv_fp8_storage_t *q, *q_t;
  float *amax, *scale;
};

// cols: of the whole tensor; split: as SplitSource's two blocks.
template <class Tile>
void launch(const Buffers& b, int64_t rows, int64_t cols, bool split = false) {
  namespace fp8 = megatron::ops::cuda::fp8;
  const int64_t block_cols = split ? cols / 2 : cols;
  const dim3 grid(unsigned((block_cols + Tile::kCols - 1) / Tile::kCols),
                  unsigned((rows + Tile::kRows - 1) / Tile::kRows));
  if (split)
    fp8::cast_transpose_kernel<SplitSource, Tile><<<grid, Tile::template threads<2>()>>>(
        SplitSource{b.x, block_cols}, b.q, b.q_t, b.amax, b.scale, rows, block_cols, true, true, __NV_E4M3);
  else
    fp8::cast_transpose_kernel<Source, Tile><<<grid, Tile::template threads<1>()>>>(
        Source{b.x, cols}, b.q, b.q_t, b.amax, b.scale, rows, cols, true, true, __NV_E4M3);
  LAB_CHECK(cudaGetLastError());
}

template <class Tile>
void time_shape(const char* name, const Buffers& b, int64_t rows, int64_t cols, const std::vector<uint8_t>& shipped_q,
                const std::vector<uint8_t>& shipped_q_t, bool split = false) {
  const size_t n = size_t(rows * cols);
  LAB_CHECK(cudaMemset(b.q, 0, n));
  LAB_CHECK(cudaMemset(b.q_t, 0, n));
  launch<Tile>(b, rows, cols, split);
  std::vector<uint8_t> q(n), q_t(n);
  LAB_CHECK(cudaMemcpy(q.data(), b.q, n, cudaMemcpyDeviceToHost));
  LAB_CHECK(cudaMemcpy(q_t.data(), b.q_t, n, cudaMemcpyDeviceToHost));
  const bool same = shipped_q.empty() || (q == shipped_q && q_t == shipped_q_t);
  const double us = median_us([&] { launch<Tile>(b, rows, cols, split); });
  std::printf("  %-22s %8.1f us %6.2f TB/s %s\n", name, us, double(n) * 4 / us * 1e-6, same ? "" : "BYTES DIFFER");
}

}  // namespace

int main() {
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 3072}, {16384, 3072}, {3072, 8192}, {4096, 16384}};
  for (const auto& [rows, cols] : shapes) {
    const size_t n = size_t(rows * cols);
    std::vector<__nv_bfloat16> host(n);
    uint32_t state = 12345;
    for (auto& v : host) {
      state = state * 1664525u + 1013904223u;
      v = __float2bfloat16(float(int(state >> 8) % 20001 - 10000) * 1e-3f);
    }
    Buffers b{};
    LAB_CHECK(cudaMalloc(&b.x, n * 2));
    LAB_CHECK(cudaMalloc(&b.q, n));
    LAB_CHECK(cudaMalloc(&b.q_t, n));
    LAB_CHECK(cudaMalloc(&b.amax, 4));
    LAB_CHECK(cudaMalloc(&b.scale, 4));
    LAB_CHECK(cudaMemcpy(b.x, host.data(), n * 2, cudaMemcpyHostToDevice));
    const float scale = 20.0f;
    LAB_CHECK(cudaMemcpy(b.scale, &scale, 4, cudaMemcpyHostToDevice));
    LAB_CHECK(cudaMemset(b.amax, 0, 4));
    std::printf("%lld x %lld bf16 -> e4m3, q and q_t (%.1f MB moved)\n", (long long)rows, (long long)cols,
                double(n) * 4 * 1e-6);
    void* copy = nullptr;
    LAB_CHECK(cudaMalloc(&copy, n * 2));
    const double copy_us = median_us([&] { LAB_CHECK(cudaMemcpyAsync(copy, b.x, n * 2, cudaMemcpyDeviceToDevice)); });
    std::printf("  %-22s %8.1f us %6.2f TB/s\n", "copy of 2 bytes/elt", copy_us, double(n) * 4 / copy_us * 1e-6);
    LAB_CHECK(cudaFree(copy));
    std::vector<uint8_t> shipped_q(n), shipped_q_t(n);
    launch<megatron::ops::cuda::fp8::DefaultCastTile>(b, rows, cols);
    LAB_CHECK(cudaMemcpy(shipped_q.data(), b.q, n, cudaMemcpyDeviceToHost));
    LAB_CHECK(cudaMemcpy(shipped_q_t.data(), b.q_t, n, cudaMemcpyDeviceToHost));
    time_shape<CastTile<64, 64>>("tile 64 x 64", b, rows, cols, shipped_q, shipped_q_t);
    time_shape<CastTile<128, 64>>("tile 128 x 64", b, rows, cols, shipped_q, shipped_q_t);
    time_shape<CastTile<64, 128>>("tile 64 x 128", b, rows, cols, shipped_q, shipped_q_t);
    time_shape<CastTile<128, 128>>("tile 128 x 128", b, rows, cols, shipped_q, shipped_q_t);
    time_shape<CastTile<256, 64>>("tile 256 x 64", b, rows, cols, shipped_q, shipped_q_t);
    time_shape<CastTile<64, 64>>("two blocks, 64 x 64", b, rows, cols, shipped_q, shipped_q_t, true);
    time_shape<CastTile<128, 64>>("two blocks, 128 x 64", b, rows, cols, shipped_q, shipped_q_t, true);
    LAB_CHECK(cudaFree(b.x));
    LAB_CHECK(cudaFree(b.q));
    LAB_CHECK(cudaFree(b.q_t));
    LAB_CHECK(cudaFree(b.amax));
    LAB_CHECK(cudaFree(b.scale));
  }
  return 0;
}
