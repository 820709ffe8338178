// LayerNorm and RMSNorm on CUDA, computing in float with 16-byte loads where rows allow. Forward:
// one warp per row; the row is read again from L1 for each pass rather than held in registers, so
// any C works. Backward: one kernel per chunk of rows writes dx and deterministic per-chunk
// dweight/dbias partial sums (no float atomics), reading each row from HBM once; a second kernel
// sums the chunks in a fixed order (the design is described above the backward kernel).
// The fused residual add (add_norm_*) runs the same kernels with their residual pointers given.
// The output's FP8 cast (norm_forward_fp8) normalises from the forward's statistics as the source
// of the cast-transpose kernel, with the forward's arithmetic.
#include "megatron/ops/checks/norm.h"
#include "megatron/ops/cuda/fp8_cast_transpose.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/norm.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block in the forward kernel

// One output element, y = (x - m) * s * w + b, rounded step by step as written (the product with w
// and the bias add fused), so the forward and the FP8 cast's source compute the same bits.
__device__ __forceinline__ float normalized(float x, float m, float s, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(x, m), s), w, b);
}

// y (N,C) = (x - mean) * rstd * w + b; mean (N) only for LayerNorm (nullptr for RMSNorm), rstd (N);
// y null: the statistics only.
// Two passes over the row as on the CPU: the mean, then the variance about it. With residual (and
// h) given, the row normalised is h = x + residual, rounded to T and stored by a first pass; the
// later passes read it back (each lane its own packs, so no synchronisation), from L1/L2.
template <class T, int V>
__global__ void norm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N,
                                    int C, bool rms, float eps, const T* residual, T* h) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x) % 32;
  const T* xr = x + row * C;
  if (residual != nullptr) {
    T* hr = h + row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
      float v[V], r[V];
      load_pack<V>(xr + c, v);
      load_pack<V>(residual + row * C + c, r);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] += r[k];
      store_pack<V>(hr + c, v);
    }
    xr = hr;
  }
  float m = 0.0f;
  if (!rms) {
    float sum = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
      float v[V];
      load_pack<V>(xr + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) sum += v[k];
    }
    m = warp_reduce(sum, SumOp{}) / float(C);
  }
  float var = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float v[V];
    load_pack<V>(xr + c, v);
#pragma unroll
    for (int k = 0; k < V; ++k) var += (v[k] - m) * (v[k] - m);
  }
  var = warp_reduce(var, SumOp{}) / float(C);
  const float s = 1.0f / sqrtf(var + eps);
  for (int c = lane * V; y != nullptr && c < C; c += 32 * V) {
    float v[V], wv[V], bv[V] = {};
    load_pack<V>(xr + c, v);
    load_pack<V>(w + c, wv);
    if (b != nullptr) load_pack<V>(b + c, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = normalized(v[k], m, s, wv[k], bv[k]);
    store_pack<V>(y + row * C + c, v);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    rstd[row] = s;
  }
}

// ---- backward ------------------------------------------------------------------------------
// One kernel writes dx and the parameter-gradient partials, so dy and x (and dh) are read from HBM
// once. A block takes a chunk of consecutive rows; its rows go to teams of threads, a team walking
// its rows in order with thread t of the team owning packs t, t + team, ... of every row, so it
// sums dy xhat (and dy) over its team's rows for channels no other thread of the team touches. The
// sums live in the team's own slice of shared memory (C floats, 2C with dbias) rather than
// registers so that one code path serves every C (a lane would need C/32 registers for dweight
// alone: 96 at hidden 3072, 192 with dbias); at the chunk's end the block adds its teams' slices in
// team order into the chunk's partials. Fixed orders throughout, no atomics: the same bits on every
// run. Sums are kept as [k][p] (element k of pack p), so a warp's 32 consecutive packs hit 32
// banks; the partials buffer keeps that order and norm_param_reduce_kernel maps it back to
// channels.
//
// Two team sizes, chosen by how many slices an SM holds (backward_layout):
//  - a warp (narrow rows, e.g. gpt2's 768): a row's two sums are one warp reduction, with no
//    barrier, the block's warps and the SM's blocks keeping that many rows in flight;
//  - the block, one team (wide rows): a warp's slice per SM would leave too few warps resident (18
//    at llama-3b's 3072), so the block's threads share one slice and the row's sums cross the warps
//    through shared memory, one __syncthreads a row.
// Where one slice exceeds the block's shared memory (C above ~58K, ~29K with dbias) the block, one
// team, sums in the chunk's slot of the partials buffer instead (L2).
//
// dx, with xhat = (x - m) rstd and g = dy * w:
//   LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat));  RMSNorm: dx = rstd (g - xhat mean(g xhat))
// plus dh (the residual stream's gradient) when given, added before rounding. The second pass
// reads the row again from L1/L2. To keep HBM latency off that chain, the first pass prefetches
// dh into L1 and the second the team's next row's x and dy (packed path only: a scalar thread
// would prefetch the same line many times).

