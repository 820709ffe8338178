#pragma once
// Attention forward kernels, as templates over their tile shape: attention_forward.cu instantiates
// the shapes it ships, the kernel lab (bench/kernels/attention.cu) times others beside them.
//
// bf16 or f16 with head dim 16/32/64/128: a FlashAttention-2 style kernel. A block of 4 warps owns
// 64 MT query rows of one head (MT 16-row m-tiles per warp); it streams KN-key tiles of K and V
// through shared memory (cp.async, two stages, so the next tile loads while this one computes),
// computes S = Q K^T and O += P V on the tensor cores (mma.sync m16n8k16, fp32 accumulators) and
// keeps the softmax online (running row max and sum, in log2 units so exp is one ex2). The S x S
// scores never exist in memory; lse = log sum exp of each row is written for the backward pass.
//
// f32, other head dims and misaligned tensors: a generic kernel, one warp per query row, scalar
// float arithmetic (the on-GPU reference for the fast path, and the f32 path).
#include "megatron/ops/cuda/attention_common.cuh"

namespace megatron::ops::cuda::attention_detail {

template <class T>
struct ForwardArgs {
  T* out;
  float* lse;
  const T* q;
  const T* k;
  const T* v;
  Dims d;
  bool causal;
  KeyMask mask;  // document masking (segment ids or packed documents) and sliding window
  float scale;
  float dropout_p;
  CounterRng rng;
};

template <class T>
ForwardArgs<T> forward_args(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionParams& p, const Dims& d) {
  return {static_cast<T*>(out.raw()),
          lse.data<float>(),
          static_cast<const T*>(q.raw()),
          static_cast<const T*>(k.raw()),
          static_cast<const T*>(v.raw()),
          d,
          p.causal,
          key_mask_of(p),
          p.softmax_scale,
          p.dropout_p,
          CounterRng{p.seed, p.stream}};
}

// ---- tensor-core kernel ---------------------------------------------------------------------

// Tile shape: MT m-tiles of 16 query rows per warp (each K/V fragment feeds MT products), KN keys
// per shared-memory tile, MIN_BLOCKS resident blocks per SM asked of the register allocator, and
// whether each warp keeps its Q fragments in registers instead of re-reading them per key tile.
template <int HS_, int MT, int KN, int MIN_BLOCKS, bool Q_IN_REGS>
struct ForwardTiles {
  static constexpr int HS = HS_, kMTiles = MT, kKeys = KN, kMinBlocks = MIN_BLOCKS;
  static constexpr bool kQInRegs = Q_IN_REGS;
  static constexpr int kThreads = 128, kRows = 4 * 16 * MT;
  // Q, then K and V in two stages each.
  static constexpr int smem_bytes() { return (kRows + 4 * kKeys) * HS * int(sizeof(uint16_t)); }
};

// Grid (B*NH, query tiles); kDropout is a template parameter so the common no-dropout kernel
// carries none of the mask's registers.
template <class T, class Cfg, bool kDropout>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) attention_forward_mma_kernel(const ForwardArgs<T> a) {
  constexpr int HS = Cfg::HS, kM = Cfg::kRows, kN = Cfg::kKeys, MT = Cfg::kMTiles, kThreads = Cfg::kThreads;
  constexpr bool kQInRegs = Cfg::kQInRegs;
  using Tile = Swizzled<HS>;
  extern __shared__ uint4 smem_words[];
  T* sQ = reinterpret_cast<T*>(smem_words);  // (kM, HS)
  T* sK = sQ + kM * HS;                      // 2 x (kN, HS)
  T* sV = sK + 2 * kN * HS;                  // 2 x (kN, HS)

  const Dims& d = a.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  // Causal blocks near the end of the sequence see the most keys: the grid's first row of
  // blocks (scheduled first) takes the last query tile of every head.
  const int q_tile = a.causal ? int(gridDim.y) - 1 - int(blockIdx.y) : int(blockIdx.y);
  const int q0 = q_tile * kM;
  const int b = int(blockIdx.x) / d.NH, h = int(blockIdx.x) % d.NH, grp = h / d.group_size();
  const int64_t qs = d.q_row_stride(), kvs = d.kv_row_stride();
  const T* qb = a.q + (int64_t(b) * d.NH + h) * HS;
  const T* kb = a.k + (int64_t(b) * d.G + grp) * HS;
  const T* vb = a.v + (int64_t(b) * d.G + grp) * HS;
  // Causal: keys <= the block's last query. Packed documents: the keys of the block's documents
  // only, so the work follows sum len^2 over the documents, not S^2.
  const RowsDocuments block_docs = a.mask.documents_of_rows(d, b, q0, min(q0 + kM, d.S) - 1);
  const int kv_end = min(a.causal ? min(d.S, q0 + kM) : d.S, block_docs.last.end);
  const int first_tile = block_docs.first.begin / kN, n_tiles = (kv_end + kN - 1) / kN;  // tiles [first, n)

  load_tile_async<kM, HS, kThreads>(sQ, qb, qs, q0, d.S);
  cp_async_commit();
  load_tile_async<kN, HS, kThreads>(sK, kb, kvs, first_tile * kN, d.S);
  load_tile_async<kN, HS, kThreads>(sV, vb, kvs, first_tile * kN, d.S);
  cp_async_commit();

  // Q fragments of this warp's rows: all of them once (kQInRegs), else one k-step at a time.
  const SwizzledLane<HS> l16(ldm16_row(lane), ldm16_col(lane)), l8x2(ldm8x2_row(lane), ldm8x2_col(lane));
  const uint32_t q_addr = smem_addr(sQ + warp * 16 * MT * HS);
  uint32_t qf[MT][kQInRegs ? HS / 16 : 1][4];
  const auto load_q = [&](int mt, int ks, uint32_t(&frag)[4]) { ldmatrix_x4(frag, q_addr + l16(mt * 16, ks * 16)); };
  if constexpr (kQInRegs) {
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int ks = 0; ks < HS / 16; ++ks) load_q(mt, ks, qf[mt][ks]);
    }
  }

  const float scale_log2 = a.scale * kLog2e;
  // This warp's rows: warp_row0 + 16 mt + g (c0, c1) and + 8 (c2, c3), for m-tile mt.
  const int warp_row0 = q0 + warp * 16 * MT;
  const RowsDocuments warp_docs =
      a.mask.documents_of_rows(d, b, min(warp_row0, d.S - 1), min(warp_row0 + 16 * MT, d.S) - 1);
  const float keep_scale = 1.0f / (1.0f - a.dropout_p);
  float o[MT][HS / 8][4] = {};
  float m[MT][2], l[MT][2];  // running row max (log2 units) and sum of 2^(s - m) over this thread's columns
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  for (int jt = first_tile; jt < n_tiles; ++jt) {
    cp_async_wait_all();
    __syncthreads();  // tile jt is in place, and every warp is done with tile jt - 1's stage
    if (jt + 1 < n_tiles) {
      const int stage = (jt + 1 - first_tile) & 1;
      load_tile_async<kN, HS, kThreads>(sK + stage * kN * HS, kb, kvs, (jt + 1) * kN, d.S);
      load_tile_async<kN, HS, kThreads>(sV + stage * kN * HS, vb, kvs, (jt + 1) * kN, d.S);
    }
    cp_async_commit();
    const int stage = (jt - first_tile) & 1;
    const uint32_t k_addr = smem_addr(sK + stage * kN * HS), v_addr = smem_addr(sV + stage * kN * HS);
    const int k0 = jt * kN;
    // A tile wholly after this warp's last row (causally) or outside its rows' documents would
    // only add masked zeros: skip it.
    if (a.causal && k0 > warp_row0 + 16 * MT - 1) continue;
    if (k0 + kN <= warp_docs.first.begin || k0 >= warp_docs.last.end) continue;

    // s = Q K^T for this warp's MT x 16 rows x kN keys.
    float s[MT][kN / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < HS / 16; ++ks) {
      if constexpr (!kQInRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_q(mt, ks, qf[mt][0]);
      }
      const int qk = kQInRegs ? ks : 0;
#pragma unroll
      for (int np = 0; np < kN / 16; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_addr + l8x2(np * 16, ks * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qf[mt][qk], kf[0], kf[1]);
          mma_16816<T>(s[mt][2 * np + 1], qf[mt][qk], kf[2], kf[3]);
        }
      }
    }

    // Scale into log2 units; mask keys past the end, causally keys after the query, and keys of
    // other documents (packed documents: only in the tiles that straddle a boundary).
    const bool edge =
        k0 + kN > d.S || (a.causal && k0 + kN - 1 > warp_row0) || a.mask.masks_tile(warp_docs, k0, k0 + kN - 1);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][nt][e] * scale_log2;
          if (edge) {
            const int col = k0 + nt * 8 + 2 * t + (e & 1), row = warp_row0 + mt * 16 + g + (e >> 1) * 8;
            if (col >= d.S || (a.causal && col > row) ||
                (row < d.S && (a.mask.hidden(d, b, row, col) || a.mask.outside_document(d, b, row, col))))
              x = -INFINITY;
          }
          s[mt][nt][e] = x;
        }
      }
    }

    // Online softmax: new row max over the quad (the 4 lanes sharing a row), rescale the old
    // sum and output by 2^(m_old - m_new). A row with nothing unmasked yet keeps max -inf and
    // uses 0 as its reference so no inf - inf appears.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
      }
      float ref[2], alpha[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        ref[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
        alpha[r] = fast_exp2(m[mt][r] - ref[r]);
        m[mt][r] = mx[r];
      }
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][nt][e] = fast_exp2(s[mt][nt][e] - ref[e >> 1]);
          row_sum[e >> 1] += s[mt][nt][e];
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l[mt][r] = l[mt][r] * alpha[r] + row_sum[r];
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt) {
        o[mt][nt][0] *= alpha[0];
        o[mt][nt][1] *= alpha[0];
        o[mt][nt][2] *= alpha[1];
        o[mt][nt][3] *= alpha[1];
      }
      // Dropout acts on the probabilities after the normaliser is taken (the CPU's order).
      if constexpr (kDropout) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp_row0 + mt * 16 + g + 8 * r;
          if (row >= d.S) continue;
          const uint64_t base = dropout_row_base(d, b, h, row);
