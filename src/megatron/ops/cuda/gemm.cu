// GEMM and the linear layer on CUDA through cuBLASLt: f32, bf16 or f16 operands, FP32 accumulation
// (CUBLAS_COMPUTE_32F: full FP32 for f32 operands, never TF32, so results track the CPU), output
// in the operands' dtype or f32. The weight gradient accumulates straight into the fp32 main grad
// (beta = 1, 16-bit operands, f32 C/D): Megatron's gradient-accumulation fusion. The forward bias is fused through
// the BIAS epilogue; the bias gradient is a deterministic column-sum kernel.
//
// Row-major vs column-major: a row-major (r, c) matrix is a column-major (c, r) one, so row-major
// C (M,N) = op(A) op(B) is computed as column-major C^T (N,M) = op(B)^T op(A)^T, i.e. cuBLASLt's
// "A" is our B and its "B" is our A, with the same transpose flags.
//
// Algorithms come from cuBLASLt's heuristic, queried once per (device, shape, transposes,
// dtypes, epilogue, pointer alignments) and cached; descriptors are rebuilt per call (a few
// host microseconds, and no shared mutable state between threads).
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "megatron/ops/checks/gemm.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"

namespace megatron::ops::cuda {
namespace {

// ---- cuBLASLt descriptors, owned -----------------------------------------------------------

template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtDeleter {
  void operator()(Handle h) const { Destroy(h); }  // destructors do not throw
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                   LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using MatrixLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                     LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using MatmulPreference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                         LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

MatrixLayout make_layout(cudaDataType type, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  // Column-major, packed: the leading dimension is the row count (at least 1 for empty operands).
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), rows < 1 ? 1 : rows));
  return MatrixLayout(layout);
}

template <class V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
template <class V>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// ---- one cuBLASLt call ---------------------------------------------------------------------

// Column-major D (m,n) = alpha op(A) op(B) + beta C, C = D, with optional bias over D's rows.
struct LtProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;  // length m, D's type; null: no epilogue
  cudaDataType ab_type = CUDA_R_32F, d_type = CUDA_R_32F;
  float alpha = 1.0f, beta = 0.0f;
};

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && v % align != 0) align /= 2;
  return align;
}

struct PlanKey {
  std::array<int64_t, 13> fields{};
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = 0;
    for (int64_t f : key.fields) h = h * 1000003u ^ std::hash<int64_t>{}(f);
    return h;
  }
};

// Heuristic results per problem class; nullopt records "no algorithm" so it is not asked again.
struct AlgoCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::optional<cublasLtMatmulAlgo_t>, PlanKeyHash> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

// Runs the problem; returns false (doing nothing) when cuBLASLt has no algorithm for it.
bool try_lt_matmul(const LtProblem& p) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  cublasLtMatmulDesc_t raw_desc = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  const cublasLtEpilogue_t epilogue = p.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (p.bias != nullptr) set_desc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);

  const MatrixLayout a = make_layout(p.ab_type, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k);
  const MatrixLayout b = make_layout(p.ab_type, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n);
  const MatrixLayout d = make_layout(p.d_type, p.m, p.n);

  const uint32_t align_a = alignment_of(p.a), align_b = alignment_of(p.b), align_d = alignment_of(p.d);
  const PlanKey key{{p.m, p.n, p.k, p.trans_a, p.trans_b, p.ab_type, p.d_type, epilogue, align_a, align_b, align_d,
                     p.bias != nullptr ? alignment_of(p.bias) : 0, ctx.device()}};
  AlgoCache& cache = algo_cache();
  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      algo = it->second;
      if (!algo) return false;
    }
  }
  if (!algo) {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    const MatmulPreference pref(raw_pref);
    set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ctx.blas_workspace_bytes());
    set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.blas_lt(), raw_desc, a.get(), b.get(), d.get(),
                                                                 d.get(), raw_pref, 1, &result, &found);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(status);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.algos[key] = algo;
  }
  if (!algo) return false;
  CUBLAS_CHECK(cublasLtMatmul(ctx.blas_lt(), raw_desc, &p.alpha, p.a, a.get(), p.b, b.get(), &p.beta, p.d, d.get(), p.d,
                              d.get(), &*algo, ctx.blas_workspace(), ctx.blas_workspace_bytes(), stream()));
  return true;
}

// ---- row-major front end -------------------------------------------------------------------

