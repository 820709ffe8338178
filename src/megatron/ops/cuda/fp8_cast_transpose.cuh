#pragma once
// The FP8 cast's device pieces, shared by the FP8 family (fp8.cu) and the producers that fuse
// their output's cast (activation.cu's SwiGLU): the saturating cast, amax accumulation, and the
// cast-transpose kernel over any elementwise source (Transformer Engine's cast-transpose and its
// activation-fused forms). A fused producer computes each element as its own kernel would, rounds
// it to the activations' dtype as its store would, then casts: the bytes of the unfused pair.
#include <cuda_fp8.h>

#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda::fp8 {

inline __nv_fp8_interpretation_t format_of(DType dtype) { return dtype == DType::e4m3 ? __NV_E4M3 : __NV_E5M2; }

__device__ __forceinline__ unsigned magnitude_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Every thread's running max of magnitude bits, merged over the block, then into amax.
__device__ __forceinline__ void merge_amax(float* amax, unsigned bits) {
  bits = block_reduce(bits, MaxOp{}, 0u);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits);
}

// V FP8 codes stored as one access.
template <int V>
struct alignas(V) Pack {
  __nv_fp8_storage_t code[V];
};

__device__ __forceinline__ __nv_fp8_storage_t cast(float v, float s, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, s), __NV_SATFINITE, format);  // no FMA contraction
}

// v rounded to T as a kernel's store rounds it: what a fused source hands the cast.
template <class T>
__device__ __forceinline__ float as_stored(float v) {
  return to_float(from_float<T>(v));
}

// A source hands the cast the elements of kOutputs column blocks of a (rows, kOutputs * cols)
// tensor, block o being columns [o * cols, (o + 1) * cols), one element of each block at a time:
//   load8(r, c, v): v[o][j] = element (r, o * cols + c + j), j < 8 (c a multiple of 8; only where
//                   the launch allows vectors);
//   load1(r, c, v): v[o] = element (r, o * cols + c).
// A producer whose blocks share their inputs (SwiGLU's backward: dgate and dup from the same dy,
// gate and up) reads each input once so.

// A tensor at hand: x (rows, cols).
template <class T>
struct PlainSource {
  static constexpr int kOutputs = 1;
  const T* x;
  int64_t cols;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[1][8]) const {
    load_floats<8>(x + r * cols + c, v[0]);
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[1]) const { v[0] = to_float(x[r * cols + c]); }
};

