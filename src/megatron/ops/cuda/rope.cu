// Rotary position embedding on CUDA: of separate tensors one thread per rotated pair or
// passed-through channel; of a fused QKV projection (rope_*_qkv) in place, a block per position.
// inv_freq is computed on the host with the CPU op's exact float expression and passed by value
// in the kernel parameters, so the angles (a float multiply, IEEE on both sides) match the CPU
// bit for bit; cos and sin then differ from the host libm by an ulp or two at most. The backward of
// the fused projection can also run as the source of the FP8 cast-transpose
// (rope_backward_qkv_fp8), with the same arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/checks/rope.h"
#include "megatron/ops/cuda/fp8_cast_transpose.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/rope.h"

namespace megatron::ops::cuda {
namespace {

// Head dims up to 2 * kMaxHalf rotate; the table travels in the kernel's parameter space (2 KB).
constexpr int kMaxHalf = 512;

struct InvFreq {
  float v[kMaxHalf];
};

// A pair (x1, x2) turned by the angle of (c, sn): y1 = x1 c - x2 sn, y2 = x2 c + x1 sn, each
// product and sum rounded as written (no contraction into FMAs), so every kernel here and the
// fused cast's source compute the same bits.
__device__ __forceinline__ float turned_first(float x1, float x2, float c, float sn) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
}
__device__ __forceinline__ float turned_second(float x1, float x2, float c, float sn) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
}

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
    yr[i1] = from_float<T>(turned_first(x1, x2, c, sn));
    yr[i2] = from_float<T>(turned_second(x1, x2, c, sn));
  }
}

// The elements [p, p + V) as floats: one 16-byte access where V fills whole ones, else V scalars
// (the fallback packs: one channel, or one interleaved pair).
template <int V, class T>
__device__ __forceinline__ void load_channels(const T* p, float (&v)[V]) {
  if constexpr ((V * sizeof(T)) % kVecBytes == 0) {
    load_floats<V>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = to_float(p[i]);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_channels(T* p, const float (&v)[V]) {
  if constexpr ((V * sizeof(T)) % kVecBytes == 0) {
    store_floats<V>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(v[i]);
  }
}

// The fused qkv (S, sets, stored heads of D) rotated in place: the first `rotated` heads of each
// set (a group's r query heads and its key head); the value heads are never read. A block takes
// one position at a time (grid-stride over S): its threads first put the cos and sin of that
// position's half angles in shared memory, once for all its B x G x (r+1) heads, then walk the
// heads in V-channel packs, consecutive threads on consecutive packs of a head and then the next
// head, so the accesses are coalesced. Non-interleaved, a pack is V consecutive pairs j (x1 at j,
// x2 at half + j); interleaved, V consecutive channels: V/2 pairs (2j, 2j+1). Same angle, cos, sin
// and products as rope_kernel; sign < 0 rotates back.
template <class T, int V, bool kInterleaved>
__global__ void rope_qkv_kernel(T* qkv, int64_t S, int64_t sets, int rotated, int stored, int D, int half,
                                int64_t position_offset, float sign, const __grid_constant__ InvFreq inv_freq) {
  extern __shared__ float rotation[];  // cos of the half angles, then sign * sin
  float* cos_t = rotation;
  float* sin_t = rotation + half;
  const int packs = (kInterleaved ? 2 * half : half) / V;  // per head
  const int64_t items = sets * rotated * packs;
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    __syncthreads();  // every thread is done with the previous position's table
    for (int j = int(threadIdx.x); j < half; j += int(blockDim.x)) {
      const float angle = float(position_offset + s) * inv_freq.v[j];
      cos_t[j] = cosf(angle);
      sin_t[j] = sign * sinf(angle);
    }
    __syncthreads();
    T* position = qkv + s * sets * stored * D;
    for (int64_t item = threadIdx.x; item < items; item += blockDim.x) {
      const int pack = int(item % packs);
      const int64_t head = item / packs;
      T* h = position + ((head / rotated) * stored + head % rotated) * D;
      if constexpr (kInterleaved) {
        float x[V];
        load_channels<V>(h + pack * V, x);
#pragma unroll
        for (int i = 0; i < V / 2; ++i) {
          const int j = pack * (V / 2) + i;
          const float c = cos_t[j], sn = sin_t[j];
          const float x1 = x[2 * i], x2 = x[2 * i + 1];
          x[2 * i] = turned_first(x1, x2, c, sn);
          x[2 * i + 1] = turned_second(x1, x2, c, sn);
        }
        store_channels<V>(h + pack * V, x);
      } else {
        float first[V], second[V];
        load_channels<V>(h + pack * V, first);
        load_channels<V>(h + half + pack * V, second);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const int j = pack * V + i;
          const float c = cos_t[j], sn = sin_t[j];
          const float x1 = first[i], x2 = second[i];
          first[i] = turned_first(x1, x2, c, sn);
          second[i] = turned_second(x1, x2, c, sn);
        }
        store_channels<V>(h + pack * V, first);
        store_channels<V>(h + half + pack * V, second);
      }
    }
  }
}

