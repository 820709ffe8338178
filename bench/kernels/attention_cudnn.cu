// Attention lab, cuDNN against our kernels: on the training shapes of attention.cu, times our flash
// kernels (ops/cuda/attention_flash.h) and cuDNN's fused graphs (ops/cuda/attention_cudnn.h) as
// the ops call them, forward and backward, and checks cuDNN's outputs against ours on the same bf16
// inputs (normwise error ||cudnn - ours|| / ||ours||; both are within the tests' bounds of the f64
// reference, so this only catches a gross mismatch). For the MHA shapes it also times the
// fused-QKV ops (q, k, v read from the projection in place, dqkv written in place) against split +
// attention + merge. Milliseconds are medians of 15 CUDA-event timings after 3 warm-ups; TFLOP/s
// are counted as in attention.cu. attention_sdpa.py times PyTorch's SDPA on the same shapes: run
// both in one command for the side-by-side table.
//
// Build from the repository root, after building the library into build/<dir> (cuDNN's library
// directory as found by CMake: grep CUDNN_LIBRARY build/<dir>/CMakeCache.txt):
//   nvcc -O3 -std=c++20 -arch=sm_90 -Isrc bench/kernels/attention_cudnn.cu build/<dir>/libmegatron.a \
//        -L<cudnn lib dir> -l:libcudnn.so.9 -lcublasLt -Xcompiler -fopenmp -o build/attention_cudnn_bench
// Run: build/attention_cudnn_bench
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "../gpu_lab.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/cuda/attention_cudnn.h"
#include "megatron/ops/cuda/attention_flash.h"

using namespace megatron;
using namespace megatron::bench;
using megatron::ops::cuda::CudnnAttention;