// Each team size is its own instantiation, so each gets the registers that suit it. Block teams:
// two blocks of up to 512 threads a multiprocessor cap them at 64 registers a thread, spilling
// none; left free they took 98 (bf16 packs), halving the warps resident (H100: add_norm_backward
// 4.09 -> 4.84 ms a llama-1b step). Warp teams (8 a block): their pack loops unrolled 4x keep
// several packs' loads in flight a lane, worth more than the warps the registers cost (H100, one
// command: gpt2-124m 2.41 -> 2.15 ms a step, rolled -> unrolled).
constexpr int kMaxBackwardThreads = 512;
constexpr int kMinBackwardBlocksPerSM = 2;
constexpr int kWarpTeamsPerBlock = 8;
constexpr int kWarpTeamPackUnroll = 4;

template <int V, class T>
__device__ __forceinline__ void prefetch_l1(const T* p) {
  if constexpr (V > 1) asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

template <class T, int V, bool kWarpTeams>
__global__ void __launch_bounds__(kWarpTeams ? kWarpTeamsPerBlock * 32 : kMaxBackwardThreads,
                                  kWarpTeams ? 1 : kMinBackwardBlocksPerSM)
    norm_backward_kernel(T* dx, float* part_w, float* part_b, bool sums_in_shared, const T* dy, const T* x, const T* w,
                         const float* mean, const float* rstd, int64_t N, int C, const T* dh, int64_t rows_per_chunk) {
  constexpr int kPackUnroll = kWarpTeams ? kWarpTeamPackUnroll : 1;
  extern __shared__ float slices[];    // per team: dw sums [V][packs], then db sums when part_b is given
  __shared__ float2 warp_sums[2][32];  // a block team's per-warp (sum g, sum g xhat); two so rows alternate
  const int packs = C / V, tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int team_size = kWarpTeams ? 32 : int(blockDim.x), teams = int(blockDim.x) / team_size;
  const int team = tid / team_size, t = tid % team_size, warps_per_team = team_size / 32;
  const bool rms = mean == nullptr, with_bias = part_b != nullptr;
  const int64_t chunk = blockIdx.x, slice = int64_t(C) * (with_bias ? 2 : 1);
  // One team per block where the sums are not in shared memory (the launcher's rule).
  float* sum_w = sums_in_shared ? slices + team * slice : part_w + chunk * C;
  float* sum_b = sums_in_shared ? sum_w + C : (with_bias ? part_b + chunk * C : nullptr);
  for (int p = t; p < packs; p += team_size) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      sum_w[k * packs + p] = 0.0f;
      if (with_bias) sum_b[k * packs + p] = 0.0f;
    }
  }
  const int64_t first = chunk * rows_per_chunk, end = min(N, first + rows_per_chunk);
  for (int64_t row = first + team; row < end; row += teams) {
    const float m = rms ? 0.0f : mean[row], s = rstd[row];
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const T* dhr = dh != nullptr ? dh + row * C : nullptr;
    float g_sum = 0.0f, gx_sum = 0.0f;
#pragma unroll kPackUnroll
    for (int p = t; p < packs; p += team_size) {
      const int c = p * V;
      float xv[V], dv[V], wv[V];
      load_pack<V>(xr + c, xv);
      load_pack<V>(dyr + c, dv);
      load_pack<V>(w + c, wv);
      if (dhr != nullptr) prefetch_l1<V>(dhr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float g = dv[k] * wv[k];
        g_sum += g;
        gx_sum += g * (xv[k] - m) * s;
      }
    }
    // Every lane gets its warp's totals: the butterfly adds the same pairs in each lane.
    g_sum = warp_reduce(g_sum, SumOp{});
    gx_sum = warp_reduce(gx_sum, SumOp{});
    if constexpr (!kWarpTeams) {
      // Then the warps' in a fixed order by every thread. A warp reaching the next row's write of
      // the other buffer has passed this row's barrier, and a third row's write (this buffer
      // again) waits on the next row's barrier, which every thread reaches after reading.
      const int buffer = int((row - first) % 2);
      if (lane == 0) warp_sums[buffer][warp] = make_float2(g_sum, gx_sum);
      __syncthreads();
      g_sum = gx_sum = 0.0f;
      for (int i = 0; i < warps_per_team; ++i) {
        g_sum += warp_sums[buffer][i].x;
        gx_sum += warp_sums[buffer][i].y;
      }
    }
    const float g_mean = rms ? 0.0f : g_sum / float(C), gx_mean = gx_sum / float(C);
    T* dxr = dx + row * C;
    const bool next_row = row + teams < end;
#pragma unroll kPackUnroll
    for (int p = t; p < packs; p += team_size) {
      const int c = p * V;
      float xv[V], dv[V], wv[V], skip[V] = {};
      load_pack<V>(xr + c, xv);
      load_pack<V>(dyr + c, dv);
      load_pack<V>(w + c, wv);
      if (dhr != nullptr) load_pack<V>(dhr + c, skip);
      if (next_row) {
        prefetch_l1<V>(xr + int64_t(teams) * C + c);
        prefetch_l1<V>(dyr + int64_t(teams) * C + c);
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (xv[k] - m) * s;
        sum_w[k * packs + p] += dv[k] * xhat;
        if (with_bias) sum_b[k * packs + p] += dv[k];
        dv[k] = s * (dv[k] * wv[k] - g_mean - xhat * gx_mean) + skip[k];
      }
      store_pack<V>(dxr + c, dv);
    }
  }
  if (!sums_in_shared) return;
  __syncthreads();  // every team's slice complete
  for (int i = tid; i < C; i += int(blockDim.x)) {
    float dw = 0.0f, db = 0.0f;
    for (int v = 0; v < teams; ++v) {
      dw += slices[v * slice + i];
      if (with_bias) db += slices[v * slice + C + i];
    }
    part_w[chunk * C + i] = dw;
    if (with_bias) part_b[chunk * C + i] = db;
  }
}

