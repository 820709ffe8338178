// Attention backward with our kernels: argument checks and the choice of kernel and tile shape
// (attention_backward_kernels.cuh holds the kernels and the algorithm; attention.cu routes to
// cuDNN or here).
#include "megatron/ops/cuda/attention_backward_kernels.cuh"
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/op_paths.h"

namespace megatron::ops::cuda {
namespace {

using namespace attention_detail;

// Tile shapes per head dim, the fastest measured (bench/kernels/attention.cu times the
// alternatives; docs/PERFORMANCE.md, "Attention kernels", has the numbers): 128-key blocks of 8
// warps and 64-query steps; with dropout at head dim 64, 64-key blocks with 32-query steps, three
// blocks per SM.
using Backward16 = BackwardTiles<16, 4, 64, 1>;
using Backward32 = BackwardTiles<32, 4, 64, 1>;
using Backward64 = BackwardTiles<64, 8, 64, 1>;
using Backward64Dropout = BackwardTiles<64, 4, 32, 3>;
using Backward128 = BackwardTiles<128, 8, 64, 1>;

}  // namespace

void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params) {
  const Dims d = cuda_dims(
      checks::check_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params, kCudaAttention), q, params);
  if (q.numel() == 0) return;
  count_op_path(OpPath::attention_backward_ours);
  dispatch_storage(q.dtype(), "attention_backward", [&]<class T>(std::type_identity<T>) {
    const BackwardArgs<T> a = backward_args<T>(dq, dk, dv, dout, q, k, v, out, lse, params, d);
    if constexpr (kMmaType<T>) {
      const bool aligned = is_aligned16(a.dq) && is_aligned16(a.dk) && is_aligned16(a.dv) && is_aligned16(a.dout) &&
                           is_aligned16(a.q) && is_aligned16(a.k) && is_aligned16(a.v);
      // The tensor-core kernels add dq with float atomics; the generic ones sum it in a fixed order.
      if (aligned && mma_head_dim(d.HS) && !params.deterministic) {
        switch (d.HS) {
          case 16:
            return run_backward_mma<Backward16>(a, q.device());
          case 32:
            return run_backward_mma<Backward32>(a, q.device());
          case 64:
            return run_backward_mma<Backward64, Backward64Dropout>(a, q.device());
          default:
            return run_backward_mma<Backward128>(a, q.device());
        }
      }
    }
    run_backward_generic(a, q.device());
  });
}

}  // namespace megatron::ops::cuda
