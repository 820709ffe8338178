// Attention kernel lab: times ops::cuda::attention_forward / attention_backward on training
// shapes (bf16: the tensor-core flash kernels; f32: the generic kernels) and prints milliseconds
// and TFLOP/s, counted as FlashAttention does: forward 4 B NH S^2 HS (halved when causal),
// backward 2.5 times that. attention_sdpa.py beside this times PyTorch's SDPA on the same shapes.
//
// Build from the repository root, after building the library into build/<dir>:
//   nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -Isrc bench/kernels/attention.cu \
//        build/<dir>/libmegatron.a -lcublasLt -Xcompiler -fopenmp -o build/attention_bench
// Run: build/attention_bench
//
// Measured on one H100 80GB HBM3, 2026-11-21 (ms forward / backward; PyTorch 2.11 SDPA in the same run):
//   gpt2-124m  B16 S1024 NH12 HS64, causal      0.186 / 0.761   SDPA 0.122 / 0.407
//   llama-1b   B4 S2048 NH32 G8 HS64, causal    0.417 / 1.938   SDPA 0.228 / 0.710
//   hs128      B4 S2048 NH16 HS128, causal      0.415 / 1.583   SDPA 0.164 / 0.580
//   gpt2-124m with attention dropout 0.1        1.114 / 1.623   (one Philox per probability)
// Variants tried, linked in place of the library's object: forward with one 16-row m-tile per warp
// (64-row blocks): 0.214 / 0.509 / 0.459 ms forward, but 0.807 with dropout, where two m-tiles
// need 254 registers; backward with 32-query steps at HS 64: 0.812 / 2.128 ms, slower than 64.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/cuda/context.h"
#include "megatron/ops/cuda/cuda_check.h"
#include "megatron/ops/cuda/device.h"

using namespace megatron;

namespace {

struct Shape5 {
  const char* name;
  int64_t B, S, NH, G, HS;
  bool causal;
  float dropout;
};

// Random N(0,1) bf16/f32 values on the GPU (never zeros: they can run faster than real data).
Tensor random_gpu(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor host = Tensor::empty(shape, DType::f32);
  const CounterRng rng{seed, 1};
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = rng.normal(uint64_t(i));
  return host.to(dtype).to(Device::cuda(0));
}

// Median milliseconds of fn over `iters` runs after `warmup` runs, timed with events on the
// ops' stream.
double median_ms(const std::function<void()>& fn, int warmup = 3, int iters = 15) {
  cudaStream_t stream = cuda::current_stream();
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void bench(const Shape5& s, DType dtype) {
  const Shape qs{s.S, s.B, s.NH, s.HS}, kvs{s.S, s.B, s.G, s.HS};
  const Tensor q = random_gpu(qs, dtype, 1), k = random_gpu(kvs, dtype, 2), v = random_gpu(kvs, dtype, 3);
  const Tensor dout = random_gpu(qs, dtype, 4);
  Tensor out = Tensor::empty(qs, dtype, Device::cuda(0)),
         lse = Tensor::empty({s.B, s.NH, s.S}, DType::f32, Device::cuda(0));
  Tensor dq = Tensor::empty(qs, dtype, Device::cuda(0)), dk = Tensor::empty(kvs, dtype, Device::cuda(0));
  Tensor dv = Tensor::empty(kvs, dtype, Device::cuda(0));
  const ops::AttentionParams p{s.causal, float(1.0 / std::sqrt(double(s.HS))), s.dropout, 1, 2};
  const double fwd_ms = median_ms([&] { ops::cuda::attention_forward(out, lse, q, k, v, p); });
  const double bwd_ms = median_ms([&] { ops::cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p); });
  const double flops =
      4.0 * double(s.B) * double(s.NH) * double(s.S) * double(s.S) * double(s.HS) * (s.causal ? 0.5 : 1.0);
  std::printf("| %-10s | %-4s | %2lld %5lld %3lld %2lld %3lld | %-6s %.1f | %8.3f | %6.1f | %8.3f | %6.1f |\n", s.name,
              dtype_name(dtype), (long long)s.B, (long long)s.S, (long long)s.NH, (long long)s.G, (long long)s.HS,
              s.causal ? "causal" : "full", double(s.dropout), fwd_ms, flops / fwd_ms * 1e-9, bwd_ms,
              2.5 * flops / bwd_ms * 1e-9);
}

}  // namespace

int main() {
  const cuda::DeviceInfo info = cuda::init_device(0);
  std::printf("device: %s, %d SMs\n\n", info.name.c_str(), info.multiprocessors);
  std::printf("| shape      | type | B     S  NH  G  HS | mask dropout | fwd ms   | TFLOP/s | bwd ms   | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const Shape5 shapes[] = {
      {"gpt2-124m", 16, 1024, 12, 12, 64, true, 0.0f},   {"gpt2-124m", 16, 1024, 12, 12, 64, true, 0.1f},
      {"llama-1b", 4, 2048, 32, 8, 64, true, 0.0f},      {"hs128", 4, 2048, 16, 16, 128, true, 0.0f},
      {"hs128-full", 4, 2048, 16, 16, 128, false, 0.0f},
  };
  for (const Shape5& s : shapes) bench(s, DType::bf16);
  bench({"gpt2-small", 2, 1024, 12, 12, 64, true, 0.0f}, DType::f32);  // the generic kernels, for scale
  return 0;
}