// dweight[c] += sum over chunks of part_w[chunk][i] (and dbias likewise when given), chunks in a
// fixed order: lane ty of a block of kReduceLanes x 32 threads sums chunks ty, ty + kReduceLanes,
// ... in order, then lane 0 adds the lanes' sums in order. i = k * packs + p is channel p V + k
// (the backward kernel's layout).
constexpr int kReduceLanes = 32;
__global__ void norm_param_reduce_kernel(float* dweight, float* dbias, const float* part_w, const float* part_b,
                                         int64_t chunks, int C, int V) {
  __shared__ float lane_w[kReduceLanes][32], lane_b[kReduceLanes][32];
  const int tx = int(threadIdx.x) % 32, ty = int(threadIdx.x) / 32;
  const int i = int(blockIdx.x) * 32 + tx;
  float dw = 0.0f, db = 0.0f;
  if (i < C) {
    for (int64_t k = ty; k < chunks; k += kReduceLanes) {
      dw += part_w[k * C + i];
      if (part_b != nullptr) db += part_b[k * C + i];
    }
  }
  lane_w[ty][tx] = dw;
  lane_b[ty][tx] = db;
  __syncthreads();
  if (ty != 0 || i >= C) return;
  for (int k = 1; k < kReduceLanes; ++k) {
    dw += lane_w[k][tx];
    db += lane_b[k][tx];
  }
  const int packs = C / V, c = (i % packs) * V + i / packs;
  dweight[c] += dw;
  if (dbias != nullptr) dbias[c] += db;
}