namespace {

struct Problem {
  const char* name;
  int64_t B, S, NH, G, HS;
  bool causal;
};

void run_problem(const Problem& pr) {
  const Shape qs{pr.S, pr.B, pr.NH, pr.HS}, kvs{pr.S, pr.B, pr.G, pr.HS}, ls{pr.B, pr.NH, pr.S};
  const Device gpu = Device::cuda(0);
  const Tensor q = random_gpu(qs, 1), k = random_gpu(kvs, 2), v = random_gpu(kvs, 3), dout = random_gpu(qs, 4);
  const ops::AttentionParams p{pr.causal, float(1.0 / std::sqrt(double(pr.HS))), 0.0f, 1, 2};
  const double flops =
      4.0 * double(pr.B) * double(pr.NH) * double(pr.S) * double(pr.S) * double(pr.HS) * (pr.causal ? 0.5 : 1.0);
  char shape[96];
  std::snprintf(shape, sizeof(shape), "%s B%lld S%lld NH%lld G%lld HS%lld %s", pr.name, (long long)pr.B,
                (long long)pr.S, (long long)pr.NH, (long long)pr.G, (long long)pr.HS, pr.causal ? "causal" : "full");

  // Ours, then cuDNN on the same inputs; the backward of both reads our forward's out and lse.
  Tensor out = Tensor::empty(qs, DType::bf16, gpu), lse = Tensor::empty(ls, DType::f32, gpu);
  Tensor dq = Tensor::empty(qs, DType::bf16, gpu), dk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor dv = Tensor::empty(kvs, DType::bf16, gpu);
  ops::cuda::flash_attention_forward(out, lse, q, k, v, p);
  ops::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p);
  const double ours_fwd = median_ms([&] { ops::cuda::flash_attention_forward(out, lse, q, k, v, p); });
  const double ours_bwd =
      median_ms([&] { ops::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p); });

  const CudnnAttention a = ops::cuda::cudnn_attention_separate({pr.S, pr.B, pr.NH, pr.G, pr.HS}, DType::bf16, p);
  if (!ops::cuda::cudnn_attention_applies(a, p, {q.raw(), k.raw(), v.raw(), out.raw(), dout.raw()})) {
    std::printf("| %-44s | ours fwd %.3f bwd %.3f | cuDNN does not apply (see the warning) |\n", shape, ours_fwd,
                ours_bwd);
    return;
  }
  Tensor c_out = Tensor::empty(qs, DType::bf16, gpu), c_lse = Tensor::empty(ls, DType::f32, gpu);
  Tensor c_dq = Tensor::empty(qs, DType::bf16, gpu), c_dk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor c_dv = Tensor::empty(kvs, DType::bf16, gpu);
  const auto cudnn_fwd = [&] {
    ops::cuda::cudnn_attention_forward(a, c_out.raw(), c_lse.data<float>(), q.raw(), k.raw(), v.raw(), Tensor());
  };
  const auto cudnn_bwd = [&] {
    ops::cuda::cudnn_attention_backward(a, c_dq.raw(), c_dk.raw(), c_dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(),
                                        out.raw(), lse.data<float>(), Tensor());
  };
  cudnn_fwd();
  cudnn_bwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  const double e_out = normwise_error(c_out, out), e_lse = normwise_error(c_lse, lse);
  const double e_dq = normwise_error(c_dq, dq), e_dk = normwise_error(c_dk, dk), e_dv = normwise_error(c_dv, dv);
  const double cudnn_fwd_ms = median_ms(cudnn_fwd), cudnn_bwd_ms = median_ms(cudnn_bwd);
  std::printf(
      "| %-44s | %7.3f | %7.3f | %5.2fx | %7.3f | %7.3f | %5.2fx | out %.1e lse %.1e dq %.1e dk %.1e dv %.1e |\n",
      shape, ours_fwd, cudnn_fwd_ms, ours_fwd / cudnn_fwd_ms, ours_bwd, cudnn_bwd_ms, ours_bwd / cudnn_bwd_ms, e_out,
      e_lse, e_dq, e_dk, e_dv);
  std::printf("|   TFLOP/s | %7.1f | %7.1f | | %7.1f | %7.1f | | |\n", flops / ours_fwd * 1e-9,
              flops / cudnn_fwd_ms * 1e-9, 2.5 * flops / ours_bwd * 1e-9, 2.5 * flops / cudnn_bwd_ms * 1e-9);

  if (pr.G != pr.NH) return;
  // Fused QKV (MHA): the ops as SelfAttention calls them without RoPE, against split + op (+ merge).
  const Shape fused{pr.S, pr.B, pr.NH, 3 * pr.HS};
  const Tensor qkv = random_gpu(fused, 5);
  Tensor dqkv = Tensor::empty(fused, DType::bf16, gpu);
  Tensor sq = Tensor::empty(qs, DType::bf16, gpu), sk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor sv = Tensor::empty(kvs, DType::bf16, gpu);
  const double split_fwd = median_ms([&] {
    ops::cuda::qkv_split(sq, sk, sv, qkv);
    ops::cuda::attention_forward(c_out, c_lse, sq, sk, sv, p);
  });
  const double split_bwd = median_ms([&] {
    ops::cuda::attention_backward(c_dq, c_dk, c_dv, dout, sq, sk, sv, c_out, c_lse, p);
    ops::cuda::qkv_merge(dqkv, c_dq, c_dk, c_dv);
  });
  const double fused_fwd = median_ms([&] { ops::cuda::attention_forward_qkv(c_out, c_lse, qkv, pr.NH, p); });
  const double fused_bwd =
      median_ms([&] { ops::cuda::attention_backward_qkv(dqkv, dout, qkv, c_out, c_lse, pr.NH, p); });
  std::printf("|   fused qkv: split+fwd %.3f -> in place %.3f; bwd+merge %.3f -> in place %.3f | | | | | | | |\n",
              split_fwd, fused_fwd, split_bwd, fused_bwd);
  std::fflush(stdout);
}

}  // namespace

int main() {
  const cuda::DeviceInfo info = cuda::init_device(0);
  std::printf("device: %s, %d SMs\n\n", info.name.c_str(), info.multiprocessors);
  std::printf(
      "| problem (bf16, ms) | fwd ours | fwd cuDNN | speedup | bwd ours | bwd cuDNN | speedup | cuDNN vs ours |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const Problem problems[] = {
      {"gpt2-124m", 16, 1024, 12, 12, 64, true},
      {"llama-1b", 4, 2048, 32, 8, 64, true},
      {"hs128", 4, 2048, 16, 16, 128, true},
      {"hs128-full", 4, 2048, 16, 16, 128, false},
  };
  for (const Problem& pr : problems) run_problem(pr);
  return 0;
}