// Cast-transpose of a source's elements in 64 x 64 tiles, one tile of each of its column blocks
// per thread block: each thread casts 8 adjacent elements of a row (source.load8: 16-byte loads
// for 16-bit inputs), writes them to q (if any) and to shared tiles, then writes 8 adjacent codes
// of a q_t row from a tile's column. Vector accesses where the rows allow, element by element
// (source.load1) at ragged edges. cols: the columns of one block.
constexpr int kTile = 64, kTileThreads = 256, kSeg = 8;
template <class Source>
__global__ void cast_transpose_kernel(Source source, __nv_fp8_storage_t* q, __nv_fp8_storage_t* q_t, float* amax,
                                      const float* scale, int64_t rows, int64_t cols, bool load_vectors,
                                      bool store_vectors, __nv_fp8_interpretation_t format) {
  constexpr int kOut = Source::kOutputs;
  __shared__ alignas(8) __nv_fp8_storage_t tile[kOut][kTile][kTile + kSeg];
  const float s = *scale;
  const int64_t ld = kOut * cols;  // q's row length
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int seg = int(threadIdx.x) % kSeg * kSeg, line0 = int(threadIdx.x) / kSeg;
  constexpr int kLines = kTileThreads / kSeg;  // 32 rows (or q_t rows) per pass
  constexpr int kPasses = kTile / kLines;
  const int64_t col = c0 + seg;  // the first of this thread's 8 columns
  // Every pass's loads issued before any is used, so each thread keeps all its reads in flight
  // at once (the kernel is bound by the memory's latency x the bytes in flight).
  const bool vectors = load_vectors && col + kSeg <= cols;
  float v[kPasses][kOut][kSeg];
  if (vectors) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t r = r0 + line0 + p * kLines;
      if (r < rows) source.load8(r, col, v[p]);
    }
  }
  unsigned bits = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int line = line0 + p * kLines;
    const int64_t r = r0 + line;
    if (r >= rows) break;
    Pack<kSeg> out[kOut];
    if (vectors) {
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
#pragma unroll
        for (int j = 0; j < kSeg; ++j) {
          bits = max(bits, magnitude_bits(v[p][o][j]));
          out[o].code[j] = cast(v[p][o][j], s, format);
        }
        if (q != nullptr) *reinterpret_cast<Pack<kSeg>*>(q + r * ld + o * cols + col) = out[o];
      }
    } else {
      for (int j = 0; j < kSeg && col + j < cols; ++j) {
        float e[kOut];
        source.load1(r, col + j, e);
#pragma unroll
        for (int o = 0; o < kOut; ++o) {
          bits = max(bits, magnitude_bits(e[o]));
          out[o].code[j] = cast(e[o], s, format);
          if (q != nullptr) q[r * ld + o * cols + col + j] = out[o].code[j];
        }
      }
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) *reinterpret_cast<Pack<kSeg>*>(&tile[o][line][seg]) = out[o];
  }
  if (amax != nullptr)
    merge_amax(amax, bits);  // its __syncthreads also orders the tiles
  else
    __syncthreads();
  for (int line = line0; line < kTile; line += kLines) {
    const int64_t c = c0 + line, r = r0 + seg;  // q_t rows o * cols + c, columns r .. r + 7
    if (c >= cols) break;
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      __nv_fp8_storage_t* dst = q_t + (o * cols + c) * rows + r;
      if (store_vectors && r + kSeg <= rows) {
        Pack<kSeg> out;
#pragma unroll
        for (int j = 0; j < kSeg; ++j) out.code[j] = tile[o][seg + j][line];
        *reinterpret_cast<Pack<kSeg>*>(dst) = out;
      } else {
        for (int j = 0; j < kSeg && r + j < rows; ++j) dst[j] = tile[o][seg + j][line];
      }
    }
  }
}

// Launches the cast-transpose of `source`'s (rows, Source::kOutputs * cols) elements into q (when
// defined) and q_t, amax (when defined) and scale as ops::fp8_quantize_transpose. source_vectors:
// whether source.load8 may read every 8-element segment of a block's row that starts at a
// multiple of 8.
template <class Source>
void launch_cast_transpose(const Source& source, bool source_vectors, Tensor& q, Tensor& q_t, Tensor& amax,
                           const Tensor& scale, int64_t rows, int64_t cols, const char* op) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned(ceil_div(cols, kTile)), unsigned(ceil_div(rows, kTile)));
  MEGATRON_CHECK(grid.y <= 65535,
                 op << ": " << rows << " rows exceed the kernel's grid of " << 65535 * kTile << "; split the tensor");
  auto* codes = q.defined() ? static_cast<__nv_fp8_storage_t*>(q.raw()) : nullptr;
  auto* codes_t = static_cast<__nv_fp8_storage_t*>(q_t.raw());
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kSeg == 0; };
  // Every row's 8-element segments on 8-byte boundaries of q and q_t.
  const bool load_vectors = source_vectors && cols % kSeg == 0 && aligned8(codes);
  const bool store_vectors = rows % kSeg == 0 && aligned8(codes_t);
  cast_transpose_kernel<Source><<<grid, kTileThreads, 0, stream()>>>(
      source, codes, codes_t, amax.defined() ? static_cast<float*>(amax.raw()) : nullptr,
      static_cast<const float*>(scale.raw()), rows, cols, load_vectors, store_vectors, format_of(q_t.dtype()));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda::fp8