// 16-byte packs when every row of every tensor starts on a 16-byte boundary, else scalars.
template <class T>
bool rows_vectorizable(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % kPack<T> != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !is_aligned16(p)) return false;
  return true;
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw()) : nullptr;
}
template <class T>
T* data_or_null(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw()) : nullptr;
}

// CUDA kernels exist for the dtypes dispatch_storage takes.
void check_cuda_norm_dtype(const Tensor& x, const char* op) {
  dispatch_storage(x.dtype(), op, []<class T>(std::type_identity<T>) {});
}

constexpr checks::NormBackend kCudaNorm{check_cuda, check_cuda_norm_dtype};

// Rows are indexed in int64 but channels in int (one row's offset fits easily).
int channels_of(const Tensor& x) {
  const int64_t C = x.dim(-1);
  MEGATRON_CHECK(C > 0 && C < (int64_t(1) << 30), "norm: " << C << " channels is outside (0, 2^30)");
  return int(C);
}

// The norm's output from its statistics, element by element, rounded to T as the forward stores
// it: the source of norm_forward_fp8's cast (fp8::launch_cast_transpose).
template <class T>
struct NormSource {
  static constexpr int kOutputs = 1;
  const T* x;  // (N, C)
  const T* w;
  const T* b;         // null without bias
  const float* mean;  // null for RMSNorm
  const float* rstd;
  int64_t C;
  __device__ __forceinline__ float load_one(int64_t r, float x_rc, float w_c, float b_c) const {
    return fp8::as_stored<T>(normalized(x_rc, mean != nullptr ? mean[r] : 0.0f, rstd[r], w_c, b_c));
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = load_one(r, to_float(x[r * C + c]), to_float(w[c]), b != nullptr ? to_float(b[c]) : 0.0f);
  }
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[1][8]) const {
    float xv[8], wv[8], bv[8] = {};
    load_floats<8>(x + r * C + c, xv);
    load_floats<8>(w + c, wv);
    if (b != nullptr) load_floats<8>(b + c, bv);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[0][k] = load_one(r, xv[k], wv[k], bv[k]);
  }
};

// Launchers shared by the plain and the fused (add_norm_*) ops; the checks are done.
void launch_norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, const NormParams& params, int64_t N, const Tensor& residual, Tensor& h,
                         const char* op) {
  const int C = channels_of(x);
  dispatch_storage(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    if (N == 0) return;
    T* yp = data_or_null<T>(y);
    const T* xp = static_cast<const T*>(x.raw());
    const T* wp = static_cast<const T*>(weight.raw());
    const T* bp = data_or_null<T>(bias);
    const T* rp = data_or_null<T>(residual);
    T* hp = data_or_null<T>(h);
    const bool rms = params.kind == NormKind::rmsnorm;
    const auto blocks = unsigned(ceil_div(N, kRowsPerBlock));
    if (rows_vectorizable<T>(C, {yp, xp, wp, bp, rp, hp})) {
      norm_forward_kernel<T, kPack<T>><<<blocks, kRowsPerBlock * 32, 0, stream()>>>(
          yp, data_or_null<float>(mean), rstd.data<float>(), xp, wp, bp, N, C, rms, params.eps, rp, hp);
    } else {
      norm_forward_kernel<T, 1><<<blocks, kRowsPerBlock * 32, 0, stream()>>>(
          yp, data_or_null<float>(mean), rstd.data<float>(), xp, wp, bp, N, C, rms, params.eps, rp, hp);
    }
    CUDA_CHECK_LAUNCH();
  });
}

