// Attention kernel lab: times the tensor-core flash kernels (attention_forward_kernels.cuh,
// attention_backward_kernels.cuh) in several tile shapes on training shapes, checks each against
// the generic kernels run on the same bf16 inputs, and prints milliseconds, TFLOP/s (counted as
// FlashAttention does: forward 4 B NH S^2 HS, halved when causal; backward 2.5 times that) and
// the normwise error ||x - generic|| / ||generic|| of every output. attention_sdpa.py beside this
// times PyTorch's SDPA on the same shapes; run both in one command for a side-by-side table.
// The backward times cover the whole op: the D pre-kernel, zeroing the dQ workspace, the kernel
// and dQ's conversion.
//
// Build from the repository root, after building the library into build/<dir>:
//   nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -Isrc bench/kernels/attention.cu \
//        build/<dir>/libmegatron.a -L<cudnn lib dir> -l:libcudnn.so.9 -lcublasLt -Xcompiler -fopenmp \
//        -o build/attention_bench
// (cuDNN's directory as CMake found it: grep CUDNN_LIBRARY build/<dir>/CMakeCache.txt; the cuDNN
// path itself is timed by attention_cudnn.cu.)
// Run: build/attention_bench
//
// Measured: docs/PERFORMANCE.md, "Attention kernels" (variants, their resources, the choice per
// head dim that attention_forward.cu / attention_backward.cu ship).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "../gpu_lab.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/cuda/attention_backward_kernels.cuh"
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/attention_forward_kernels.cuh"

using namespace megatron;
using namespace megatron::bench;
using namespace megatron::ops::cuda::attention_detail;
using Bf16 = __nv_bfloat16;

