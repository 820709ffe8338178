#pragma once
// The bf16/f16 grouped GEMM kernel of the MoE experts (grouped_gemm.cu; the kernel lab
// bench/kernels/grouped_gemm.cu times its tile shapes): every expert's product in ONE launch.
//
// One launch computes, for each expert e with rows, C_e (M,N) = A_e (M,K) B_e (K,N), fp32
// accumulation on the tensor cores (mma.sync m16n8k16 fed by ldmatrix from swizzled shared tiles
// that a STAGES-deep cp.async pipeline fills). The three products of grouped_gemm.h, row-major,
// N_e the expert's token rows starting at row r_e:
//   forward  y_e  = x_e  W_e^T : A = x rows    [m][k], B = W_e      [n][k], C = y rows  (T)
//   dgrad    dx_e = dy_e W_e   : A = dy rows   [m][k], B = W_e      [k][n], C = dx rows (T)
//   wgrad    dW_e += dy_e^T x_e: A = dy rows   [k][m], B = x rows   [k][n], C = dW_e (fp32, +=)
// so the token rows are M (forward, dgrad) or K (wgrad): the kernel's ROWS_ARE_K.
//
// The tile scheduler: blockIdx.x is a global tile number; the GroupTable holds, per expert, its
// first token row and its first tile (prefix sums of the row counts and of the tiles each expert
// needs), and a block binary-searches it for its expert. An expert without rows has no tiles.
// Within an expert, tiles run down M first, so consecutive blocks share one B column block. The
// table comes from host counts (a kernel parameter), or, when only the device knows the counts
// (routing on the device, ops/moe_routing.h), a one-thread kernel builds it in device memory
// from the row offsets; the grid is then the bound on the tiles any split of the rows can need
// (each expert at most one partial M tile more), and the blocks past the table's total leave at
// once. Either way the host reads nothing back.
//
// Edges: a tile reaching past M, N or K loads zeros (cp.async's zero fill) and stores only its
// rows and columns inside the matrix. The host guarantees (mma_applies in grouped_gemm.cu) that
// both widths (in, out) are multiples of 8 and every base pointer 16-byte aligned, so a 16-byte
// chunk of 8 elements is either wholly inside a row or wholly past its end; the token-row count is
// free.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "megatron/ops/cuda/attention_common.cuh"  // the tensor-core building blocks (mma, ldmatrix, cp.async)
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda::grouped_gemm_detail {

using attention_detail::cp_async_16;
using attention_detail::cp_async_commit;
using attention_detail::cp_async_wait;
using attention_detail::ldm16_col;
using attention_detail::ldm16_row;
using attention_detail::ldm8x2_col;
using attention_detail::ldm8x2_row;
using attention_detail::ldmatrix_x4;
using attention_detail::ldmatrix_x4_trans;
using attention_detail::mma_16816;
using attention_detail::smem_addr;
using attention_detail::Swizzled;
using attention_detail::SwizzledLane;

// Experts one launch takes; the table travels as a kernel parameter (2 KiB). DeepSeek-V3's 256
// routed experts fit on one rank.
constexpr int kMaxGroups = 256;

// Per expert e < groups: its token rows are [row_begin[e], row_begin[e + 1]), its tiles
// [tile_begin[e], tile_begin[e + 1]).
struct GroupTable {
  int groups;
  int row_begin[kMaxGroups + 1];
  int tile_begin[kMaxGroups + 1];
};

// Shared by every expert. Strides are in elements. Offsets of expert e's operands:
//   A: a + row_begin[e] lda (the token rows in either product)
//   B: ROWS_ARE_K ? b + row_begin[e] ldb : b + e b_expert_stride
//   C: ROWS_ARE_K ? c + e c_expert_stride : c + row_begin[e] ldc
// M (unless ROWS_ARE_K) or K (when ROWS_ARE_K) is the expert's row count; the other two are fixed.
template <class T, class TC>
struct GroupedGemmArgs {
  const T* a;
  const T* b;
  TC* c;
  int64_t lda, ldb, ldc;
  int64_t b_expert_stride, c_expert_stride;
  int M, N, K;  // the fixed ones; the row dimension is taken from the table
};

// The operands' layouts in memory: K-contiguous ([m][k] for A, [n][k] for B) or not ([k][m], [k][n]).
enum class Major { k, mn };

// A tile configuration: BM x BN block tile, BK deep, WM x WN warps (each a (BM/WM) x (BN/WN)
// warp tile), STAGES shared buffers in the pipeline, MIN_BLOCKS asked of the register allocator.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, int MIN_BLOCKS_ = 1>
struct Tiles {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int kMi = kWarpM / 16, kNi = kWarpN / 8;  // mma tiles per warp
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0, "warp tiles are whole 16x16 blocks");
  // Elements of one stage: the A tile then the B tile (either layout holds BM*BK resp. BN*BK).
  static constexpr int kStageElems = (BM + BN) * BK;
  template <class T>
  static constexpr int smem_bytes() {
    return STAGES * kStageElems * int(sizeof(T));
  }
};