// The cos and sign * sin of every position's half angles: table (2, S, half), as rope_qkv_kernel
// puts them in shared memory (the same expressions, so the same bits).
__global__ void rotation_table_kernel(float* table, int64_t S, int half, int64_t position_offset, float sign,
                                      const __grid_constant__ InvFreq inv_freq) {
  const int64_t n = S * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float angle = float(position_offset + i / half) * inv_freq.v[i % half];
    table[i] = cosf(angle);
    table[n + i] = sign * sinf(angle);
  }
}

// rope_backward_qkv's result element by element, rounded to T as its kernel stores it, for the
// FP8 cast (fp8::launch_cast_transpose): dqkv as rows (S*B) of `cols` = sets x stored heads of D
// channels; the first `rotated` heads of a set turn back by their position's angles (cos and sin
// from rotation_table_kernel, the products of rope_qkv_kernel), the rest and the channels past
// rot_dim pass through. load8 (vectors): a segment lies in one head and, non-interleaved, in one
// half of its rotated channels (D and half, or rot_dim interleaved, multiples of 8).
template <class T>
struct RopeGradSource {
  static constexpr int kOutputs = 1;
  const T* dqkv;
  const float* cos_t;  // (S, half)
  const float* sin_t;  // (S, half), negated: the backward's rotation
  // 32-bit indices (the launch checks rows and cols fit): a 64-bit division per element costs
  // more than the element's bytes.
  int B, cols, D, half, rotated, stored;
  bool interleaved;

  // Column c's channel within its head, or -1 where c passes through unturned.
  __device__ __forceinline__ int turned_channel(int c) const {
    const int head = c / D, ch = c - head * D;
    return head % stored < rotated && ch < 2 * half ? ch : -1;
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[1]) const {
    const T* row = dqkv + r * cols;
    const int ch = turned_channel(int(c));
    if (ch < 0) {
      v[0] = to_float(row[c]);
      return;
    }
    const bool first = interleaved ? ch % 2 == 0 : ch < half;
    const int j = interleaved ? ch / 2 : (first ? ch : ch - half);
    const T* head = row + (c - ch);
    const float x1 = to_float(head[interleaved ? 2 * j : j]), x2 = to_float(head[interleaved ? 2 * j + 1 : j + half]);
    const int at = int(r) / B * half + j;
    const float cs = cos_t[at], sn = sin_t[at];
    v[0] = fp8::as_stored<T>(first ? turned_first(x1, x2, cs, sn) : turned_second(x1, x2, cs, sn));
  }
  // The angles [j, j + N) of row r's position, as 16-byte loads (j and half multiples of 4).
  template <int N>
  __device__ __forceinline__ void angles(int64_t r, int j, float (&cs)[N], float (&sn)[N]) const {
    const int at = int(r) / B * half + j;
    load_floats<N>(cos_t + at, cs);
    load_floats<N>(sin_t + at, sn);
  }
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[1][8]) const {
    const T* row = dqkv + r * cols;
    load_floats<8>(row + c, v[0]);
    const int ch = turned_channel(int(c));
    if (ch < 0) return;
    if (interleaved) {
      float cs[4], sn[4];
      angles(r, ch / 2, cs, sn);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float x1 = v[0][2 * i], x2 = v[0][2 * i + 1];
        v[0][2 * i] = fp8::as_stored<T>(turned_first(x1, x2, cs[i], sn[i]));
        v[0][2 * i + 1] = fp8::as_stored<T>(turned_second(x1, x2, cs[i], sn[i]));
      }
      return;
    }
    const bool first = ch < half;
    float partner[8], cs[8], sn[8];
    load_floats<8>(row + (first ? c + half : c - half), partner);
    angles(r, first ? ch : ch - half, cs, sn);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float x = v[0][k], p = partner[k];
      v[0][k] = fp8::as_stored<T>(first ? turned_first(x, p, cs[k], sn[k]) : turned_second(p, x, cs[k], sn[k]));
    }
  }
};