int device_attribute(cudaDeviceAttr attribute) {
  int value = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, megatron::cuda::current_context().device()));
  return value;
}

// Dynamic shared memory a block of norm_backward_kernel<T, V, W> may use: the device's opt-in
// limit less the kernel's static shared memory, raised to once per kernel (one process drives one
// GPU).
template <class T, int V, bool W>
int64_t backward_shared_limit() {
  static const int limit = [] {
    const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, norm_backward_kernel<T, V, W>));
    const int dynamic = optin - int(attributes.sharedSizeBytes);
    CUDA_CHECK(
        cudaFuncSetAttribute(norm_backward_kernel<T, V, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    return dynamic;
  }();
  return limit;
}

// How the backward splits N rows of C channels: teams of a warp or of the whole block, one block a
// chunk of rows, the sums in shared memory or (one team a block) in the partials. Warp teams where
// an SM holds at least kMinWarpTeamsPerSM of their slices; their chunks fill the GPU's resident
// blocks once (every multiprocessor busy to the end). Block teams take kBlockTeamRows rows a chunk:
// N = 4096 gives 256 blocks for 132 SMs, while the partials (chunks x C floats, written and read
// once) stay a few percent of the rows' bytes.
// Half an SM's warps; measured on an H100: 38 slices (gpt2's LayerNorm, C = 768) beat block teams, 28
// (RMSNorm at llama-1b's 2048) and 18 (llama-3b's 3072) lost to them by a quarter and a third.
constexpr int64_t kMinWarpTeamsPerSM = 32;
constexpr int64_t kBlockTeamRows = 16;
struct BackwardLayout {
  bool warp_teams = false, sums_in_shared = true;
  int threads = 32;
  int64_t shared_bytes = 0, rows_per_chunk = 1, chunks = 0;
};

template <class T, int V>
BackwardLayout backward_layout(int64_t N, int C, bool with_bias) {
  static const int multiprocessors = device_attribute(cudaDevAttrMultiProcessorCount);
  static const int shared_per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  BackwardLayout l;
  const int64_t slice_bytes = int64_t(C) * int64_t(sizeof(float)) * (with_bias ? 2 : 1);
  l.warp_teams = shared_per_sm / slice_bytes >= kMinWarpTeamsPerSM;
  if (l.warp_teams) {
    l.threads = kWarpTeamsPerBlock * 32;
    l.shared_bytes = kWarpTeamsPerBlock * slice_bytes;  // a quarter of an SM's at most: within the limit
    backward_shared_limit<T, V, true>();                // which this raises above the default 48 KB
    int resident = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, norm_backward_kernel<T, V, true>, l.threads,
                                                             size_t(l.shared_bytes)));
    const int64_t wave = multiprocessors * std::max(resident, 1);
    l.rows_per_chunk =
        ceil_div(std::max<int64_t>(ceil_div(N, wave), kWarpTeamsPerBlock), kWarpTeamsPerBlock) * kWarpTeamsPerBlock;
  } else {
    l.threads = int(std::clamp<int64_t>(ceil_div(C / V, 32) * 32, 32, kMaxBackwardThreads));
    l.sums_in_shared = slice_bytes <= backward_shared_limit<T, V, false>();  // also raises the limit to it
    l.shared_bytes = l.sums_in_shared ? slice_bytes : 0;
    l.rows_per_chunk = kBlockTeamRows;
  }
  l.chunks = ceil_div(N, l.rows_per_chunk);
  return l;
}

