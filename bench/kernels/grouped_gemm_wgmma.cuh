#pragma once
// A Hopper variant of the grouped GEMM forward for the kernel lab (grouped_gemm.cu beside this),
// not yet in the library: the same tile scheduler, cp.async pipeline and 128B-swizzled shared tiles
// as ops/cuda/grouped_gemm_kernels.cuh, but the products on WGMMA (wgmma.mma_async m64n256k16,
// operands read from shared memory through matrix descriptors) instead of mma.sync. Forward only
// (both operands K-major, the layout WGMMA reads untransposed); needs sm_90a
// (-gencode arch=compute_90a,code=sm_90a).
// Whether it computes the right values is checked by the lab against the per-expert cuBLASLt loop.
//
// Layout: the shared tiles of Swizzled<64> (rows of 64 bf16 = 128 bytes, 16-byte chunk c of row r
// at c ^ (r % 8)) are exactly WGMMA's 128-byte swizzle when a tile starts 1024-byte aligned (the
// hardware XORs address bits 4-6 with bits 7-9). A descriptor: start address / 16 (bits 0-13),
// leading byte offset / 16 (16-29; unused by swizzled K-major layouts, 1), stride byte offset / 16
// (32-45; 1024 = 8 rows of 128 bytes between 8-row groups), swizzle mode (62-63; 1 = 128 bytes).
// A k step of 16 elements moves the start address by 32 bytes within the swizzled rows.
// Two warpgroups (256 threads) each compute 64 rows x 256 columns of the 128 x 256 block tile;
// accumulator register 4i + {0,1} of a lane holds row 16 (warp % 4) + lane / 4, columns
// 8 i + 2 (lane % 4) + {0,1} of its warpgroup's rows; 4i + {2,3} the row 8 below.
#include "megatron/ops/cuda/grouped_gemm_kernels.cuh"

namespace megatron::ops::cuda::grouped_gemm_detail {

struct WgmmaTiles {
  static constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, kThreads = 256;
  static constexpr int kStageElems = (BM + BN) * BK;
  static constexpr int kSmemBytes = STAGES * kStageElems * 2 + 1024;  // + room to align to 1024
};

__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_byte_addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}

__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                      int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  __trap();  // built without sm_90a: see the lab's build command
#endif
}