// The shared tile of an operand: rows x cols as stored (K-major: [mn][BK]; mn-major: [BK][mn]).
template <Major L, int MN, int BK>
struct OperandTile {
  static constexpr int kRows = L == Major::k ? MN : BK;
  static constexpr int kCols = L == Major::k ? BK : MN;
  using Swz = Swizzled<kCols>;
};

// Copies the operand tile at (mn0, k0) of a global matrix (row stride ld) into shared memory:
// chunks past the extents (mn_extent, k_extent) are zero-filled.
template <Major L, int MN, int BK, int NTHREADS, class T>
__device__ __forceinline__ void load_operand(T* tile, const T* base, int64_t ld, int mn0, int k0, int mn_extent,
                                             int k_extent) {
  using Tile = OperandTile<L, MN, BK>;
  constexpr int kChunks = Tile::kCols / 8;
  static_assert(Tile::kRows * kChunks % NTHREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < Tile::kRows * kChunks / NTHREADS; ++it) {
    const int idx = it * NTHREADS + int(threadIdx.x);
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    // K-major: row = mn, column = k; mn-major: row = k, column = mn.
    const int mn = L == Major::k ? mn0 + r : mn0 + c;
    const int k = L == Major::k ? k0 + c : k0 + r;
    const bool valid = mn < mn_extent && k < k_extent;
    const int64_t grow = L == Major::k ? mn : k, gcol = L == Major::k ? k : mn;
    const T* src = valid ? base + grow * ld + gcol : base;
    cp_async_16(tile + Tile::Swz::offset(r, c), src, valid);
  }
}

// Where this lane points ldmatrix inside an operand tile, for the warp's 16-wide blocks
// b = 0..BLOCKS-1 at mn = warp_mn + 16 b and a k step kk (a multiple of 16), with (lr, lc) the
// lane's place in its ldmatrix pattern:
//   K-major ([mn][k]): row warp_mn + 16 b + lr, column kk + lc. Whole 8-row groups leave the
//     swizzle alone, so the row is a plain add and SwizzledLane resolves kk (unrolled) to an
//     immediate;
//   mn-major ([k][mn]): row kk + lr (again a plain add), column warp_mn + 16 b + lc: the warp's
//     offset is known only at run time, so each block's offset is computed once up front (a
//     SwizzledLane indexed by it would go through local memory).
template <Major L, int MN, int BK, int BLOCKS>
struct LaneAddresses {
  using Tile = OperandTile<L, MN, BK>;
  static constexpr int kCols = Tile::kCols;
  SwizzledLane<kCols> lane;  // K-major
  uint32_t block[BLOCKS];    // mn-major: byte offset of (lr, warp_mn + 16 b + lc)
  int warp_mn;
  __device__ __forceinline__ LaneAddresses(int lr, int lc, int warp_mn_) : lane(lr, lc), warp_mn(warp_mn_) {
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) block[b] = uint32_t(Tile::Swz::offset(lr, warp_mn + 16 * b + lc)) * 2u;
  }
  __device__ __forceinline__ uint32_t operator()(int b, int kk) const {
    if constexpr (L == Major::k) {
      return lane(warp_mn + 16 * b, kk);
    } else {
      return block[b] + uint32_t(kk * kCols) * 2u;
    }
  }
};

