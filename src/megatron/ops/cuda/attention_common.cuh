#pragma once
// Shared by the CUDA attention code (attention.cu, attention_{forward,backward}_kernels.cuh):
// the problem shape and argument checks, the dropout rule, and the tensor-core building blocks
// of the bf16/f16 flash kernels (mma.sync m16n8k16, ldmatrix, cp.async, swizzled shared tiles).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t (g = lane / 4, t = lane % 4).
//   A (16x16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, k x n):      b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
//   C (16x8, f32):        c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
// The low half of each 32-bit register holds the lower column (A) or lower k (B). Two adjacent
// C tiles (columns 0-7 and 8-15) are therefore exactly one A fragment of a k=16 step, which is
// how the probabilities P feed P V without leaving registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/checks/attention.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/dropout.h"

namespace megatron::ops::cuda::attention_detail {

// q, out (S,B,NH,HS); k, v (S,B,G,HS); lse (B,NH,S). Dropout indexes query heads globally:
// this rank's head h is head_offset + h of total_heads (attention.h).
struct Dims {
  int S, B, NH, G, HS;
  int head_offset = 0, total_heads = 0;
  __host__ __device__ int group_size() const { return NH / G; }
  // Elements between positions s and s+1 of one head.
  __host__ __device__ int64_t q_row_stride() const { return int64_t(B) * NH * HS; }
  __host__ __device__ int64_t kv_row_stride() const { return int64_t(B) * G * HS; }
};

// The shared checks' dims as the kernels' ints, after checking they fit the kernels' limits.
Dims cuda_dims(const checks::AttentionDims& d, const Tensor& q, const AttentionParams& p = {});
// Positions [begin, end) of one row: a packed document (AttentionParams::cu_seqlens), or the whole row.
struct DocumentSpan {
  int begin, end;
};
// The documents of the first and last of a run of consecutive rows (queries or keys): a key in
// [last.begin, first.end) lies in the document of every row of the run, and no key outside
// [first.begin, last.end) lies in any of their documents (documents are contiguous and ordered).
struct RowsDocuments {
  DocumentSpan first, last;
};

// The keys a query hides besides causality: those of another document (segment ids, (B,S) int32,
// null for one document per sequence; or packed documents, cu_seqlens (N+1) int32 over b*S + s)
// and, with a sliding window (window >= 0), those more than `window` positions before it. The
// keys' segment ids are their own where key_segment_ids is given (a ring attention block), else
// the queries'.
struct KeyMask {
  const int32_t* segments;
  const int32_t* key_segments;
  int window;
  const int32_t* cu_seqlens;  // null without packed documents
  int documents;              // N: cu_seqlens holds N + 1 boundaries
  __host__ __device__ bool any() const { return segments != nullptr || window >= 0 || cu_seqlens != nullptr; }
  // Segment ids and the window, element by element (packed documents: outside_document).
  __device__ __forceinline__ bool hidden(const Dims& d, int b, int row, int col) const {
    if (window >= 0 && col < row - window) return true;
    return segments && segments[int64_t(b) * d.S + row] != key_segments[int64_t(b) * d.S + col];
  }
  // The packed document holding position pos of row b (binary search for the last boundary at or
  // before b*S + pos), clamped to the row; the whole row without packed documents.
  __device__ DocumentSpan document_span(const Dims& d, int b, int pos) const {
    if (!cu_seqlens) return {0, d.S};
    const int64_t row_start = int64_t(b) * d.S, t = row_start + pos;
    int lo = 0, hi = documents;  // cu[lo] <= t < cu[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (cu_seqlens[mid] <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return {int(max(int64_t(0), cu_seqlens[lo] - row_start)), int(min(int64_t(d.S), cu_seqlens[hi] - row_start))};
  }
  // Rows [row_lo, row_hi], both < S.
  __device__ RowsDocuments documents_of_rows(const Dims& d, int b, int row_lo, int row_hi) const {
    return {document_span(d, b, row_lo), document_span(d, b, row_hi)};
  }
  __device__ __forceinline__ bool outside_document(const Dims& d, int b, int row, int col) const {
    if (!cu_seqlens) return false;
    const DocumentSpan span = document_span(d, b, row);
    return col < span.begin || col >= span.end;
  }
  // Whether a tile of rows with documents `rows` and keys [col_lo, col_hi] needs hidden() or
  // outside_document() element by element: with segment ids or a window always, with packed
  // documents unless every key lies in every row's document.
  __device__ __forceinline__ bool masks_tile(const RowsDocuments& rows, int col_lo, int col_hi) const {
    if (segments || window >= 0) return true;
    return cu_seqlens && (col_lo < rows.last.begin || col_hi >= rows.first.end);
  }
};
inline KeyMask key_mask_of(const AttentionParams& p) {
  const int32_t* segments = p.segment_ids.defined() ? p.segment_ids.data<int32_t>() : nullptr;
  const bool packed = p.cu_seqlens.defined();
  return {segments, p.key_segment_ids.defined() ? p.key_segment_ids.data<int32_t>() : segments,
          int(std::min<int64_t>(p.window, std::numeric_limits<int>::max())),  // a window past S hides nothing
          packed ? p.cu_seqlens.data<int32_t>() : nullptr, packed ? int(p.cu_seqlens.dim(0) - 1) : 0};
}
// The shared attention checks (ops/checks/attention.h) with CUDA's device rule and dtypes.
extern const checks::AttentionBackend kCudaAttention;

// The tensor-core kernels cover these head dims; others (and f32) take the generic kernels.
inline bool mma_head_dim(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

// Dropout multiplier of probability (b, h, i, j): 1/(1-p) when kept, else 0; element index
// ((b*total_heads + head_offset + h)*S + i)*S + j (attention.h), so the mask is the CPU's bit for bit.
__device__ __forceinline__ float dropout_factor(const CounterRng& rng, uint64_t row_base, int j, float p,
                                                float keep_scale) {
  return dropout_keep(rng, row_base + uint64_t(j), p) ? keep_scale : 0.0f;
}
// row_base of query row i of head (b, h): ((b*total_heads + head_offset + h)*S + i)*S.
__device__ __forceinline__ uint64_t dropout_row_base(const Dims& d, int b, int h, int i) {
  return ((uint64_t(b) * d.total_heads + d.head_offset + h) * d.S + i) * d.S;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The generic (scalar) kernels: warps per block, head dims each lane covers (HS <= 32 * 8).
constexpr int kGenericWarps = 4;
constexpr int kMaxLaneDims = 8;

template <class T>
__device__ __forceinline__ float dot_row(const float* x, const T* y, int n) {
  float sum = 0.0f;
  for (int e = 0; e < n; ++e) sum += x[e] * to_float(y[e]);
  return sum;
}

// ---- tensor-core building blocks (sm_80+) ---------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from the shared-memory byte address addr; lanes 8m..8m+7 give the row
// addresses of matrix m, register m receives it: lane holds row lane/4, columns 2(lane%4)..+1
// (with .trans, of the transposed matrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The 16-bit storage types the tensor-core kernels take: bf16 and f16 (same fragment layouts).
template <class T>
constexpr bool kMmaType = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// d += a b, T (bf16 or f16) inputs, f32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(kMmaType<T>);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x with the hardware approximation (relative error ~2^-22, results below 2^-126 flushed to 0):
// the softmax exponent, where exp2f's extra scaling for subnormal results buys nothing.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as a T pair (bf16 or f16), lo in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(kMmaType<T>);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// 16 bytes global -> shared without passing through registers; zero-fills when !valid (rows
// past the sequence end, so masked products never meet uninitialised NaN).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (per-row statistics), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// p[0] += x, p[1] += y in global memory (p 8-byte aligned): one vector reduction on sm_90, which
// halves the atomic traffic of the backward pass's dQ accumulation; two scalar ones before.
__device__ __forceinline__ void atomic_add_f32x2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// A ROWS x COLS 16-bit tile in shared memory, row-major in 16-byte chunks of 8 elements, chunk c of
// row r stored at chunk position c ^ (r % 8) (mod the chunks per row): the 8 rows an ldmatrix
// reads at one column land in different banks.
template <int COLS>
struct Swizzled {
  static constexpr int kChunks = COLS / 8;
  static constexpr int kMask = kChunks < 8 ? kChunks - 1 : 7;
  static_assert(COLS % 8 == 0 && (kChunks & (kChunks - 1)) == 0, "tile rows are a power-of-two number of chunks");
  // Element offset of (row, col); col may point anywhere inside its chunk.
  __device__ static __forceinline__ int offset(int row, int col) {
    return row * COLS + ((((col >> 3) ^ row) & kMask) | ((col >> 3) & ~kMask)) * 8 + (col & 7);
  }
};

// Copies rows [row0, row0 + ROWS) of a (S rows, HS) strided global matrix into a swizzled tile
// with cp.async; rows >= S are zero-filled. All NTHREADS threads of the block take part.
template <int ROWS, int HS, int NTHREADS, class T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, int64_t row_stride, int row0, int S) {
  constexpr int kChunks = HS / 8;
#pragma unroll
  for (int idx = int(threadIdx.x); idx < ROWS * kChunks; idx += NTHREADS) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < S;
    const T* src = valid ? base + int64_t(row0 + r) * row_stride + c * 8 : base;
    cp_async_16(tile + Swizzled<HS>::offset(r, c * 8), src, valid);
  }
}

// Writes rows [row0, row0 + ROWS) of a swizzled tile back to a strided global matrix, 16 bytes
// per access, skipping rows >= S. The calling threads (a warp, or the block) share the work.
template <int ROWS, int HS, class T>
__device__ __forceinline__ void store_tile(T* base, int64_t row_stride, const T* tile, int row0, int S, int thread,
                                           int nthreads) {
  constexpr int kChunks = HS / 8;
  for (int idx = thread; idx < ROWS * kChunks; idx += nthreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (row0 + r < S)
      *reinterpret_cast<uint4*>(base + int64_t(row0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(tile + Swizzled<HS>::offset(r, c * 8));
  }
}

// Lane addresses (row, col within the tile) for the two x4 patterns the kernels use:
//   pattern 16: lanes 0-15 address rows 0-15 at column 0, lanes 16-31 rows 0-15 at column 8.
//     ldmatrix of a [m][k] tile -> the A fragment of a 16x16 block;
//     ldmatrix.trans of a [k][n] tile -> B fragments {b0, b1} of n-tile n0, then of n-tile n0+8.
//   pattern 8x2: lanes 8m..8m+7 address rows 8(m/2)..+7 at column 8(m%2).
//     ldmatrix of a [n][k] tile -> B fragments {b0, b1} of n-tile n0, then of n-tile n0+8;
//     ldmatrix.trans of a [k][m] tile -> the A fragment of a 16x16 block.
__device__ __forceinline__ int ldm16_row(int lane) { return lane & 15; }
__device__ __forceinline__ int ldm16_col(int lane) { return (lane >> 4) * 8; }
__device__ __forceinline__ int ldm8x2_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
__device__ __forceinline__ int ldm8x2_col(int lane) { return ((lane >> 3) & 1) * 8; }

// The lane-dependent part of the ldmatrix addresses a warp sends into a Swizzled<COLS> tile, for
// rows R + lr and columns C + lc, (lr, lc) the lane's place in one of the patterns above, R a
// multiple of 8 and C of 16. R leaves the swizzle alone and C only flips known chunk bits, so a
// lane needs (kMask + 1) / 2 byte offsets and each (R, C) of an unrolled loop adds an immediate:
// a few registers instead of one address per (R, C).
template <int COLS>
struct SwizzledLane {
  static constexpr int kMask = Swizzled<COLS>::kMask, kOffsets = (kMask + 1) / 2;
  uint32_t off[kOffsets];
  __device__ __forceinline__ SwizzledLane(int lr, int lc) {
    const int x = ((lc >> 3) ^ lr) & kMask;
#pragma unroll
    for (int i = 0; i < kOffsets; ++i) off[i] = uint32_t(lr * COLS + ((2 * i) ^ x) * 8) * 2u;
  }
  // Byte offset of element (R + lr, C + lc) from the tile's start.
  __device__ __forceinline__ uint32_t operator()(int R, int C) const {
    const int c8 = C / 8;
    return off[(c8 & kMask) / 2] + uint32_t(R * COLS + (c8 & ~kMask) * 8) * 2u;
  }
};

}  // namespace megatron::ops::cuda::attention_detail