#pragma unroll
          for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int col = k0 + nt * 8 + 2 * t + c;
              if (col < d.S) s[mt][nt][2 * r + c] *= dropout_factor(a.rng, base, col, a.dropout_p, keep_scale);
            }
          }
        }
      }
    }

    // O += P V: two C tiles of P are one A fragment (see attention_common.cuh).
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < HS / 16; ++np) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_addr + l16(kk * 16, np * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * np], pa[mt], vf[0], vf[1]);
          mma_16816<T>(o[mt][2 * np + 1], pa[mt], vf[2], vf[3]);
        }
      }
    }
  }
  cp_async_wait_all();

  // out = O / l, staged through this warp's own rows of sQ (no other warp reads them) so the
  // global stores are whole 16-byte pieces of rows.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
      inv[r] = l[mt][r] > 0.0f ? 1.0f / l[mt][r] : 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(sQ + Tile::offset(warp * 16 * MT + mt * 16 + g + 8 * r, nt * 8 + 2 * t)) =
            pack2<T>(o[mt][nt][2 * r] * inv[r], o[mt][nt][2 * r + 1] * inv[r]);
    }
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row0 + mt * 16 + g + 8 * r;
        if (row < d.S) a.lse[(int64_t(b) * d.NH + h) * d.S + row] = (m[mt][r] + log2f(l[mt][r])) * kLn2;
      }
    }
  }
  __syncwarp();
  store_tile<16 * MT, HS>(a.out + (int64_t(b) * d.NH + h) * HS, qs, sQ + warp * 16 * MT * HS, warp_row0, d.S, lane, 32);
}