// This warp's A fragments of k-step kk: afrag[i] covers rows wm + 16 i .. + 15.
template <Major L, int BM, int BK, int MI>
struct AFragments {
  LaneAddresses<L, BM, BK, MI> at;
  // [m][k]: pattern 16; [k][m]: pattern 8x2, transposed.
  __device__ __forceinline__ AFragments(int lane, int wm)
      : at(L == Major::k ? ldm16_row(lane) : ldm8x2_row(lane), L == Major::k ? ldm16_col(lane) : ldm8x2_col(lane),
           wm) {}
  __device__ __forceinline__ void load(uint32_t (&afrag)[MI][4], uint32_t tile, int kk) const {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if constexpr (L == Major::k) {
        ldmatrix_x4(afrag[i], tile + at(i, kk));
      } else {
        ldmatrix_x4_trans(afrag[i], tile + at(i, kk));
      }
    }
  }
};

// This warp's B fragments of k-step kk: bfrag[j] = {b0, b1} of columns wn + 8 j .. + 7; one
// ldmatrix gives two n-tiles (a 16-wide block).
template <Major L, int BN, int BK, int NI>
struct BFragments {
  LaneAddresses<L, BN, BK, NI / 2> at;
  // [n][k]: pattern 8x2; [k][n]: pattern 16, transposed.
  __device__ __forceinline__ BFragments(int lane, int wn)
      : at(L == Major::k ? ldm8x2_row(lane) : ldm16_row(lane), L == Major::k ? ldm8x2_col(lane) : ldm16_col(lane),
           wn) {}
  __device__ __forceinline__ void load(uint32_t (&bfrag)[NI][2], uint32_t tile, int kk) const {
#pragma unroll
    for (int j = 0; j < NI; j += 2) {
      uint32_t r[4];
      if constexpr (L == Major::k) {
        ldmatrix_x4(r, tile + at(j / 2, kk));
      } else {
        ldmatrix_x4_trans(r, tile + at(j / 2, kk));
      }
      bfrag[j][0] = r[0], bfrag[j][1] = r[1], bfrag[j + 1][0] = r[2], bfrag[j + 1][1] = r[3];
    }
  }
};

// The expert owning global tile t: the last e with tile_begin[e] <= t (an expert without tiles
// shares its tile_begin with the next, which the search passes over).
__device__ __forceinline__ int group_of_tile(const GroupTable& table, int t) {
  int lo = 0, hi = table.groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.tile_begin[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Stores two adjacent results (row, col), (row, col + 1): rounded to T, or added to the fp32 C.
template <class TC>
__device__ __forceinline__ void store_pair(TC* p, float v0, float v1) {
  if constexpr (std::is_same_v<TC, float>) {
    float2 old = *reinterpret_cast<float2*>(p);
    old.x += v0, old.y += v1;
    *reinterpret_cast<float2*>(p) = old;
  } else {
    *reinterpret_cast<uint32_t*>(p) = attention_detail::pack2<TC>(v0, v1);
  }
}

// device_table: the table in device memory, or null for the one passed by value (grid_constant:
// read in place, not copied per thread).
template <class Cfg, Major LA, Major LB, bool ROWS_ARE_K, class T, class TC>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::MIN_BLOCKS)
    grouped_gemm_kernel(const GroupedGemmArgs<T, TC> args, const __grid_constant__ GroupTable host_table,
                        const GroupTable* device_table) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, MI = Cfg::kMi, NI = Cfg::kNi;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  // ---- which expert and which tile of it
  const GroupTable& table = device_table != nullptr ? *device_table : host_table;
  const int tile = int(blockIdx.x);
  if (tile >= table.tile_begin[table.groups]) return;  // past the tiles (a device table's grid is a bound)
  const int e = group_of_tile(table, tile);
  const int row_begin = table.row_begin[e], rows = table.row_begin[e + 1] - row_begin;
  const int M = ROWS_ARE_K ? args.M : rows, N = args.N, K = ROWS_ARE_K ? rows : args.K;
  const int local = tile - table.tile_begin[e];
  const int m_tiles = (M + BM - 1) / BM;
  const int m0 = (local % m_tiles) * BM, n0 = (local / m_tiles) * BN;
  const T* a = args.a + int64_t(row_begin) * args.lda;
  const T* b = ROWS_ARE_K ? args.b + int64_t(row_begin) * args.ldb : args.b + int64_t(e) * args.b_expert_stride;
  TC* c = ROWS_ARE_K ? args.c + int64_t(e) * args.c_expert_stride : args.c + int64_t(row_begin) * args.ldc;

  // ---- the pipeline: stage s holds A then B of k tile kt (s = kt % STAGES)
  const auto stage_a = [&](int s) { return smem + s * Cfg::kStageElems; };
  const auto stage_b = [&](int s) { return smem + s * Cfg::kStageElems + BM * BK; };
  const auto load_stage = [&](int s, int kt) {
    const int k0 = kt * BK;
    load_operand<LA, BM, BK, Cfg::kThreads>(stage_a(s), a, args.lda, m0, k0, M, K);
    load_operand<LB, BN, BK, Cfg::kThreads>(stage_b(s), b, args.ldb, n0, k0, N, K);
  };
  const int k_tiles = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();  // an empty group when there is no tile: the wait counts stay uniform
  }

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = (warp % Cfg::WM) * Cfg::kWarpM, wn = (warp / Cfg::WM) * Cfg::kWarpN;
  const AFragments<LA, BM, BK, MI> a_frags(lane, wm);
  const BFragments<LB, BN, BK, NI> b_frags(lane, wn);
  float acc[MI][NI][4] = {};

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread's copies) ...
    __syncthreads();              // ... and for every thread's; everyone is done with tile kt - 1
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);  // refills the buffer of tile kt - 1
    cp_async_commit();

    const uint32_t sa = smem_addr(stage_a(kt % STAGES)), sb = smem_addr(stage_b(kt % STAGES));
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t afrag[MI][4], bfrag[NI][2];
      a_frags.load(afrag, sa, kk);
      b_frags.load(bfrag, sb, kk);