cudaDataType lt_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f64:
      MEGATRON_FAIL("GEMM on CUDA: f64 tensors are CPU-only (gradient checks); use f32, bf16 or f16, or --device cpu");
    default:
      MEGATRON_FAIL("GEMM on CUDA takes f32, bf16 or f16, got " << dtype_name(dtype));
  }
}

// A copy of t in a fresh allocator block (512-byte aligned), queued on the current stream.
Tensor aligned_copy(const Tensor& t) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy.copy_from(t);
  return copy;
}

// Row-major C (M,N) = alpha op(A) op(B) + beta C with op(A) (M,K), op(B) (K,N), bias over C's
// columns (length N). Returns false when the bias epilogue has no algorithm (the caller adds the
// bias another way). Operands at addresses cuBLASLt has no algorithm for (views at odd element
// offsets) are copied to aligned blocks first.
bool row_major_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, Tensor& c,
                    float alpha, float beta, const void* bias) {
  LtProblem p;
  p.trans_a = tb;
  p.trans_b = ta;
  p.m = n;
  p.n = m;
  p.k = k;
  p.a = b.raw();
  p.b = a.raw();
  p.d = c.raw();
  p.bias = bias;
  p.ab_type = lt_type(a.dtype());
  p.d_type = lt_type(c.dtype());
  p.alpha = alpha;
  p.beta = beta;
  if (try_lt_matmul(p)) return true;
  if (bias != nullptr) return false;
  const std::string problem = "C (" + std::to_string(m) + "," + std::to_string(n) +
                              ") = op(A) op(B) with K = " + std::to_string(k) + ", " + dtype_name(a.dtype()) + " -> " +
                              dtype_name(c.dtype());
  const bool misaligned = !is_aligned16(a.raw()) || !is_aligned16(b.raw()) || !is_aligned16(c.raw());
  MEGATRON_CHECK(misaligned, "cuBLASLt found no algorithm for the GEMM " << problem);
  const Tensor a_aligned = aligned_copy(a), b_aligned = aligned_copy(b);
  Tensor c_aligned = beta != 0.0f ? aligned_copy(c) : Tensor::empty(c.shape(), c.dtype(), c.device());
  p.a = b_aligned.raw();
  p.b = a_aligned.raw();
  p.d = c_aligned.raw();
  MEGATRON_CHECK(try_lt_matmul(p),
                 "cuBLASLt found no algorithm for the GEMM " << problem << ", even on aligned copies");
  c.copy_from(c_aligned);
  return true;
}

// ---- small kernels -------------------------------------------------------------------------

// y (rows, cols) = bias broadcast over rows: the start of the accumulator when the bias
// epilogue is unavailable (the GEMM then adds with beta = 1, rounding once as the CPU does).
template <class T>
__global__ void broadcast_rows_kernel(T* y, const T* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) y[i] = bias[i % cols];
}

// Bias gradient, two deterministic passes summed in double (as the reduce family):
// partial[chunk][c] = sum of dy[r, c] over the chunk's rows; then db[c] += sum over chunks.
// Each thread owns kCols adjacent columns, read as one 16-byte access per row when the rows allow
// (kCols = kPack<T>), else one column; the order of additions per column is the same either way.
constexpr int64_t kRowsPerChunk = 64;