namespace {

// Variants, named by tile shape: mt<M> = M 16-row m-tiles per warp, k<N> = N keys per tile,
// <B>blk = B resident blocks asked of the register allocator, qregs = Q fragments kept in registers;
// w<W> = W warps of 16 keys, q<M> = M queries per step.
struct ForwardVariant {
  const char* name;
  int hs;
  void (*run)(const ForwardArgs<Bf16>&);
};
const ForwardVariant kForward[] = {
    {"mt2_k64", 64, launch_forward_mma<ForwardTiles<64, 2, 64, 1, false>>},
    {"mt2_k64_qregs", 64, launch_forward_mma<ForwardTiles<64, 2, 64, 2, true>>},
    {"mt1_k64_4blk", 64, launch_forward_mma<ForwardTiles<64, 1, 64, 4, false>>},
    {"mt1_k64_qregs_3blk", 64, launch_forward_mma<ForwardTiles<64, 1, 64, 3, true>>},
    {"mt1_k128_2blk", 64, launch_forward_mma<ForwardTiles<64, 1, 128, 2, false>>},
    {"mt2_k32", 128, launch_forward_mma<ForwardTiles<128, 2, 32, 1, false>>},
    {"mt2_k64", 128, launch_forward_mma<ForwardTiles<128, 2, 64, 1, false>>},
    {"mt1_k32_4blk", 128, launch_forward_mma<ForwardTiles<128, 1, 32, 4, false>>},
    {"mt1_k32_3blk", 128, launch_forward_mma<ForwardTiles<128, 1, 32, 3, false>>},
    {"mt1_k64_2blk", 128, launch_forward_mma<ForwardTiles<128, 1, 64, 2, false>>},
};

struct BackwardVariant {
  const char* name;
  int hs;
  void (*run)(BackwardArgs<Bf16>, Device);
};
const BackwardVariant kBackward[] = {
    {"w4_q64_2blk", 64, run_backward_mma<BackwardTiles<64, 4, 64, 2>>},
    {"w8_q64", 64, run_backward_mma<BackwardTiles<64, 8, 64, 1>>},
    {"w8_q32", 64, run_backward_mma<BackwardTiles<64, 8, 32, 1>>},
    {"w4_q32_3blk", 64, run_backward_mma<BackwardTiles<64, 4, 32, 3>>},
    {"w4_q32_2blk", 128, run_backward_mma<BackwardTiles<128, 4, 32, 2>>},
    {"w8_q32", 128, run_backward_mma<BackwardTiles<128, 8, 32, 1>>},
    {"w8_q64", 128, run_backward_mma<BackwardTiles<128, 8, 64, 1>>},
};

struct Problem {
  const char* name;
  int64_t B, S, NH, G, HS;
  bool causal;
  float dropout;
};

// NaN in every element (all-ones bytes), so an element a kernel forgets to write fails the check.
void poison(Tensor& t) { CUDA_CHECK(cudaMemset(t.raw(), 0xff, t.nbytes())); }

// The bf16 goal of the issue (normwise error <= 1e-2), for the verdict column.
const char* verdict(std::initializer_list<double> errors) {
  for (double e : errors)
    if (!(e <= 1e-2)) return "FAIL";
  return "ok";
}

void run_problem(const Problem& pr) {
  const Shape qs{pr.S, pr.B, pr.NH, pr.HS}, kvs{pr.S, pr.B, pr.G, pr.HS}, ls{pr.B, pr.NH, pr.S};
  const Device gpu = Device::cuda(0);
  const Tensor q = random_gpu(qs, 1), k = random_gpu(kvs, 2), v = random_gpu(kvs, 3), dout = random_gpu(qs, 4);
  const ops::AttentionParams p{pr.causal, float(1.0 / std::sqrt(double(pr.HS))), pr.dropout, 1, 2};
  const Dims d = cuda_dims(ops::checks::check_attention_qkv(q, k, v, ops::cuda::check_cuda), q, p);
  const double flops =
      4.0 * double(pr.B) * double(pr.NH) * double(pr.S) * double(pr.S) * double(pr.HS) * (pr.causal ? 0.5 : 1.0);
  char shape[96];
  std::snprintf(shape, sizeof(shape), "%s B%lld S%lld NH%lld G%lld HS%lld %s p=%.1f", pr.name, (long long)pr.B,
                (long long)pr.S, (long long)pr.NH, (long long)pr.G, (long long)pr.HS, pr.causal ? "causal" : "full",
                double(pr.dropout));

  // Reference: the generic kernels on the same inputs.
  Tensor ref_out = Tensor::empty(qs, DType::bf16, gpu), ref_lse = Tensor::empty(ls, DType::f32, gpu);
  launch_forward_generic(forward_args<Bf16>(ref_out, ref_lse, q, k, v, p, d));
  Tensor ref_dq = Tensor::empty(qs, DType::bf16, gpu), ref_dk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor ref_dv = Tensor::empty(kvs, DType::bf16, gpu);
  run_backward_generic(backward_args<Bf16>(ref_dq, ref_dk, ref_dv, dout, q, k, v, ref_out, ref_lse, p, d), gpu);
  CUDA_CHECK(cudaDeviceSynchronize());

  Tensor out = Tensor::empty(qs, DType::bf16, gpu), lse = Tensor::empty(ls, DType::f32, gpu);
  for (const ForwardVariant& fv : kForward) {
    if (fv.hs != pr.HS) continue;
    const ForwardArgs<Bf16> a = forward_args<Bf16>(out, lse, q, k, v, p, d);
    poison(out);
    poison(lse);
    fv.run(a);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double e_out = normwise_error(out, ref_out), e_lse = normwise_error(lse, ref_lse);
    const double ms = median_ms([&] { fv.run(a); });
    std::printf("| %-44s | fwd | %-18s | %7.3f | %6.1f | out %.1e lse %.1e | %s |\n", shape, fv.name, ms,
                flops / ms * 1e-9, e_out, e_lse, verdict({e_out, e_lse}));
  }
  Tensor dq = Tensor::empty(qs, DType::bf16, gpu), dk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor dv = Tensor::empty(kvs, DType::bf16, gpu);
  for (const BackwardVariant& bv : kBackward) {
    if (bv.hs != pr.HS) continue;
    const BackwardArgs<Bf16> a = backward_args<Bf16>(dq, dk, dv, dout, q, k, v, ref_out, ref_lse, p, d);
    poison(dq);
    poison(dk);
    poison(dv);
    bv.run(a, gpu);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double e_dq = normwise_error(dq, ref_dq), e_dk = normwise_error(dk, ref_dk),
                 e_dv = normwise_error(dv, ref_dv);
    const double ms = median_ms([&] { bv.run(a, gpu); });
    std::printf("| %-44s | bwd | %-18s | %7.3f | %6.1f | dq %.1e dk %.1e dv %.1e | %s |\n", shape, bv.name, ms,
                2.5 * flops / ms * 1e-9, e_dq, e_dk, e_dv, verdict({e_dq, e_dk, e_dv}));
  }
  // Our kernels as shipped (attention_forward.cu / attention_backward.cu pick one variant per head
  // dim; the ops route to cuDNN where it applies, timed by attention_cudnn.cu).
  const double fwd_ms = median_ms([&] { ops::cuda::flash_attention_forward(out, lse, q, k, v, p); });
  const double bwd_ms = median_ms([&] { ops::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p); });
  std::printf("| %-44s | fwd | %-18s | %7.3f | %6.1f | | |\n", shape, "(library)", fwd_ms, flops / fwd_ms * 1e-9);
  std::printf("| %-44s | bwd | %-18s | %7.3f | %6.1f | | |\n", shape, "(library)", bwd_ms, 2.5 * flops / bwd_ms * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main() {
  const cuda::DeviceInfo info = cuda::init_device(0);
  std::printf("device: %s, %d SMs\n\n", info.name.c_str(), info.multiprocessors);
  std::printf("| problem | pass | variant | ms | TFLOP/s | normwise error vs generic | check |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const Problem problems[] = {
      {"gpt2-124m", 16, 1024, 12, 12, 64, true, 0.0f}, {"llama-1b", 4, 2048, 32, 8, 64, true, 0.0f},
      {"hs128", 4, 2048, 16, 16, 128, true, 0.0f},     {"hs128-full", 4, 2048, 16, 16, 128, false, 0.0f},
      {"gpt2-124m", 16, 1024, 12, 12, 64, true, 0.1f},
  };
  for (const Problem& pr : problems) run_problem(pr);
  return 0;
}