#pragma unroll
      for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) mma_16816<T>(acc[i][j], afrag[i], bfrag[j][0], bfrag[j][1]);
      }
    }
  }
  attention_detail::cp_async_wait_all();

  // ---- epilogue: lane (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 tile;
  // N is a multiple of 8, so a pair is inside the matrix whenever its first column is.
  const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + wm + 16 * i + g + 8 * half;
      if (row >= M) continue;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int col = n0 + wn + 8 * j + t2;
        if (col < N) store_pair(c + int64_t(row) * args.ldc + col, acc[i][j][2 * half], acc[i][j][2 * half + 1]);
      }
    }
  }
}

// Tiles of expert e's (M, N) output: none for an expert without rows.
template <class Cfg>
__host__ __device__ int tiles_of(int M, int N) {
  if (M == 0 || N == 0) return 0;
  return ((M + Cfg::BM - 1) / Cfg::BM) * ((N + Cfg::BN - 1) / Cfg::BN);
}

// Fills the table from the row counts (count_of(e); every count must fit an int, every row offset
// too) and returns the total number of tiles. fixed_m: the M of every expert when the rows are K.
template <class Cfg, bool ROWS_ARE_K, class CountOf>
__host__ __device__ int fill_table(GroupTable& table, const CountOf& count_of, int groups, int fixed_m, int N) {
  table.groups = groups;
  table.row_begin[0] = 0;
  table.tile_begin[0] = 0;
  for (int e = 0; e < groups; ++e) {
    const int rows = int(count_of(e));
    table.row_begin[e + 1] = table.row_begin[e] + rows;
    // ROWS_ARE_K: an expert without rows has K = 0 and adds nothing to dW, so it gets no tiles.
    const int tiles = ROWS_ARE_K ? (rows == 0 ? 0 : tiles_of<Cfg>(fixed_m, N)) : tiles_of<Cfg>(rows, N);
    table.tile_begin[e + 1] = table.tile_begin[e] + tiles;
  }
  return table.tile_begin[groups];
}

// The device table from the E+1 row offsets (one thread: E is at most kMaxGroups).
template <class Cfg, bool ROWS_ARE_K>
__global__ void build_table_kernel(GroupTable* table, const int32_t* offsets, int groups, int fixed_m, int N) {
  fill_table<Cfg, ROWS_ARE_K>(*table, [offsets](int e) { return offsets[e + 1] - offsets[e]; }, groups, fixed_m, N);
}