template <int kCols, class T>
__global__ void column_partials_kernel(double* partial, const T* dy, int64_t rows, int64_t cols) {
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kCols;
  if (c0 >= cols) return;
  const int64_t begin = int64_t(blockIdx.y) * kRowsPerChunk;
  const int64_t end = begin + kRowsPerChunk < rows ? begin + kRowsPerChunk : rows;
  double sum[kCols] = {};
  for (int64_t r = begin; r < end; ++r) {
    if constexpr (kCols == 1) {
      sum[0] += double(to_float(dy[r * cols + c0]));
    } else {
      float v[kCols];
      load_floats<kCols>(dy + r * cols + c0, v);
#pragma unroll
      for (int j = 0; j < kCols; ++j) sum[j] += double(v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j) partial[int64_t(blockIdx.y) * cols + c0 + j] = sum[j];
}

__global__ void column_finish_kernel(float* db, const double* partial, int64_t chunks, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double sum = 0.0;
  for (int64_t j = 0; j < chunks; ++j) sum += partial[j * cols + c];
  db[c] = float(double(db[c]) + sum);
}

template <int kCols, class T>
void launch_column_partials(double* partial, const T* dy, int64_t rows, int64_t cols, int64_t chunks) {
  const dim3 grid(unsigned(ceil_div(cols / kCols, kThreads)), unsigned(chunks));
  column_partials_kernel<kCols, T><<<grid, kThreads, 0, stream()>>>(partial, dy, rows, cols);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void bias_grad(float* db, const T* dy, int64_t rows, int64_t cols, Device device) {
  const int64_t chunks = ceil_div(rows, kRowsPerChunk);
  MEGATRON_CHECK(chunks <= 65535, "linear_backward: " << rows << " rows exceed the bias-gradient kernel's limit of "
                                                      << 65535 * kRowsPerChunk << "; split the batch");
  Tensor partial = Tensor::empty({chunks, cols}, DType::f64, device);  // from the caching allocator
  auto* p = static_cast<double*>(partial.raw());
  // Every row starts 16-byte aligned when the base is and a row is a whole number of packs.
  if (is_aligned16(dy) && cols % kPack<T> == 0) {
    launch_column_partials<kPack<T>>(p, dy, rows, cols, chunks);
  } else {
    launch_column_partials<1>(p, dy, rows, cols, chunks);
  }
  column_finish_kernel<<<unsigned(ceil_div(cols, kThreads)), kThreads, 0, stream()>>>(db, p, chunks, cols);
  CUDA_CHECK_LAUNCH();
}

// ---- argument checks: the shared rules (ops/checks/gemm.h) with CUDA's device and dtypes -----

void check_cuda_gemm_dtype(const Tensor& t, const char*) {
  lt_type(t.dtype());  // rejects f64 and non-float dtypes with a clear message
}

constexpr checks::GemmBackend kCudaGemm{check_cuda, check_cuda_gemm_dtype};

}  // namespace

void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params) {
  const auto [m, n, k] = checks::check_matmul(c, a, b, params, kCudaGemm);
  const bool ta = params.trans_a == Transpose::yes, tb = params.trans_b == Transpose::yes;
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty product: C = beta C (and beta = 0 ignores C, NaN included, as BLAS does)
    if (params.beta == 0.0f) {
      c.zero();
    } else {
      scale(c, c, params.beta);
    }
    return;
  }
  row_major_gemm(ta, tb, m, n, k, a, b, c, params.alpha, params.beta, nullptr);
}

void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // Plain variables, not structured bindings: the lambdas below capture them.
  const checks::LinearDims dims = checks::check_linear_forward(y, x, weight, bias, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  MEGATRON_CHECK(in_features > 0, "linear weight " << shape_str(weight.shape()) << " has no input features");
  if (n == 0 || out_features == 0) return;
  // y (N,out) = x (N,in) W^T (+ bias)
  if (!bias.defined()) {
    row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 0.0f, nullptr);
    return;
  }
  if (row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 0.0f, bias.raw())) return;
  dispatch_storage(y.dtype(), "linear_forward", [&]<class T>(std::type_identity<T>) {
    broadcast_rows_kernel<T><<<grid_for(n * out_features), kThreads, 0, stream()>>>(
        device_data<T>(y), device_data<T>(bias), n, out_features);
    CUDA_CHECK_LAUNCH();
  });
  row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 1.0f, nullptr);
}

void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight) {
  const checks::LinearDims dims = checks::check_linear_backward(dx, dweight, dbias, dy, x, weight, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  if (dx.defined() && n > 0 && in_features > 0) {
    // dx (N,in) = dy (N,out) @ W (out,in); no output features: dx = 0
    if (out_features == 0) {
      dx.zero();
    } else {
      row_major_gemm(false, false, n, in_features, out_features, dy, weight, dx, 1.0f, 0.0f, nullptr);
    }
  }
  if (n == 0 || out_features == 0) return;  // nothing to accumulate
  // dW (out,in) += dy^T (out,N) @ x (N,in), straight into the fp32 main grad
  if (in_features > 0) row_major_gemm(true, false, out_features, in_features, n, dy, x, dweight, 1.0f, 1.0f, nullptr);
  if (dbias.defined()) {
    dispatch_storage(dy.dtype(), "linear_backward", [&]<class T>(std::type_identity<T>) {
      bias_grad<T>(device_data<float>(dbias), device_data<T>(dy), n, out_features, dy.device());
    });
  }
}

}  // namespace megatron::ops::cuda
