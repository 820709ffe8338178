// Rotary position embedding on CUDA, one thread per rotated pair or passed-through channel.
// inv_freq is computed on the host with the CPU op's exact float expression and passed by value
// in the kernel parameters, so the angles (a float multiply, IEEE on both sides) match the CPU
// bit for bit; cos and sin then differ from the host libm by an ulp or two at most.
#include <cmath>

#include "megatron/ops/checks/rope.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/rope.h"

namespace megatron::ops::cuda {
namespace {

// Head dims up to 2 * kMaxHalf rotate; the table travels in the kernel's parameter space (2 KB).
constexpr int kMaxHalf = 512;

struct InvFreq {
  float v[kMaxHalf];
};

// x, y (S, B*H, D). Item (row, k): k < half rotates pair k, half <= k < half + (D - rot_dim)
// copies channel rot_dim + (k - half). Pairs are (j, j + half), or (2j, 2j+1) when interleaved:
//   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin   (sin negated for the inverse rotation)
// In place is safe: each item reads exactly the channels it writes.
template <class T>
__global__ void rope_kernel(T* y, const T* x, int64_t S, int64_t BH, int D, int half, int64_t position_offset,
                            bool interleaved, float sign, const __grid_constant__ InvFreq inv_freq) {
  const int items = D - half;  // half pairs plus D - 2*half passed-through channels
  const int64_t total = S * BH * items;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(idx % items);
    const int64_t row = idx / items;  // s * BH + bh
    const T* xr = x + row * D;
    T* yr = y + row * D;
    if (k >= half) {
      const int c = 2 * half + (k - half);
      yr[c] = xr[c];
      continue;
    }
    const int64_t s = row / BH;
    const float angle = float(position_offset + s) * inv_freq.v[k];
    const float c = cosf(angle), sn = sign * sinf(angle);
    const int i1 = interleaved ? 2 * k : k;
    const int i2 = interleaved ? 2 * k + 1 : k + half;
    const float x1 = to_float(xr[i1]), x2 = to_float(xr[i2]);
    yr[i1] = from_float<T>(x1 * c - x2 * sn);
    yr[i2] = from_float<T>(x2 * c + x1 * sn);
  }
}

void rope_apply(Tensor& y, const Tensor& x, const RopeParams& p, bool inverse, const char* op, const char* y_name,
                const char* x_name) {
  const checks::RopeDims dims = checks::check_rope(y, x, p, op, y_name, x_name, check_cuda);
  const int64_t S = dims.S, B = dims.B, H = dims.H, D = dims.D, rot_dim = dims.rot_dim;
  MEGATRON_CHECK(rot_dim / 2 <= kMaxHalf, op << ": rotary dim " << rot_dim << " exceeds the CUDA kernel's limit of "
                                             << 2 * kMaxHalf << "; raise kMaxHalf in ops/cuda/rope.cu");
  if (x.numel() == 0) return;
  // inv_freq in float32: the CPU op's function (rope_inv_freq), evaluated on the host.
  InvFreq inv_freq{};
  for (int64_t j = 0; j < rot_dim / 2; ++j) inv_freq.v[j] = rope_inv_freq(j, rot_dim, p);
  dispatch_storage(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    const int half = int(rot_dim / 2);
    const int64_t items = S * B * H * (D - half);
    rope_kernel<T><<<grid_for(items), kThreads, 0, stream()>>>(static_cast<T*>(y.raw()), static_cast<const T*>(x.raw()),
                                                               S, B * H, int(D), half, p.position_offset, p.interleaved,
                                                               inverse ? -1.0f : 1.0f, inv_freq);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::rope_forward(Tensor& y, const Tensor& x, const RopeParams& params) {
  rope_apply(y, x, params, false, "rope_forward", "rope y", "rope x");
}

void cuda::rope_backward(Tensor& dx, const Tensor& dy, const RopeParams& params) {
  rope_apply(dx, dy, params, true, "rope_backward", "rope dx", "rope dy");
}

}  // namespace megatron::ops