template <class Cfg, bool kDropout, class T>
void launch_forward_mma_kernel(const ForwardArgs<T>& a) {
  constexpr int smem = Cfg::smem_bytes();
  static const bool configured = [] {  // above 48 KB a kernel must opt in to its shared memory
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_mma_kernel<T, Cfg, kDropout>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const int64_t q_tiles = ceil_div(a.d.S, Cfg::kRows);
  MEGATRON_CHECK(q_tiles <= 65535, "attention_forward: sequence length " << a.d.S << " needs " << q_tiles
                                                                         << " query tiles of " << Cfg::kRows
                                                                         << " rows, above the grid limit 65535");
  const dim3 grid(unsigned(a.d.B * a.d.NH), unsigned(q_tiles));
  attention_forward_mma_kernel<T, Cfg, kDropout><<<grid, Cfg::kThreads, smem, stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Dropout may take another tile shape: the mask's registers change which shape is fastest.
template <class Cfg, class DropoutCfg = Cfg, class T>
void launch_forward_mma(const ForwardArgs<T>& a) {
  if (a.dropout_p > 0.0f) return launch_forward_mma_kernel<DropoutCfg, true>(a);
  launch_forward_mma_kernel<Cfg, false>(a);
}

// ---- generic kernel -------------------------------------------------------------------------

// One warp per query row (b, h, i). Pass 1: the lanes take keys j = lane, lane + 32, ... and
// combine their running (max, sum) into lse. Pass 2: 32 keys at a time, the lanes compute the
// probabilities, then each lane accumulates the head dims e = lane + 32 u of sum_j p_ij v_j.
template <class T>
__global__ void attention_forward_generic_kernel(const ForwardArgs<T> a) {
  extern __shared__ float generic_smem[];
  const Dims& d = a.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row_id = int64_t(blockIdx.x) * kGenericWarps + warp;  // (b, h, i)
  if (row_id >= int64_t(d.B) * d.NH * d.S) return;
  const int i = int(row_id % d.S), bh = int(row_id / d.S), b = bh / d.NH, h = bh % d.NH, grp = h / d.group_size();
  float* q_row = generic_smem + warp * (d.HS + 32);
  float* p_buf = q_row + d.HS;
  const int64_t q_off = (int64_t(i) * d.B + b) * d.NH * d.HS + int64_t(h) * d.HS;
  for (int e = lane; e < d.HS; e += 32) q_row[e] = to_float(a.q[q_off + e]);
  __syncwarp();
  const T* kb = a.k + (int64_t(b) * d.G + grp) * d.HS;
  const T* vb = a.v + (int64_t(b) * d.G + grp) * d.HS;
  const int64_t kvs = d.kv_row_stride();
  // Keys [first, len): causally up to i, and for packed documents within i's document.
  const DocumentSpan document = a.mask.document_span(d, b, i);
  const int first = document.begin, len = min(a.causal ? i + 1 : d.S, document.end);

  float m = -INFINITY, l = 0.0f;
  for (int j = first + lane; j < len; j += 32) {
    if (a.mask.hidden(d, b, i, j)) continue;
    const float s = a.scale * dot_row(q_row, kb + j * kvs, d.HS);
    if (s > m) {
      l = l * expf(m - s) + 1.0f;
      m = s;
    } else {
      l += expf(s - m);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset), l2 = __shfl_xor_sync(0xffffffffu, l, offset);
    const float mn = fmaxf(m, m2);
    l = (m == -INFINITY ? 0.0f : l * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : l2 * expf(m2 - mn));
    m = mn;
  }
  const float lse = m + logf(l);

  const float keep_scale = 1.0f / (1.0f - a.dropout_p);
  const uint64_t drop_base = dropout_row_base(d, b, h, i);
  float acc[kMaxLaneDims] = {};
  for (int j0 = first; j0 < len; j0 += 32) {
    const int j = j0 + lane;
    float p = 0.0f;
    if (j < len && !a.mask.hidden(d, b, i, j)) {
      p = expf(a.scale * dot_row(q_row, kb + j * kvs, d.HS) - lse);
      if (a.dropout_p > 0.0f) p *= dropout_factor(a.rng, drop_base, j, a.dropout_p, keep_scale);
    }
    p_buf[lane] = p;
    __syncwarp();
    const int count = min(32, len - j0);
    for (int jj = 0; jj < count; ++jj) {
      const float pj = p_buf[jj];
      const T* v_row = vb + (j0 + jj) * kvs;
#pragma unroll
      for (int u = 0; u < kMaxLaneDims; ++u) {
        const int e = lane + 32 * u;
        if (e < d.HS) acc[u] += pj * to_float(v_row[e]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int u = 0; u < kMaxLaneDims; ++u) {
    const int e = lane + 32 * u;
    if (e < d.HS) a.out[q_off + e] = from_float<T>(acc[u]);
  }
  if (lane == 0) a.lse[int64_t(bh) * d.S + i] = lse;
}

template <class T>
void launch_forward_generic(const ForwardArgs<T>& a) {
  MEGATRON_CHECK(a.d.HS <= 32 * kMaxLaneDims,
                 "attention_forward: head dim " << a.d.HS << " exceeds the CUDA limit of " << 32 * kMaxLaneDims);
  const int64_t rows = int64_t(a.d.B) * a.d.NH * a.d.S;
  const size_t smem = size_t(kGenericWarps) * size_t(a.d.HS + 32) * sizeof(float);
  attention_forward_generic_kernel<T>
      <<<unsigned(ceil_div(rows, kGenericWarps)), kGenericWarps * 32, smem, stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda::attention_detail
