// LayerNorm and RMSNorm on CUDA. Forward and the dx part of backward run one warp per row with
// 16-byte loads and float accumulation; the row is read again from L1 for each pass rather than
// held in registers, so any C works. dweight/dbias are reduced deterministically without float
// atomics: per-(row chunk, channel) partial sums, then a second kernel sums the chunks in order.
// The fused residual add (add_norm_*) runs the same kernels with their residual pointers given.
#include "megatron/ops/checks/norm.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/norm.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels

// y (N,C) = (x - mean) * rstd * w + b; mean (N) only for LayerNorm (nullptr for RMSNorm), rstd (N).
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
  T* yr = y + row * C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float v[V], wv[V], bv[V] = {};
    load_pack<V>(xr + c, v);
    load_pack<V>(w + c, wv);
    if (b != nullptr) load_pack<V>(b + c, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = (v[k] - m) * s * wv[k] + bv[k];
    store_pack<V>(yr + c, v);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    rstd[row] = s;
  }
}

// dx, one warp per row. With xhat = (x - m) rstd and g = dy * w:
//   LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat));  RMSNorm: dx = rstd (g - xhat mean(g xhat))
// plus dh (the residual stream's gradient) when given, added before rounding.
template <class T, int V>
__global__ void norm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* mean,
                                        const float* rstd, int64_t N, int C, const T* dh) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = int(threadIdx.x) % 32;
  const bool rms = mean == nullptr;
  const float m = rms ? 0.0f : mean[row], s = rstd[row];
  const T* xr = x + row * C;
  const T* dyr = dy + row * C;
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    load_pack<V>(xr + c, xv);
    load_pack<V>(dyr + c, dv);
    load_pack<V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g = dv[k] * wv[k];
      g_sum += g;
      gx_sum += g * (xv[k] - m) * s;
    }
  }
  const float g_mean = rms ? 0.0f : warp_reduce(g_sum, SumOp{}) / float(C);
  const float gx_mean = warp_reduce(gx_sum, SumOp{}) / float(C);
  T* dxr = dx + row * C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V], skip[V] = {};
    load_pack<V>(xr + c, xv);
    load_pack<V>(dyr + c, dv);
    load_pack<V>(w + c, wv);
    if (dh != nullptr) load_pack<V>(dh + row * C + c, skip);
#pragma unroll
    for (int k = 0; k < V; ++k) dv[k] = s * (dv[k] * wv[k] - g_mean - (xv[k] - m) * s * gx_mean) + skip[k];
    store_pack<V>(dxr + c, dv);
  }
}

// Parameter-gradient partials: block (kColsPerBlock channels) x (kRowLanes row lanes) sums the
// rows of one chunk of kRowsPerChunk rows for its channels, in a fixed order:
//   part_w[chunk][c] = sum_n dy xhat,  part_b[chunk][c] = sum_n dy   (n in the chunk)
constexpr int kColsPerBlock = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kRowsPerChunk = 128;

template <class T>
__global__ void norm_param_partials_kernel(float* part_w, float* part_b, const T* dy, const T* x, const float* mean,
                                           const float* rstd, int64_t N, int C) {
  __shared__ float sw[kRowLanes][kColsPerBlock], sb[kRowLanes][kColsPerBlock];
  const int tx = int(threadIdx.x) % kColsPerBlock, ty = int(threadIdx.x) / kColsPerBlock;
  const int c = int(blockIdx.x) * kColsPerBlock + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t end = min(N, (chunk + 1) * kRowsPerChunk);
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int64_t n = chunk * kRowsPerChunk + ty; n < end; n += kRowLanes) {
      const float g = to_float(dy[n * C + c]);
      const float m = mean != nullptr ? mean[n] : 0.0f;
      dw += g * (to_float(x[n * C + c]) - m) * rstd[n];
      db += g;
    }
  }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int k = 1; k < kRowLanes; ++k) {
      dw += sw[k][tx];
      db += sb[k][tx];
    }
    part_w[chunk * C + c] = dw;
    part_b[chunk * C + c] = db;
  }
}

// dweight[c] += sum over chunks of part_w[chunk][c] (and dbias likewise when given), chunks in order.
__global__ void norm_param_reduce_kernel(float* dweight, float* dbias, const float* part_w, const float* part_b,
                                         int64_t chunks, int C) {
  const int c = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    dw += part_w[k * C + c];
    db += part_b[k * C + c];
  }
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

// Launchers shared by the plain and the fused (add_norm_*) ops; the checks are done.
void launch_norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, const NormParams& params, int64_t N, const Tensor& residual, Tensor& h,
                         const char* op) {
  const int C = channels_of(x);
  dispatch_storage(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    if (N == 0) return;
    T* yp = static_cast<T*>(y.raw());
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
    const auto blocks = unsigned(ceil_div(N, kRowsPerBlock));
    if (rows_vectorizable<T>(C, {dxp, dyp, xp, wp, dhp})) {
      norm_backward_dx_kernel<T, kPack<T>>
          <<<blocks, kRowsPerBlock * 32, 0, stream()>>>(dxp, dyp, xp, wp, mp, sp, N, C, dhp);
    } else {
      norm_backward_dx_kernel<T, 1><<<blocks, kRowsPerBlock * 32, 0, stream()>>>(dxp, dyp, xp, wp, mp, sp, N, C, dhp);
    }
    CUDA_CHECK_LAUNCH();

    const int64_t chunks = ceil_div(N, kRowsPerChunk);
    MEGATRON_CHECK(chunks < 65536, op << ": " << N << " rows exceed the " << 65535 * kRowsPerChunk
                                      << " the parameter-gradient grid covers; split the batch");
    Tensor partials = Tensor::empty({2, chunks, C}, DType::f32, x.device());
    float* part_w = partials.data<float>();
    float* part_b = part_w + chunks * C;
    const dim3 grid(unsigned(ceil_div(C, kColsPerBlock)), unsigned(chunks));
    norm_param_partials_kernel<T>
        <<<grid, kColsPerBlock * kRowLanes, 0, stream()>>>(part_w, part_b, dyp, xp, mp, sp, N, C);
    CUDA_CHECK_LAUNCH();
    norm_param_reduce_kernel<<<unsigned(ceil_div(C, kThreads)), kThreads, 0, stream()>>>(
        dweight.data<float>(), data_or_null<float>(dbias), part_w, part_b, chunks, C);
    CUDA_CHECK_LAUNCH();
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
