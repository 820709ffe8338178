// The norm backward on one GPU at training shapes: add_norm_backward (the fused residual add's
// backward, what every pre-norm layer runs) and norm_backward, RMSNorm at llama-3b's rows (one
// micro-batch of 2 x 2048 tokens, hidden 3072) and LayerNorm at gpt2-350m's (8 x 1024, hidden
// 1024), bf16. Columns: median microseconds of 20 timed calls after 3 warm-ups (events on the ops'
// stream), and the bandwidth that time means for the bytes the op must move once: dy, x (and dh)
// read, dx written, in the activation dtype; the parameter vectors and the f32 partials are
// counted out (they are C-sized, or chunks x C, small next to the rows).
//
// Build: ninja -C build/gpu norm_backward_bench. Run: build/gpu/norm_backward_bench
#include <cstdio>
#include <functional>

#include "gpu_lab.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/ops/norm.h"

using namespace megatron;
using namespace megatron::bench;

namespace {

double median_us(const std::function<void()>& fn) { return 1e3 * median_ms(fn, 3, 20); }

void run(const char* name, int64_t N, int64_t C, ops::NormKind kind) {
  const DType dt = DType::bf16;
  const Device gpu = Device::cuda(0);
  const bool ln = kind == ops::NormKind::layernorm;
  const ops::NormParams params{kind, 1e-5f};
  const Tensor h = random_gpu({N, C}, 1, dt), dy = random_gpu({N, C}, 2, dt), dh = random_gpu({N, C}, 3, dt);
  const Tensor w = random_gpu({C}, 4, dt), b = random_gpu({C}, 5, dt);
  Tensor y = Tensor::empty({N, C}, dt, gpu), dx = Tensor::empty({N, C}, dt, gpu);
  Tensor mean = ln ? Tensor::empty({N}, DType::f32, gpu) : Tensor(), rstd = Tensor::empty({N}, DType::f32, gpu);
  Tensor dw = Tensor::zeros({C}, DType::f32, gpu), db = ln ? Tensor::zeros({C}, DType::f32, gpu) : Tensor();
  ops::norm_forward(y, mean, rstd, h, w, ln ? b : Tensor(), params);
  const double row_bytes = double(N) * double(C) * double(dtype_size(dt));
  const double add_us = median_us([&] { ops::add_norm_backward(dx, dw, db, dy, dh, h, w, mean, rstd, params); });
  const double plain_us = median_us([&] { ops::norm_backward(dx, dw, db, dy, h, w, mean, rstd, params); });
  std::printf("%-34s add_norm_backward %7.1f us %6.0f GB/s   norm_backward %7.1f us %6.0f GB/s\n", name, add_us,
              4.0 * row_bytes / add_us * 1e-3, plain_us, 3.0 * row_bytes / plain_us * 1e-3);
}

}  // namespace

int main() {
  cuda::init_device(0);
  run("llama-3b rmsnorm 4096 x 3072 bf16", 4096, 3072, ops::NormKind::rmsnorm);
  run("llama-3b rmsnorm 8192 x 3072 bf16", 8192, 3072, ops::NormKind::rmsnorm);
  run("gpt2-350m layernorm 8192 x 1024 bf16", 8192, 1024, ops::NormKind::layernorm);
  return 0;
}
