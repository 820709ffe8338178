#pragma once
// Attention backward kernels (FlashAttention-2's algorithm), as templates over their tile shape:
// attention_backward.cu instantiates the shapes it ships, the kernel lab
// (bench/kernels/attention.cu) times others beside them. With P = exp(scale q k^T - lse), M the
// dropout multipliers and D_i = dout_i . out_i:
//   dV_j = sum_i P_ij M_ij dout_i,  dP_ij = M_ij dout_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
//   dQ_i = scale sum_j dS_ij k_j,   dK_j = scale sum_i dS_ij q_i.
// A pre-kernel computes D; P is recomputed from the saved lse, never stored.
//
// bf16 or f16 with head dim 16/32/64/128: a block of W warps owns 16 W keys of one kv group (16 per
// warp) and walks every query tile of the group's r query heads (so GQA's sum over heads happens
// in registers), keeping dK and dV in fp32 registers and writing them once. Each step runs five
// tensor-core products: S^T = K Q^T, dV += (P M)^T dO, dP^T = V dO^T, dK += dS^T Q, and
// dQ += dS K, the last through shared memory (dS^T changes owner from key rows to query rows)
// and fp32 atomics into a workspace that a final kernel scales and converts. Query tiles and
// their lse and D rows are double-buffered with cp.async. Larger key blocks mean fewer dQ
// atomics (each block adds its share to every query row it sees).
//
// f32, other head dims and misaligned tensors: generic kernels (one warp per query row for dQ,
// one per key row for dK and dV), deterministic and without atomics.
#include "megatron/ops/cuda/attention_common.cuh"

namespace megatron::ops::cuda::attention_detail {

template <class T>
struct BackwardArgs {
  T* dq;
  T* dk;
  T* dv;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const T* out;
  const float* lse;  // (B,NH,S)
  float* D;          // (B,NH,S): dout . out per row
  float* dq_acc;     // (S,B,NH,HS) fp32, tensor-core path only
  Dims d;
  bool causal;
  KeyMask mask;  // document masking (segment ids or packed documents) and sliding window
  float scale;
  float dropout_p;
  CounterRng rng;
};

template <class T>
BackwardArgs<T> backward_args(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p,
                              const Dims& d) {
  return {static_cast<T*>(dq.raw()),
          static_cast<T*>(dk.raw()),
          static_cast<T*>(dv.raw()),
          static_cast<const T*>(dout.raw()),
          static_cast<const T*>(q.raw()),
          static_cast<const T*>(k.raw()),
          static_cast<const T*>(v.raw()),
          static_cast<const T*>(out.raw()),
          lse.data<float>(),
          nullptr,
          nullptr,
          d,
          p.causal,
          key_mask_of(p),
          p.softmax_scale,
          p.dropout_p,
          CounterRng{p.seed, p.stream}};
}

// D (B,NH,S) = rowsum(dout * out), one warp per row of (S,B,NH) order so reads are contiguous.
template <class T>
__global__ void attention_row_dot_kernel(float* D, const T* dout, const T* out, Dims d) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (s*B + b)*NH + h
  if (row >= int64_t(d.S) * d.B * d.NH) return;
  const int lane = int(threadIdx.x) % 32;
  float sum = 0.0f;
  for (int e = lane; e < d.HS; e += 32) sum += to_float(dout[row * d.HS + e]) * to_float(out[row * d.HS + e]);
  sum = warp_reduce(sum, SumOp{});
  if (lane == 0) {
    const int64_t s = row / (int64_t(d.B) * d.NH), bh = row % (int64_t(d.B) * d.NH);
    D[bh * d.S + s] = sum;
  }
}

template <class T>
void launch_row_dot(const BackwardArgs<T>& a) {
  const int64_t rows = int64_t(a.d.S) * a.d.B * a.d.NH;
  attention_row_dot_kernel<T>
      <<<unsigned(ceil_div(rows, kThreads / 32)), kThreads, 0, stream()>>>(a.D, a.dout, a.out, a.d);
  CUDA_CHECK_LAUNCH();
}