// The warpgroup-wide ordering around a batch of WGMMAs (sm_90a; trap elsewhere, as above).
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Commits the WGMMAs issued since the last commit as one group and waits until at most
// IN_FLIGHT groups are still running.
template <int IN_FLIGHT>
__device__ __forceinline__ void wgmma_commit_and_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(IN_FLIGHT) : "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Pins the accumulators at this point of the program: the compiler may not move their reads or
// writes across it, so none lands between a WGMMA's issue and its completion.
__device__ __forceinline__ void fence_accumulators(float (&acc)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// IN_FLIGHT: WGMMA groups (one per k tile) left running while the next k tile is issued: 0 waits
// for each tile's products before the next; 1 keeps one running, so the copies refill the buffer
// of tile kt - 2 (prefetch distance STAGES - 2) rather than kt - 1, whose products may still read it.
template <int IN_FLIGHT>
__global__ void __launch_bounds__(WgmmaTiles::kThreads, 1)
    grouped_forward_wgmma_kernel(const GroupedGemmArgs<__nv_bfloat16, __nv_bfloat16> args, const GroupTable table) {
  using T = __nv_bfloat16;
  using Cfg = WgmmaTiles;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int kAhead = STAGES - 1 - IN_FLIGHT;  // k tiles loaded ahead of the one multiplied
  static_assert(IN_FLIGHT == 0 || IN_FLIGHT == 1, "one WGMMA group in flight at most");
  extern __shared__ __align__(128) unsigned char wgmma_smem_raw[];
  // 1024-byte alignment of every tile (the swizzle is computed from address bits).
  const uint32_t raw_addr = smem_addr(wgmma_smem_raw);
  T* smem = reinterpret_cast<T*>(wgmma_smem_raw + ((1024 - raw_addr % 1024) % 1024));

  const int tile = int(blockIdx.x);
  const int e = group_of_tile(table, tile);
  const int row_begin = table.row_begin[e], M = table.row_begin[e + 1] - row_begin;
  const int N = args.N, K = args.K;
  const int local = tile - table.tile_begin[e];
  const int m_tiles = (M + BM - 1) / BM;
  const int m0 = (local % m_tiles) * BM, n0 = (local / m_tiles) * BN;
  const T* a = args.a + int64_t(row_begin) * args.lda;
  const T* b = args.b + int64_t(e) * args.b_expert_stride;
  T* c = args.c + int64_t(row_begin) * args.ldc;

  const auto stage_a = [&](int s) { return smem + s * Cfg::kStageElems; };
  const auto stage_b = [&](int s) { return smem + s * Cfg::kStageElems + BM * BK; };
  const auto load_stage = [&](int s, int kt) {
    load_operand<Major::k, BM, BK, Cfg::kThreads>(stage_a(s), a, args.lda, m0, kt * BK, M, K);
    load_operand<Major::k, BN, BK, Cfg::kThreads>(stage_b(s), b, args.ldb, n0, kt * BK, N, K);
  };
  const int k_tiles = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  const int warpgroup = int(threadIdx.x) / 128;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kAhead - 1>();  // tile kt has landed (this thread's copies)
    // This thread's copies have landed; make them visible to the async proxy WGMMA reads through,
    // then wait for every thread's.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    // Refills the buffer of tile kt - 1 - IN_FLIGHT, whose WGMMAs every warpgroup has waited for
    // (before the barrier above).
    const int next = kt + kAhead;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();

    const uint32_t sa = smem_addr(stage_a(kt % STAGES)) + uint32_t(warpgroup * 64 * BK * 2);
    const uint32_t sb = smem_addr(stage_b(kt % STAGES));
    const uint64_t desc_a = wgmma_desc(sa), desc_b = wgmma_desc(sb);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) wgmma_m64n256k16_bf16(acc, desc_a + 2 * kk, desc_b + 2 * kk, 1);
    wgmma_commit_and_wait<IN_FLIGHT>();
    fence_accumulators(acc);
  }
  wgmma_wait_all();
  fence_accumulators(acc);
  attention_detail::cp_async_wait_all();

  const int lane = int(threadIdx.x) % 32, warp_in_group = (int(threadIdx.x) / 32) % 4;
  const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = m0 + warpgroup * 64 + 16 * warp_in_group + g + 8 * half;
    if (row >= M) continue;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      const int col = n0 + 8 * i + t2;
      if (col < N) store_pair(c + int64_t(row) * args.ldc + col, acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
    }
  }
}

// y rows of e = x rows of e W_e^T on WGMMA (bf16), one launch over every expert.
template <int IN_FLIGHT>
void grouped_forward_wgmma(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int64_t in,
                                  int64_t out, const int64_t* counts, int experts, cudaStream_t stream) {
  const GroupedGemmArgs<__nv_bfloat16, __nv_bfloat16> args{x, weight, y, in, in, out, out * in, 0, 0, int(out), int(in)};
  using SameTiles = Tiles<WgmmaTiles::BM, WgmmaTiles::BN, WgmmaTiles::BK, 2, 4, WgmmaTiles::STAGES>;  // the table's view
  GroupTable table;
  const int total = fill_table<SameTiles, false>(table, [counts](int e) { return counts[e]; }, experts, 0, int(out));
  if (total == 0) return;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(grouped_forward_wgmma_kernel<IN_FLIGHT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    WgmmaTiles::kSmemBytes));
    return true;
  }();
  (void)configured;
  grouped_forward_wgmma_kernel<IN_FLIGHT><<<total, WgmmaTiles::kThreads, WgmmaTiles::kSmemBytes, stream>>>(args, table);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace megatron::ops::cuda::grouped_gemm_detail