// inv_freq[j < rot_dim / 2] in float32: the CPU op's function (rope_inv_freq), on the host.
InvFreq inv_freq_table(int64_t rot_dim, const RopeParams& p, const char* op) {
  MEGATRON_CHECK(rot_dim / 2 <= kMaxHalf, op << ": rotary dim " << rot_dim << " exceeds the CUDA kernel's limit of "
                                             << 2 * kMaxHalf << "; raise kMaxHalf in ops/cuda/rope.cu");
  InvFreq inv_freq{};
  for (int64_t j = 0; j < rot_dim / 2; ++j) inv_freq.v[j] = rope_inv_freq(j, rot_dim, p);
  return inv_freq;
}

void rope_apply(Tensor& y, const Tensor& x, const RopeParams& p, bool inverse, const char* op, const char* y_name,
                const char* x_name) {
  const checks::RopeDims dims = checks::check_rope(y, x, p, op, y_name, x_name, check_cuda);
  const int64_t S = dims.S, B = dims.B, H = dims.H, D = dims.D, rot_dim = dims.rot_dim;
  const InvFreq inv_freq = inv_freq_table(rot_dim, p, op);
  if (x.numel() == 0) return;
  dispatch_storage(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    const int half = int(rot_dim / 2);
    const int64_t items = S * B * H * (D - half);
    rope_kernel<T><<<grid_for(items), kThreads, 0, stream()>>>(static_cast<T*>(y.raw()), static_cast<const T*>(x.raw()),
                                                               S, B * H, int(D), half, p.position_offset, p.interleaved,
                                                               inverse ? -1.0f : 1.0f, inv_freq);
    CUDA_CHECK_LAUNCH();
  });
}

template <class T, int V, bool kInterleaved>
void launch_rope_qkv(Tensor& qkv, const checks::RopeQkvDims& d, const RopeParams& p, bool inverse,
                     const InvFreq& inv_freq) {
  const int half = int(d.rot_dim / 2);
  const int64_t items = d.B * d.G * (d.r + 1) * ((kInterleaved ? 2 * half : half) / V);  // per position
  // Enough threads for one position's packs, in whole warps, up to kThreads.
  const int threads = int(std::clamp<int64_t>(ceil_div(items, 32) * 32, 32, kThreads));
  const auto blocks = unsigned(std::min<int64_t>(d.S, kMaxGridBlocks));
  const size_t table_bytes = 2 * size_t(half) * sizeof(float);
  rope_qkv_kernel<T, V, kInterleaved><<<blocks, threads, table_bytes, stream()>>>(
      static_cast<T*>(qkv.raw()), d.S, d.B * d.G, int(d.r + 1), int(d.r + 2), int(d.D), half, p.position_offset,
      inverse ? -1.0f : 1.0f, inv_freq);
  CUDA_CHECK_LAUNCH();
}