// dq = dq_acc * scale, converted to T.
template <class T>
__global__ void attention_dq_convert_kernel(T* dq, const float* dq_acc, int64_t n, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dq[i] = from_float<T>(dq_acc[i] * scale);
}

// ---- tensor-core kernel ---------------------------------------------------------------------

// Tile shape: W warps of 16 keys each, BM query rows per step, MIN_BLOCKS resident blocks per SM
// asked of the register allocator.
template <int HS_, int W, int BM, int MIN_BLOCKS>
struct BackwardTiles {
  static constexpr int HS = HS_, kWarps = W, kQueries = BM, kMinBlocks = MIN_BLOCKS;
  static constexpr int kThreads = 32 * W, kKeys = 16 * W;
  // K, V; Q and dO in two stages; dS^T (keys x queries); lse and D in two stages.
  static constexpr int smem_bytes() {
    return (2 * kKeys * HS + 4 * BM * HS + kKeys * BM) * int(sizeof(uint16_t)) + 4 * BM * int(sizeof(float));
  }
};

// Grid (B*G, key blocks): the first row of blocks, scheduled first, holds the causal pass's
// longest ones (the first keys, seen by every query).
template <class T, class Cfg, bool kDropout>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    attention_backward_mma_kernel(const BackwardArgs<T> a) {
  constexpr int HS = Cfg::HS, kN = Cfg::kKeys, BM = Cfg::kQueries, kThreads = Cfg::kThreads, kWarps = Cfg::kWarps;
  using Tile = Swizzled<HS>;
  using DsTile = Swizzled<BM>;
  static_assert(BM <= 64, "the dropout keep bits of one step fit in 32 bits");
  static_assert(kThreads >= 2 * BM, "one thread per lse or D entry of a query tile");
  // dQ = dS K: the warps cover (BM/16 m-tiles) x (kParts column ranges of the head dim).
  constexpr int kMTiles = BM / 16, kParts = kWarps / kMTiles, kPartCols = HS / kParts;
  static_assert(kWarps % kMTiles == 0 && kPartCols % 16 == 0, "each warp's dQ columns are whole n-tile pairs");

  extern __shared__ uint4 smem_words[];
  T* sK = reinterpret_cast<T*>(smem_words);               // (kN, HS)
  T* sV = sK + kN * HS;                                   // (kN, HS)
  T* sQ = sV + kN * HS;                                   // 2 x (BM, HS)
  T* sdO = sQ + 2 * BM * HS;                              // 2 x (BM, HS)
  T* sdS = sdO + 2 * BM * HS;                             // (kN, BM): dS^T
  float* sLse = reinterpret_cast<float*>(sdS + kN * BM);  // 2 x BM
  float* sD = sLse + 2 * BM;                              // 2 x BM

  const Dims& d = a.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int j0 = int(blockIdx.y) * kN;
  const int b = int(blockIdx.x) / d.G, grp = int(blockIdx.x) % d.G, r = d.group_size();
  const int64_t qs = d.q_row_stride(), kvs = d.kv_row_stride();
  const int64_t kv_off = (int64_t(b) * d.G + grp) * HS;

  load_tile_async<kN, HS, kThreads>(sK, a.k + kv_off, kvs, j0, d.S);
  load_tile_async<kN, HS, kThreads>(sV, a.v + kv_off, kvs, j0, d.S);

  // Steps: the query tiles of each of the group's heads; causally only tiles reaching key j0; with
  // packed documents only those of the block's keys' documents (the work follows sum len^2).
  const RowsDocuments key_docs = a.mask.documents_of_rows(d, b, j0, min(j0 + kN, d.S) - 1);
  const int first_tile = max(a.causal ? j0 : 0, key_docs.first.begin) / BM;
  const int tiles_per_head = (key_docs.last.end + BM - 1) / BM - first_tile;
  const int steps = r * tiles_per_head;
  const auto prefetch = [&](int step, int stage) {
    const int h = grp * r + step / tiles_per_head, i0 = (first_tile + step % tiles_per_head) * BM;
    const int64_t q_off = (int64_t(b) * d.NH + h) * HS;
    load_tile_async<BM, HS, kThreads>(sQ + stage * BM * HS, a.q + q_off, qs, i0, d.S);
    load_tile_async<BM, HS, kThreads>(sdO + stage * BM * HS, a.dout + q_off, qs, i0, d.S);
    // Padded query rows get lse = D = 0: their q and dout rows are zero, so P = 1 there meets
    // only zeros in every product, and their dQ is never stored.
    if (int(threadIdx.x) < 2 * BM) {
      const bool is_d = int(threadIdx.x) >= BM;
      const int row = int(threadIdx.x) % BM;
      const bool valid = i0 + row < d.S;
      const float* src = (is_d ? a.D : a.lse) + (int64_t(b) * d.NH + h) * d.S + (valid ? i0 + row : 0);
      cp_async_4((is_d ? sD : sLse) + stage * BM + row, src, valid);
    }
  };
  prefetch(0, 0);
  cp_async_commit();

  const float scale_log2 = a.scale * kLog2e;
  const float keep_scale = 1.0f / (1.0f - a.dropout_p);
  const int key0 = j0 + warp * 16 + g;  // this thread's keys: key0 (c0, c1) and key0 + 8 (c2, c3)
  const SwizzledLane<HS> l16(ldm16_row(lane), ldm16_col(lane)), l8x2(ldm8x2_row(lane), ldm8x2_col(lane));
  const uint32_t k_addr = smem_addr(sK + warp * 16 * HS), v_addr = smem_addr(sV + warp * 16 * HS);
  // dQ operands: this warp's m-tile of dS (rows of sdS^T read transposed) and column range of K.
  const int dq_mt = warp % kMTiles, dq_c0 = (warp / kMTiles) * kPartCols;
  const uint32_t ds_addr = smem_addr(sdS + DsTile::offset(ldm8x2_row(lane), dq_mt * 16 + ldm8x2_col(lane)));
  uint32_t kq_addr[kPartCols / 16];
#pragma unroll
  for (int np = 0; np < kPartCols / 16; ++np)
    kq_addr[np] = smem_addr(sK + Tile::offset(ldm16_row(lane), dq_c0 + np * 16 + ldm16_col(lane)));
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

  for (int step = 0; step < steps; ++step) {
    cp_async_wait_all();
    __syncthreads();  // step's tiles are in place; every warp is done with the previous step
    if (step + 1 < steps) prefetch(step + 1, (step + 1) & 1);
    cp_async_commit();
    const int stage = step & 1;
    const int h = grp * r + step / tiles_per_head, i0 = (first_tile + step % tiles_per_head) * BM;
    const uint32_t q_addr = smem_addr(sQ + stage * BM * HS), do_addr = smem_addr(sdO + stage * BM * HS);
    const float* lse_s = sLse + stage * BM;
    const float* D_s = sD + stage * BM;
    // Causally, keys w*16.. of the block that come after the tile's last query see nothing of
    // it: their warp skips the step and the dQ product skips their dS^T rows (never written).
    const auto keys_active = [&](int w) { return !a.causal || j0 + w * 16 <= i0 + BM - 1; };

    if (keys_active(warp)) {
      // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys x BM queries.
      float p[BM / 8][4] = {}, dp[BM / 8][4] = {};
#pragma unroll
      for (int ks = 0; ks < HS / 16; ++ks) {
        uint32_t ka[4], va[4];
        ldmatrix_x4(ka, k_addr + l16(0, ks * 16));
        ldmatrix_x4(va, v_addr + l16(0, ks * 16));
#pragma unroll
        for (int np = 0; np < BM / 16; ++np) {
          uint32_t qf[4], df[4];
          ldmatrix_x4(qf, q_addr + l8x2(np * 16, ks * 16));
          ldmatrix_x4(df, do_addr + l8x2(np * 16, ks * 16));
          mma_16816<T>(p[2 * np], ka, qf[0], qf[1]);
          mma_16816<T>(p[2 * np + 1], ka, qf[2], qf[3]);
          mma_16816<T>(dp[2 * np], va, df[0], df[1]);
          mma_16816<T>(dp[2 * np + 1], va, df[2], df[3]);
        }
      }

      // P^T = 2^(s scale log2e - lse log2e), 0 where masked; dropout keep bits; then
      // dS^T = P (M dP - D), and P becomes P M for the dV product.
      const int key_lo = j0 + warp * 16;
      const bool edge = key_lo + 16 > d.S || (a.causal && key_lo + 15 > i0) ||
                        (a.mask.any() && a.mask.masks_tile(a.mask.documents_of_rows(d, b, i0, min(i0 + BM, d.S) - 1),
                                                           key_lo, key_lo + 15));
      uint32_t keep_bits = 0xffffffffu;
      if constexpr (kDropout) {
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int query = i0 + nt * 8 + 2 * t + (e & 1), key = key0 + (e >> 1) * 8;
            if (query < d.S && key < d.S &&
                !dropout_keep(a.rng, dropout_row_base(d, b, h, query) + uint64_t(key), a.dropout_p))
              keep_bits &= ~(1u << (nt * 4 + e));
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt) {
        const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + nt * 8 + 2 * t);
        const float2 D2 = *reinterpret_cast<const float2*>(D_s + nt * 8 + 2 * t);
        const float neg_lse[2] = {-lse2.x * kLog2e, -lse2.y * kLog2e}, Dc[2] = {D2.x, D2.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pr = fast_exp2(fmaf(p[nt][e], scale_log2, neg_lse[e & 1]));
          if (edge) {
            const int key = key0 + (e >> 1) * 8, query = i0 + nt * 8 + 2 * t + (e & 1);
            if (key >= d.S || (a.causal && key > query) ||
                (query < d.S && (a.mask.hidden(d, b, query, key) || a.mask.outside_document(d, b, query, key))))
              pr = 0.0f;
          }
          float mult = 1.0f;
          if constexpr (kDropout) mult = (keep_bits >> (nt * 4 + e)) & 1u ? keep_scale : 0.0f;
          dp[nt][e] = pr * (mult * dp[nt][e] - Dc[e & 1]);  // now dS^T
          p[nt][e] = pr * mult;                             // now (P M)^T
        }
      }

      // dV += (P M)^T dO and dK += dS^T Q: the C tiles are A fragments over the query dimension.
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        const uint32_t pa[4] = {pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                                pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        const uint32_t sa[4] = {pack2<T>(dp[2 * kk][0], dp[2 * kk][1]), pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                                pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < HS / 16; ++np) {
          uint32_t df[4], qf[4];
          ldmatrix_x4_trans(df, do_addr + l16(kk * 16, np * 16));
          ldmatrix_x4_trans(qf, q_addr + l16(kk * 16, np * 16));
          mma_16816<T>(dv[2 * np], pa, df[0], df[1]);
          mma_16816<T>(dv[2 * np + 1], pa, df[2], df[3]);
          mma_16816<T>(dk[2 * np], sa, qf[0], qf[1]);
          mma_16816<T>(dk[2 * np + 1], sa, qf[2], qf[3]);
        }
        // dS^T to shared memory for the dQ product, which needs it with queries as rows.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int col = (2 * kk + half) * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(sdS + DsTile::offset(warp * 16 + g, col)) = sa[2 * half];
          *reinterpret_cast<uint32_t*>(sdS + DsTile::offset(warp * 16 + g + 8, col)) = sa[2 * half + 1];
        }
      }
    }
    __syncthreads();

    // dQ (BM x HS) += dS K over this block's active keys; this warp takes m-tile dq_mt, columns
    // [dq_c0, dq_c0 + kPartCols), and adds them into the fp32 workspace with atomics (blocks of
    // other key tiles add to the same rows).
    {
      float dq[kPartCols / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        if (!keys_active(kk)) continue;
        uint32_t da[4];
        ldmatrix_x4_trans(da, ds_addr + uint32_t(kk * 16 * BM * 2));
#pragma unroll
        for (int np = 0; np < kPartCols / 16; ++np) {
          uint32_t kf[4];
          ldmatrix_x4_trans(kf, kq_addr[np] + uint32_t(kk * 16 * HS * 2));
          mma_16816<T>(dq[2 * np], da, kf[0], kf[1]);
          mma_16816<T>(dq[2 * np + 1], da, kf[2], kf[3]);
        }
      }
      float* acc = a.dq_acc + (int64_t(b) * d.NH + h) * HS + dq_c0 + 2 * t;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = i0 + dq_mt * 16 + g + 8 * half;
        if (row < d.S) {
#pragma unroll
          for (int nt = 0; nt < kPartCols / 8; ++nt)
            atomic_add_f32x2(acc + row * qs + nt * 8, dq[nt][2 * half], dq[nt][2 * half + 1]);
        }
      }
    }
  }
  cp_async_wait_all();
  __syncthreads();  // every warp is done reading sK and sV: reuse them to stage dK and dV

  // dk = scale dK, dv = dV, through this warp's 16 rows of sK / sV for 16-byte stores.