void launch_norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd, int64_t N, const Tensor& dh,
                          const char* op) {
  const int C = channels_of(x);
  dispatch_storage(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    if (N == 0) return;
    T* dxp = static_cast<T*>(dx.raw());
    const T* dyp = static_cast<const T*>(dy.raw());
    const T* xp = static_cast<const T*>(x.raw());
    const T* wp = static_cast<const T*>(weight.raw());
    const T* dhp = data_or_null<T>(dh);
    const float* mp = data_or_null<float>(mean);
    const float* sp = rstd.data<float>();
    const bool with_bias = dbias.defined();
    const auto run = [&]<int V>(std::integral_constant<int, V>) {
      const BackwardLayout l = backward_layout<T, V>(N, C, with_bias);
      MEGATRON_CHECK(l.chunks < (int64_t(1) << 31), op << ": " << N << " rows exceed the grid's 2^31 - 1 blocks of "
                                                       << l.rows_per_chunk << " rows; split the batch");
      Tensor partials = Tensor::empty({with_bias ? 2 : 1, l.chunks, C}, DType::f32, x.device());
      float* part_w = partials.data<float>();
      float* part_b = with_bias ? part_w + l.chunks * C : nullptr;
      const auto kernel = l.warp_teams ? norm_backward_kernel<T, V, true> : norm_backward_kernel<T, V, false>;
      kernel<<<unsigned(l.chunks), l.threads, size_t(l.shared_bytes), stream()>>>(
          dxp, part_w, part_b, l.sums_in_shared, dyp, xp, wp, mp, sp, N, C, dhp, l.rows_per_chunk);
      CUDA_CHECK_LAUNCH();
      norm_param_reduce_kernel<<<unsigned(ceil_div(C, 32)), kReduceLanes * 32, 0, stream()>>>(
          dweight.data<float>(), data_or_null<float>(dbias), part_w, part_b, l.chunks, C, V);
      CUDA_CHECK_LAUNCH();
    };
    if (rows_vectorizable<T>(C, {dxp, dyp, xp, wp, dhp})) {
      run(std::integral_constant<int, kPack<T>>{});
    } else {
      run(std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, const NormParams& params) {
  const int64_t N = checks::check_norm_forward(y, mean, rstd, x, weight, bias, params, kCudaNorm).rows;
  Tensor no_h;
  launch_norm_forward(y, mean, rstd, x, weight, bias, params, N, Tensor(), no_h, "norm_forward");
}

void cuda::norm_forward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& mean, const Tensor& rstd, const NormParams& params,
                            const Tensor& scale) {
  const checks::NormDims dims =
      checks::check_norm_forward_fp8(q, q_t, amax, x, weight, bias, mean, rstd, params, scale, kCudaNorm);
  dispatch_storage(x.dtype(), "norm_forward_fp8", [&]<class T>(std::type_identity<T>) {
    const NormSource<T> source{static_cast<const T*>(x.raw()),
                               static_cast<const T*>(weight.raw()),
                               data_or_null<T>(bias),
                               data_or_null<float>(mean),
                               rstd.data<float>(),
                               dims.channels};
    fp8::launch_cast_transpose(source, rows_vectorizable<T>(dims.channels, {source.x, source.w, source.b}), q, q_t,
                               amax, scale, dims.rows, dims.channels, "norm_forward_fp8");
  });
}

void cuda::norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                         const Tensor& weight, const Tensor& mean, const Tensor& rstd, const NormParams& params) {
  const int64_t N = checks::check_norm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd, params, kCudaNorm).rows;
  launch_norm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd, N, Tensor(), "norm_backward");
}

void cuda::add_norm_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& residual,
                            const Tensor& weight, const Tensor& bias, const NormParams& params) {
  const int64_t N = checks::check_add_norm_forward(h, y, mean, rstd, x, residual, weight, bias, params, kCudaNorm).rows;
  launch_norm_forward(y, mean, rstd, x, weight, bias, params, N, residual, h, "add_norm_forward");
}

void cuda::add_norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& dh,
                             const Tensor& h, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const NormParams& params) {
  const int64_t N =
      checks::check_add_norm_backward(dx, dweight, dbias, dy, dh, h, weight, mean, rstd, params, kCudaNorm).rows;
  launch_norm_backward(dx, dweight, dbias, dy, h, weight, mean, rstd, N, dh, "add_norm_backward");
}

}  // namespace megatron::ops
