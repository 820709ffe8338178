// Attention forward with our kernels: argument checks and the choice of kernel and tile shape
// (attention_forward_kernels.cuh holds the kernels; attention.cu routes to cuDNN or here).
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/attention_forward_kernels.cuh"
#include "megatron/ops/cuda/op_paths.h"

namespace megatron::ops::cuda {
namespace {

using namespace attention_detail;

// Tile shapes per head dim, the fastest measured (bench/kernels/attention.cu times the
// alternatives; docs/PERFORMANCE.md, "Attention kernels", has the numbers). Head dim 64 keeps Q in
// registers; with dropout, whose Philox registers crowd out the rest, one m-tile per warp and four
// blocks per SM win. Head dim 128 keeps 32-key tiles: 64 would spill the 128 output accumulators.
using Forward16 = ForwardTiles<16, 2, 64, 1, false>;
using Forward32 = ForwardTiles<32, 2, 64, 1, false>;
using Forward64 = ForwardTiles<64, 2, 64, 2, true>;
using Forward64Dropout = ForwardTiles<64, 1, 64, 4, false>;
using Forward128 = ForwardTiles<128, 2, 32, 1, false>;

}  // namespace

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params) {
  const Dims d = cuda_dims(checks::check_attention_forward(out, lse, q, k, v, params, kCudaAttention), q, params);
  if (q.numel() == 0) return;
  count_op_path(OpPath::attention_forward_ours);
  dispatch_storage(q.dtype(), "attention_forward", [&]<class T>(std::type_identity<T>) {
    const ForwardArgs<T> a = forward_args<T>(out, lse, q, k, v, params, d);
    if constexpr (kMmaType<T>) {
      const bool aligned = is_aligned16(a.out) && is_aligned16(a.q) && is_aligned16(a.k) && is_aligned16(a.v);
      if (aligned && mma_head_dim(d.HS)) {
        switch (d.HS) {
          case 16:
            return launch_forward_mma<Forward16>(a);
          case 32:
            return launch_forward_mma<Forward32>(a);
          case 64:
            return launch_forward_mma<Forward64, Forward64Dropout>(a);
          default:
            return launch_forward_mma<Forward128>(a);
        }
      }
    }
    launch_forward_generic(a);
  });
}

}  // namespace megatron::ops::cuda