#pragma unroll
  for (int nt = 0; nt < HS / 8; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * 16 + g + 8 * half, col = nt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(sK + Tile::offset(row, col)) =
          pack2<T>(dk[nt][2 * half] * a.scale, dk[nt][2 * half + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(sV + Tile::offset(row, col)) = pack2<T>(dv[nt][2 * half], dv[nt][2 * half + 1]);
    }
  }
  __syncwarp();
  store_tile<16, HS>(a.dk + kv_off, kvs, sK + warp * 16 * HS, j0 + warp * 16, d.S, lane, 32);
  store_tile<16, HS>(a.dv + kv_off, kvs, sV + warp * 16 * HS, j0 + warp * 16, d.S, lane, 32);
}

template <class Cfg, bool kDropout, class T>
void launch_backward_mma_kernel(const BackwardArgs<T>& a) {
  constexpr int smem = Cfg::smem_bytes();
  static const bool configured = [] {  // above 48 KB a kernel must opt in to its shared memory
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_mma_kernel<T, Cfg, kDropout>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const int64_t key_blocks = ceil_div(a.d.S, Cfg::kKeys);
  MEGATRON_CHECK(key_blocks <= 65535, "attention_backward: sequence length " << a.d.S << " needs " << key_blocks
                                                                             << " key blocks of " << Cfg::kKeys
                                                                             << " keys, above the grid limit 65535");
  const dim3 grid(unsigned(a.d.B * a.d.G), unsigned(key_blocks));
  attention_backward_mma_kernel<T, Cfg, kDropout><<<grid, Cfg::kThreads, smem, stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

// The whole tensor-core backward: D, the zeroed dQ workspace, the kernel, dQ's conversion.
// Dropout may take another tile shape: the mask's registers change which shape is fastest.
template <class Cfg, class DropoutCfg = Cfg, class T>
void run_backward_mma(BackwardArgs<T> a, Device device) {
  Tensor D = Tensor::empty(Shape{a.d.B, a.d.NH, a.d.S}, DType::f32, device);
  const int64_t n = int64_t(a.d.S) * a.d.B * a.d.NH * a.d.HS;
  Tensor dq_acc = Tensor::empty({n}, DType::f32, device);
  a.D = D.data<float>();
  a.dq_acc = dq_acc.data<float>();
  launch_row_dot(a);
  CUDA_CHECK(cudaMemsetAsync(a.dq_acc, 0, dq_acc.nbytes(), stream()));
  if (a.dropout_p > 0.0f) {
    launch_backward_mma_kernel<DropoutCfg, true>(a);
  } else {
    launch_backward_mma_kernel<Cfg, false>(a);
  }
  attention_dq_convert_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(a.dq, a.dq_acc, n, a.scale);
  CUDA_CHECK_LAUNCH();
}

// ---- generic kernels ------------------------------------------------------------------------

// dq, one warp per query row (b, h, i): 32 keys at a time the lanes compute dS_ij, then each
// lane accumulates its head dims of sum_j dS_ij k_j.
template <class T>
__global__ void attention_backward_dq_generic_kernel(const BackwardArgs<T> a) {
  extern __shared__ float generic_smem[];
  const Dims& d = a.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row_id = int64_t(blockIdx.x) * kGenericWarps + warp;  // (b, h, i)
  if (row_id >= int64_t(d.B) * d.NH * d.S) return;
  const int i = int(row_id % d.S), bh = int(row_id / d.S), b = bh / d.NH, h = bh % d.NH, grp = h / d.group_size();
  float* q_row = generic_smem + warp * (2 * d.HS + 32);
  float* do_row = q_row + d.HS;
  float* ds_buf = do_row + d.HS;
  const int64_t q_off = (int64_t(i) * d.B + b) * d.NH * d.HS + int64_t(h) * d.HS;
  for (int e = lane; e < d.HS; e += 32) {
    q_row[e] = to_float(a.q[q_off + e]);
    do_row[e] = to_float(a.dout[q_off + e]);
  }
  __syncwarp();
  const T* kb = a.k + (int64_t(b) * d.G + grp) * d.HS;
  const T* vb = a.v + (int64_t(b) * d.G + grp) * d.HS;
  const int64_t kvs = d.kv_row_stride();
  // Keys [first, len): causally up to i, and for packed documents within i's document.
  const DocumentSpan document = a.mask.document_span(d, b, i);
  const int first = document.begin, len = min(a.causal ? i + 1 : d.S, document.end);
  const float lse = a.lse[row_id], Di = a.D[row_id];
  const float keep_scale = 1.0f / (1.0f - a.dropout_p);
  const uint64_t drop_base = dropout_row_base(d, b, h, i);
  float acc[kMaxLaneDims] = {};
  for (int j0 = first; j0 < len; j0 += 32) {
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j < len && !a.mask.hidden(d, b, i, j)) {
      const float p = expf(a.scale * dot_row(q_row, kb + j * kvs, d.HS) - lse);
      const float mult = a.dropout_p > 0.0f ? dropout_factor(a.rng, drop_base, j, a.dropout_p, keep_scale) : 1.0f;
      ds = p * (mult * dot_row(do_row, vb + j * kvs, d.HS) - Di);
    }
    ds_buf[lane] = ds;
    __syncwarp();
    const int count = min(32, len - j0);
    for (int jj = 0; jj < count; ++jj) {
      const float dsj = ds_buf[jj];
      const T* k_row = kb + (j0 + jj) * kvs;
#pragma unroll
      for (int u = 0; u < kMaxLaneDims; ++u) {
        const int e = lane + 32 * u;
        if (e < d.HS) acc[u] += dsj * to_float(k_row[e]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int u = 0; u < kMaxLaneDims; ++u) {
    const int e = lane + 32 * u;
    if (e < d.HS) a.dq[q_off + e] = from_float<T>(a.scale * acc[u]);
  }
}

// dk, dv, one warp per key row (b, g, j): over the group's query heads and the queries that see
// key j, 32 at a time, the lanes compute P M and dS, then each lane accumulates its head dims.
template <class T>
__global__ void attention_backward_dkv_generic_kernel(const BackwardArgs<T> a) {
  extern __shared__ float generic_smem[];
  const Dims& d = a.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row_id = int64_t(blockIdx.x) * kGenericWarps + warp;  // (b, g, j)
  if (row_id >= int64_t(d.B) * d.G * d.S) return;
  const int j = int(row_id % d.S), bg = int(row_id / d.S), b = bg / d.G, grp = bg % d.G;
  float* k_row = generic_smem + warp * (2 * d.HS + 64);
  float* v_row = k_row + d.HS;
  float* pd_buf = v_row + d.HS;
  float* ds_buf = pd_buf + 32;
  const int64_t kv_off = (int64_t(j) * d.B + b) * d.G * d.HS + int64_t(grp) * d.HS;
  for (int e = lane; e < d.HS; e += 32) {
    k_row[e] = to_float(a.k[kv_off + e]);
    v_row[e] = to_float(a.v[kv_off + e]);
  }
  __syncwarp();
  const int64_t qs = d.q_row_stride();
  const float keep_scale = 1.0f / (1.0f - a.dropout_p);
  float dk_acc[kMaxLaneDims] = {}, dv_acc[kMaxLaneDims] = {};
  const int r = d.group_size();
  // Queries [first, end) that may see key j: causally from j, and for packed documents within j's document.
  const DocumentSpan document = a.mask.document_span(d, b, j);
  const int first = max(a.causal ? j : 0, document.begin), end = document.end;
  for (int h = grp * r; h < (grp + 1) * r; ++h) {
    const T* qb = a.q + (int64_t(b) * d.NH + h) * d.HS;
    const T* dob = a.dout + (int64_t(b) * d.NH + h) * d.HS;
    const int64_t stat_off = (int64_t(b) * d.NH + h) * d.S;
    for (int i0 = first; i0 < end; i0 += 32) {
      const int i = i0 + lane;
      float pd = 0.0f, ds = 0.0f;
      if (i < end && !a.mask.hidden(d, b, i, j)) {
        const float p = expf(a.scale * dot_row(k_row, qb + i * qs, d.HS) - a.lse[stat_off + i]);
        const float mult =
            a.dropout_p > 0.0f ? dropout_factor(a.rng, dropout_row_base(d, b, h, i), j, a.dropout_p, keep_scale) : 1.0f;
        ds = p * (mult * dot_row(v_row, dob + i * qs, d.HS) - a.D[stat_off + i]);
        pd = p * mult;
      }
      pd_buf[lane] = pd;
      ds_buf[lane] = ds;
      __syncwarp();
      const int count = min(32, end - i0);
      for (int ii = 0; ii < count; ++ii) {
        const float pdi = pd_buf[ii], dsi = ds_buf[ii];
        const T* q_row = qb + (i0 + ii) * qs;
        const T* do_row = dob + (i0 + ii) * qs;
#pragma unroll
        for (int u = 0; u < kMaxLaneDims; ++u) {
          const int e = lane + 32 * u;
          if (e < d.HS) {
            dv_acc[u] += pdi * to_float(do_row[e]);
            dk_acc[u] += dsi * to_float(q_row[e]);
          }
        }
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int u = 0; u < kMaxLaneDims; ++u) {
    const int e = lane + 32 * u;
    if (e < d.HS) {
      a.dk[kv_off + e] = from_float<T>(a.scale * dk_acc[u]);
      a.dv[kv_off + e] = from_float<T>(dv_acc[u]);
    }
  }
}

// The whole generic backward: D, then dQ and dK/dV.
template <class T>
void run_backward_generic(BackwardArgs<T> a, Device device) {
  MEGATRON_CHECK(a.d.HS <= 32 * kMaxLaneDims,
                 "attention_backward: head dim " << a.d.HS << " exceeds the CUDA limit of " << 32 * kMaxLaneDims);
  Tensor D = Tensor::empty(Shape{a.d.B, a.d.NH, a.d.S}, DType::f32, device);
  a.D = D.data<float>();
  launch_row_dot(a);
  const size_t smem = size_t(kGenericWarps) * size_t(2 * a.d.HS + 64) * sizeof(float);
  const int64_t q_rows = int64_t(a.d.B) * a.d.NH * a.d.S, kv_rows = int64_t(a.d.B) * a.d.G * a.d.S;
  attention_backward_dq_generic_kernel<T>
      <<<unsigned(ceil_div(q_rows, kGenericWarps)), kGenericWarps * 32, smem, stream()>>>(a);
  CUDA_CHECK_LAUNCH();
  attention_backward_dkv_generic_kernel<T>
      <<<unsigned(ceil_div(kv_rows, kGenericWarps)), kGenericWarps * 32, smem, stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda::attention_detail