// Where the experts' rows are: host counts, or device row offsets (E+1 i32) with the total rows.
struct RowGroups {
  const int64_t* counts;  // host, or null
  const int32_t* offsets;  // device, or null
  int groups;
  int total_rows;
};

// Launches one product over every expert on `stream`; nothing when no expert has tiles.
// device_table: scratch device memory for a GroupTable (used with device offsets only).
template <class Cfg, Major LA, Major LB, bool ROWS_ARE_K, class T, class TC>
void launch_grouped_gemm(const GroupedGemmArgs<T, TC>& args, const RowGroups& rows, GroupTable* device_table,
                         cudaStream_t stream) {
  GroupTable table{};  // passed by value: the launch copies it into the kernel's parameters
  int grid = 0;
  if (rows.counts != nullptr) {
    grid = fill_table<Cfg, ROWS_ARE_K>(table, [&rows](int e) { return rows.counts[e]; }, rows.groups, args.M, args.N);
    device_table = nullptr;
  } else {
    table.groups = 0;  // unused: the kernel reads device_table
    build_table_kernel<Cfg, ROWS_ARE_K><<<1, 1, 0, stream>>>(device_table, rows.offsets, rows.groups, args.M, args.N);
    CUDA_CHECK(cudaGetLastError());
    grid = ROWS_ARE_K ? rows.groups * tiles_of<Cfg>(args.M, args.N)
                      : tiles_of<Cfg>(rows.total_rows + rows.groups * Cfg::BM, args.N);
  }
  if (grid == 0) return;
  auto* kernel = grouped_gemm_kernel<Cfg, LA, LB, ROWS_ARE_K, T, TC>;
  constexpr int smem = Cfg::template smem_bytes<T>();
  static const bool configured = [kernel] {  // above 48 KB a kernel must opt in to its shared memory
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(args, table, device_table);
  CUDA_CHECK(cudaGetLastError());
}

// ---- the three products of grouped_gemm.h on raw device pointers (row-major, contiguous):
// x (N,in), y (N,out), dy (N,out), dx (N,in), weight (E,out,in), dweight (E,out,in) fp32; rows:
// the E experts' row counts (host) or row offsets (device), summing to N.

// y rows of e = x rows of e W_e^T: A = x [m][k], B = W_e [n][k].
template <class Cfg, class T>
void grouped_forward(T* y, const T* x, const T* weight, int64_t in, int64_t out, const RowGroups& rows,
                     GroupTable* device_table, cudaStream_t stream) {
  const GroupedGemmArgs<T, T> args{x, weight, y, in, in, out, out * in, 0, 0, int(out), int(in)};
  launch_grouped_gemm<Cfg, Major::k, Major::k, false>(args, rows, device_table, stream);
}

// dx rows of e = dy rows of e W_e: A = dy [m][k], B = W_e (out,in) read as [k][n].
template <class Cfg, class T>
void grouped_dgrad(T* dx, const T* dy, const T* weight, int64_t in, int64_t out, const RowGroups& rows,
                   GroupTable* device_table, cudaStream_t stream) {
  const GroupedGemmArgs<T, T> args{dy, weight, dx, out, in, in, out * in, 0, 0, int(in), int(out)};
  launch_grouped_gemm<Cfg, Major::k, Major::mn, false>(args, rows, device_table, stream);
}

// dW_e (out,in) += dy_e^T x_e: A = dy rows read as [k][m], B = x rows as [k][n], K = the expert's rows.
template <class Cfg, class T>
void grouped_wgrad(float* dweight, const T* dy, const T* x, int64_t in, int64_t out, const RowGroups& rows,
                   GroupTable* device_table, cudaStream_t stream) {
  const GroupedGemmArgs<T, float> args{dy, x, dweight, out, in, in, 0, out * in, int(out), int(in), 0};
  launch_grouped_gemm<Cfg, Major::mn, Major::mn, true>(args, rows, device_table, stream);
}

}  // namespace megatron::ops::cuda::grouped_gemm_detail