void rope_apply_qkv(Tensor& qkv, int64_t num_heads, const RopeParams& p, bool inverse, const char* op,
                    const char* qkv_name) {
  const checks::RopeQkvDims d = checks::check_rope_qkv(qkv, num_heads, p, op, qkv_name, check_cuda);
  const InvFreq inv_freq = inv_freq_table(d.rot_dim, p, op);
  if (qkv.numel() == 0 || d.rot_dim == 0) return;
  dispatch_storage(qkv.dtype(), op, [&]<class T>(std::type_identity<T>) {
    constexpr int kV = kPack<T>;
    // 16-byte packs when every head starts on a 16-byte boundary and the packs tile the rotated
    // channels (each half of them, non-interleaved); else one channel (one interleaved pair).
    const int64_t tiled = p.interleaved ? d.rot_dim : d.rot_dim / 2;
    const bool packed = is_aligned16(qkv.raw()) && d.D % kV == 0 && tiled % kV == 0;
    if (p.interleaved)
      return packed ? launch_rope_qkv<T, kV, true>(qkv, d, p, inverse, inv_freq)
                    : launch_rope_qkv<T, 2, true>(qkv, d, p, inverse, inv_freq);
    return packed ? launch_rope_qkv<T, kV, false>(qkv, d, p, inverse, inv_freq)
                  : launch_rope_qkv<T, 1, false>(qkv, d, p, inverse, inv_freq);
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

void cuda::rope_forward_qkv(Tensor& qkv, int64_t num_heads, const RopeParams& params) {
  rope_apply_qkv(qkv, num_heads, params, false, "rope_forward_qkv", "rope qkv");
}

void cuda::rope_backward_qkv(Tensor& dqkv, int64_t num_heads, const RopeParams& params) {
  rope_apply_qkv(dqkv, num_heads, params, true, "rope_backward_qkv", "rope dqkv");
}

void cuda::rope_backward_qkv_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dqkv, int64_t num_heads,
                                 const RopeParams& params, const Tensor& scale) {
  const char* op = "rope_backward_qkv_fp8";
  const checks::RopeQkvDims d = checks::check_rope_qkv(dqkv, num_heads, params, op, "rope dqkv", check_cuda);
  const int64_t rows = d.S * d.B, cols = d.G * (d.r + 2) * d.D;
  checks::check_fp8_casts(q, q_t, amax, scale, rows, cols, op, check_cuda);
  const InvFreq inv_freq = inv_freq_table(d.rot_dim, params, op);
  MEGATRON_CHECK(rows <= INT32_MAX && cols <= INT32_MAX, op << ": dqkv of " << rows << " x " << cols
                                                            << " exceeds the kernel's 32-bit indices; split the batch");
  const int half = int(d.rot_dim / 2);
  Tensor table = Tensor::empty({2, d.S, std::max(half, 1)}, DType::f32, dqkv.device());
  if (half > 0 && d.S > 0) {
    rotation_table_kernel<<<grid_for(d.S * half), kThreads, 0, stream()>>>(static_cast<float*>(table.raw()), d.S, half,
                                                                           params.position_offset, -1.0f, inv_freq);
    CUDA_CHECK_LAUNCH();
  }
  const float* cos_t = static_cast<const float*>(table.raw());
  dispatch_storage(dqkv.dtype(), op, [&]<class T>(std::type_identity<T>) {
    const T* x = static_cast<const T*>(dqkv.raw());
    const bool vectors = is_aligned16(x) && (cols * int64_t(sizeof(T))) % kVecBytes == 0 && d.D % fp8::kSeg == 0 &&
                         (params.interleaved ? 2 * half : half) % fp8::kSeg == 0;
    const RopeGradSource<T> source{x,        cos_t, cos_t + d.S * half, int(d.B),     int(cols),
                                   int(d.D), half,  int(d.r + 1),       int(d.r + 2), params.interleaved};
    fp8::launch_cast_transpose(source, vectors, q, q_t, amax, scale, rows, cols, op);
  });
}

}  // namespace megatron::ops
