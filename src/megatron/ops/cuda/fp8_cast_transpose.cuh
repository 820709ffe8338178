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

// Cast-transpose of a source's elements in Tile::kRows x Tile::kCols tiles, one tile of each of its
// kOut column blocks per thread block. Loads: in each pass a thread casts 8 adjacent elements of a
// row of every block (source.load8: 16-byte loads for 16-bit inputs; every pass's loads issued
// before any is used, so all of a thread's reads are in flight at once), writes them to q (if any)
// and to the shared tiles. Stores: a thread reads an 8-row x 4-column block of one tile as eight
// 4-byte words, transposes it in registers, and writes four 8-byte segments of q_t rows. So a
// thread block has kOut x kRows/8 x kCols/4 threads and loads in 4/kOut passes: a source with more
// outputs holds fewer passes of inputs in registers. Vector accesses where the rows allow, element
// by element (source.load1) at ragged edges. cols: the columns of one block.
constexpr int kSeg = 8;
template <int Rows, int Cols>
struct CastTile {
  static constexpr int kRows = Rows, kCols = Cols;
  static constexpr int kBlocks = Rows / 8 * (Cols / 4);  // 8 x 4 blocks of one tile
  static constexpr int kSegsPerRow = Cols / kSeg;        // threads across a row when loading
  // Bytes per shared row: 4 past the columns, so the words a warp reads when transposing (4 row
  // blocks x 8 column blocks) fall in 32 distinct banks.
  static constexpr int kStride = Cols + 4;
  static_assert(Rows % 32 == 0 && Cols % 32 == 0, "whole warps of 4 x 8 blocks");
  template <int Outputs>
  static constexpr int threads() {
    static_assert(4 % Outputs == 0, "1, 2 or 4 outputs: whole load passes");
    return Outputs * kBlocks;
  }
};
using DefaultCastTile = CastTile<64, 64>;

// Byte k of each of a[0..3], for k < 4: the 4 x 4 byte transpose.
__device__ __forceinline__ void transpose_bytes4x4(const uint32_t (&a)[4], uint32_t (&t)[4]) {
  const uint32_t lo01 = __byte_perm(a[0], a[1], 0x5140), lo23 = __byte_perm(a[2], a[3], 0x5140);  // bytes 0, 1
  const uint32_t hi01 = __byte_perm(a[0], a[1], 0x7362), hi23 = __byte_perm(a[2], a[3], 0x7362);  // bytes 2, 3
  t[0] = __byte_perm(lo01, lo23, 0x5410);
  t[1] = __byte_perm(lo01, lo23, 0x7632);
  t[2] = __byte_perm(hi01, hi23, 0x5410);
  t[3] = __byte_perm(hi01, hi23, 0x7632);
}

template <class Source, class Tile>
__global__ void __launch_bounds__(Tile::template threads<Source::kOutputs>())
    cast_transpose_kernel(Source source, __nv_fp8_storage_t* q, __nv_fp8_storage_t* q_t, float* amax,
                          const float* scale, int64_t rows, int64_t cols, bool load_vectors, bool store_vectors,
                          __nv_fp8_interpretation_t format) {
  constexpr int kOut = Source::kOutputs, kWordsPerRow = Tile::kStride / 4;
  constexpr int kLines = Tile::template threads<kOut>() / Tile::kSegsPerRow;  // rows per load pass
  constexpr int kPasses = Tile::kRows / kLines;
  __shared__ uint32_t tile[kOut][Tile::kRows * kWordsPerRow];  // FP8 codes, row r at word r * kWordsPerRow
  const float s = *scale;
  const int64_t ld = kOut * cols;  // q's row length
  const int64_t r0 = int64_t(blockIdx.y) * Tile::kRows, c0 = int64_t(blockIdx.x) * Tile::kCols;
  const int tid = int(threadIdx.x);
  const int seg = tid % Tile::kSegsPerRow * kSeg, line0 = tid / Tile::kSegsPerRow;
  const int64_t col = c0 + seg;  // the first of this thread's 8 columns
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
    for (int o = 0; o < kOut; ++o) {  // two words: the shared rows are 4-byte aligned only
      const uint2 words = *reinterpret_cast<const uint2*>(out[o].code);
      uint32_t* dst = &tile[o][line * kWordsPerRow + seg / 4];
      dst[0] = words.x;
      dst[1] = words.y;
    }
  }
  if (amax != nullptr)
    merge_amax(amax, bits);  // its __syncthreads also orders the tiles
  else
    __syncthreads();
  // This thread's block: rows 8 * rb .. + 7, columns 4 * cb .. + 3 of tile o; a warp takes 4 row
  // blocks x 8 column blocks, so each of its stores covers 8 q_t rows with 32 contiguous bytes.
  constexpr int kRowWarps = Tile::kRows / 32;
  const int o = tid / Tile::kBlocks, lane = tid % 32, warp = tid % Tile::kBlocks / 32;
  const int rb = lane % 4 + 4 * (warp % kRowWarps), cb = lane / 4 + 8 * (warp / kRowWarps);
  const int64_t r = r0 + 8 * rb;
  if (r >= rows) return;
  uint32_t upper[4], lower[4], t_upper[4], t_lower[4];  // rows 8 rb + 0..3 and + 4..7
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    upper[i] = tile[o][(8 * rb + i) * kWordsPerRow + cb];
    lower[i] = tile[o][(8 * rb + 4 + i) * kWordsPerRow + cb];
  }
  transpose_bytes4x4(upper, t_upper);
  transpose_bytes4x4(lower, t_lower);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t c = c0 + 4 * cb + k;  // q_t row o * cols + c, columns r .. r + 7
    if (c >= cols) break;
    __nv_fp8_storage_t* dst = q_t + (o * cols + c) * rows + r;
    if (store_vectors && r + kSeg <= rows) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(t_upper[k], t_lower[k]);
    } else {
      for (int j = 0; j < kSeg && r + j < rows; ++j)
        dst[j] = __nv_fp8_storage_t((j < 4 ? t_upper[k] >> (8 * j) : t_lower[k] >> (8 * (j - 4))) & 0xffu);
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
  using Tile = DefaultCastTile;  // the lab (bench/kernels/cast_transpose.cu) times the others
  const dim3 grid(unsigned(ceil_div(cols, Tile::kCols)), unsigned(ceil_div(rows, Tile::kRows)));
  MEGATRON_CHECK(grid.y <= 65535, op << ": " << rows << " rows exceed the kernel's grid of " << 65535 * Tile::kRows
                                     << "; split the tensor");
  auto* codes = q.defined() ? static_cast<__nv_fp8_storage_t*>(q.raw()) : nullptr;
  auto* codes_t = static_cast<__nv_fp8_storage_t*>(q_t.raw());
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kSeg == 0; };
  // Every row's 8-element segments on 8-byte boundaries of q and q_t.
  const bool load_vectors = source_vectors && cols % kSeg == 0 && aligned8(codes);
  const bool store_vectors = rows % kSeg == 0 && aligned8(codes_t);
  cast_transpose_kernel<Source, Tile><<<grid, Tile::template threads<Source::kOutputs>(), 0, stream()>>>(
      source, codes, codes_t, amax.defined() ? static_cast<float*>(amax.raw()) : nullptr,
      static_cast<const float*>(scale.raw()), rows, cols, load_vectors, store_vectors, format_of(q_t.dtype()));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda::fp8
