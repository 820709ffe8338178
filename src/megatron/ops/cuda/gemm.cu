// GEMM and the linear layer on CUDA through cuBLASLt: f32, bf16 or f16 operands, FP32 accumulation
// (CUBLAS_COMPUTE_32F: full FP32 for f32 operands, never TF32, so results track the CPU), output
// in the operands' dtype or f32. The weight gradient accumulates straight into the fp32 main grad
// (beta = 1, 16-bit operands, f32 C/D): Megatron's gradient-accumulation fusion. Epilogues fuse the
// rest: the forward bias (BIAS), the bias gradient out of the weight-gradient GEMM (BGRADB, which
// can only write, so into a scratch vector then added to the main grad), and the MLP's GELU
// (GELU_AUX(_BIAS) forward, DGELU on fc2's input-gradient GEMM) for 16-bit outputs. Where cuBLASLt
// has no algorithm for an epilogue (odd sizes or alignments), the op runs unfused: a broadcast
// bias, a deterministic column-sum kernel, the GELU kernels of activation.h; a warning names it.
//
// FP8 (ops/fp8.h): the same call with e4m3/e5m2 operands and their scale_inv pointers
// (A_SCALE_POINTER, B_SCALE_POINTER: cuBLASLt multiplies the product by both), FP32 accumulation,
// bf16/f16/f32 output. Hopper's tensor cores take FP8 only as "TN" (column-major op(A) = A^T,
// op(B) = B: row-major C = A B^T), so fp8_matmul first makes transposed copies of operands given
// the other way, as Transformer Engine keeps an FP8 tensor's transpose beside it.
// Blockwise FP8 (fp8_matmul_blockwise) is the same call with A_SCALE_MODE / B_SCALE_MODE set to
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (1x128 tiles) or ..._BLK128x128_32F (128x128 blocks),
// cuBLAS 12.9+ on compute capability 9.0, where the scale pointers point to f32 tensors, not
// scalars. The layouts cuBLAS documents for them (cuBLAS docs, "cublasLtMatmulMatrixScale_t" and
// "1D/2D block scaling factors layout"; the same as Transformer Engine's "GEMM-ready" scales,
// docs/features/low_precision_training/fp8_blockwise_scaling), for a column-major operand of
// outer size R with K contiguous: VEC128 holds ceil(K/128) x round_up(R, 4) scales, R fastest
// (column-major R x ceil(K/128)); BLK128x128 holds ceil(R/128) x round_up(ceil(K/128), 4), the
// K blocks fastest. A row-major (R, K) operand is that column-major K x R one, so ops/fp8.h's
// fp8_block_scale_shape is exactly this layout and the scales go to cuBLASLt as they are (PyTorch's
// torch._scaled_mm, on the same cuBLASLt modes, asks the same: 1x128 scales (M, K/128)
// outer-dim-major, 128x128 scales (M/128, K/128) with 16-byte aligned row strides). cuBLAS
// lists VEC128 x VEC128, VEC128 x BLK128x128 and BLK128x128 x VEC128 (not both 2-D), which are
// also the pairs Transformer Engine's Float8BlockScaling asserts.
//
// Row-major vs column-major: a row-major (r, c) matrix is a column-major (c, r) one, so row-major
// C (M,N) = op(A) op(B) is computed as column-major C^T (N,M) = op(B)^T op(A)^T, i.e. cuBLASLt's
// "A" is our B and its "B" is our A, with the same transpose flags.
//
// Algorithms come from cuBLASLt's heuristic, queried once per (device, shape, transposes,
// dtypes, epilogue, pointer alignments) and cached; descriptors are rebuilt per call (a few
// host microseconds, and no shared mutable state between threads). Shapes that change from call
// to call (the MoE experts' rows, one GEMM per expert) would ask the heuristic on nearly every
// call, which costs far more host time than the launch; so a shape not seen before first tries
// the algorithm found for another shape of its size class (each of m, n, k rounded up to 8 steps
// per octave), checked for the exact problem with cublasLtMatmulAlgoCheck.
#include <array>
#include <bit>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "megatron/core/logging.h"
#include "megatron/ops/activation.h"
#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/checks/gemm.h"
#include "megatron/ops/cuda/blas_type.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/cuda/op_paths.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/fp8.h"
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

// What the epilogue does besides storing D, in cuBLASLt's column-major terms. Vectors have D's type.
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  // BIAS, GELU_AUX_BIAS: added to every column of D (length m). BGRADB: receives the sums of op(B)
  // over k (length n), written, not accumulated.
  const void* bias = nullptr;
  // GELU_AUX*: receives the GELU input (m,n), leading dimension m. DGELU: supplies it.
  const void* aux = nullptr;
};

// The count a fused call adds to (ops/cuda/op_paths.h).
OpPath epilogue_path(cublasLtEpilogue_t kind) {
  switch (kind) {
    case CUBLASLT_EPILOGUE_BIAS:
      return OpPath::gemm_bias_epilogue;
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return OpPath::gemm_gelu_aux_epilogue;
    case CUBLASLT_EPILOGUE_DGELU:
      return OpPath::gemm_dgelu_epilogue;
    default:
      return OpPath::gemm_bgradb_epilogue;  // the only other epilogue the ops ask for
  }
}

const char* epilogue_name(cublasLtEpilogue_t kind) {
  switch (kind) {
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "DEFAULT";
  }
}

// Column-major D (m,n) = alpha op(A) op(B) + beta C, C = D, then the epilogue.
struct LtProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  LtEpilogue epilogue;
  cudaDataType a_type = CUDA_R_32F, b_type = CUDA_R_32F, d_type = CUDA_R_32F;
  float alpha = 1.0f, beta = 0.0f;
  // FP8 operands' scale_inv (one f32 each, on the device); null for other dtypes.
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  // What those point to: CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F (one f32), or blockwise scales.
  cublasLtMatmulMatrixScale_t a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cublasLtMatmulMatrixScale_t b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  bool fast_accumulation = false;  // FP8 only: MatmulParams::fp8_fast_accumulation
};

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && v % align != 0) align /= 2;
  return align;
}

struct PlanKey {
  std::array<int64_t, 18> fields{};
  bool operator==(const PlanKey&) const = default;
};
// v rounded up to its size class: up to 16 each value is its own; above, v rounded up to its top
// four bits (8 classes per power of two: 2048 stays, 2049..2304 become 2304).
int64_t size_class(int64_t v) {
  if (v <= 16) return v;
  const int shift = int(std::bit_width(uint64_t(v))) - 4;
  return ((v + (int64_t(1) << shift) - 1) >> shift) << shift;
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = 0;
    for (int64_t f : key.fields) h = h * 1000003u ^ std::hash<int64_t>{}(f);
    return h;
  }
};

// Heuristic results per problem class; nullopt records "no algorithm" so it is not asked again.
// by_size_class: the first algorithm found in each size class (a PlanKey with m, n, k classed).
struct AlgoCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::optional<cublasLtMatmulAlgo_t>, PlanKeyHash> algos;
  std::unordered_map<PlanKey, cublasLtMatmulAlgo_t, PlanKeyHash> by_size_class;
};
AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

// Runs the problem; returns false (doing nothing) when cuBLASLt has no algorithm for it. For a
// problem with an epilogue, any refusal of the heuristic counts as "no algorithm" (the caller has
// an unfused path) and is reported once per problem class.
bool try_lt_matmul(const LtProblem& p) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  cublasLtMatmulDesc_t raw_desc = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  const cublasLtEpilogue_t epilogue = p.epilogue.kind;
  const auto refuse = [epilogue] {  // the caller runs an epilogue it refuses unfused
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) count_op_path(OpPath::gemm_epilogue_unfused);
    return false;
  };
  set_desc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (p.epilogue.bias != nullptr) set_desc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.epilogue.bias);
  if (p.epilogue.aux != nullptr) {
    set_desc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.epilogue.aux);
    set_desc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(p.m));
  }
  if (p.a_scale_inv != nullptr) set_desc(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a_scale_inv);
  if (p.b_scale_inv != nullptr) set_desc(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b_scale_inv);
  if (p.a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
    set_desc(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, p.a_scale_mode);
  if (p.b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
    set_desc(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, p.b_scale_mode);
  if (p.fast_accumulation) set_desc(raw_desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(1));

  const MatrixLayout a = make_layout(p.a_type, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k);
  const MatrixLayout b = make_layout(p.b_type, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n);
  const MatrixLayout d = make_layout(p.d_type, p.m, p.n);

  const uint32_t align_a = alignment_of(p.a), align_b = alignment_of(p.b), align_d = alignment_of(p.d);
  const PlanKey key{{p.m, p.n, p.k, p.trans_a, p.trans_b, p.a_type, p.b_type, p.d_type, epilogue, align_a, align_b,
                     align_d, p.epilogue.bias != nullptr ? alignment_of(p.epilogue.bias) : 0,
                     p.epilogue.aux != nullptr ? alignment_of(p.epilogue.aux) : 0, ctx.device(), p.a_scale_mode,
                     p.b_scale_mode, p.fast_accumulation}};
  PlanKey class_key = key;
  for (size_t i = 0; i < 3; ++i) class_key.fields[i] = size_class(key.fields[i]);
  AlgoCache& cache = algo_cache();
  std::optional<cublasLtMatmulAlgo_t> algo, of_class;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      algo = it->second;
      if (!algo) return refuse();
    } else if (auto c = cache.by_size_class.find(class_key); c != cache.by_size_class.end()) {
      of_class = c->second;
    }
  }
  if (!algo && of_class) {
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(ctx.blas_lt(), raw_desc, a.get(), b.get(), d.get(), d.get(), &*of_class, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= ctx.blas_workspace_bytes()) {
      algo = of_class;
      count_op_path(OpPath::gemm_algo_of_size_class);
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
    const bool fused = epilogue != CUBLASLT_EPILOGUE_DEFAULT;
    if (status != CUBLAS_STATUS_NOT_SUPPORTED && !fused) CUBLAS_CHECK(status);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    if (!algo && fused) {
      LOG_WARN("cuBLASLt has no algorithm for the " << epilogue_name(epilogue) << " epilogue on D (" << p.m << ","
                                                    << p.n << "), k " << p.k << " (" << cublasLtGetStatusName(status)
                                                    << "); running it unfused, which is slower");
    }
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.algos[key] = algo;
    if (algo) cache.by_size_class.try_emplace(class_key, *algo);
  }
  if (!algo) return refuse();
  CUBLAS_CHECK(cublasLtMatmul(ctx.blas_lt(), raw_desc, &p.alpha, p.a, a.get(), p.b, b.get(), &p.beta, p.d, d.get(), p.d,
                              d.get(), &*algo, ctx.blas_workspace(), ctx.blas_workspace_bytes(), stream()));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) count_op_path(epilogue_path(epilogue));
  return true;
}

// ---- row-major front end -------------------------------------------------------------------

// A copy of t in a fresh allocator block (512-byte aligned), queued on the current stream.
Tensor aligned_copy(const Tensor& t) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy.copy_from(t);
  return copy;
}

// FP8 operands' scale_invs ((1) f32 device tensors, or undefined for other dtypes), or their
// block scales (fp8_block_scale_shape's layout) with the matching modes.
struct ScaleInvs {
  Tensor a, b;
  cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  bool fast_accumulation = false;
};

// The cuBLASLt type of an operand: blas_type's, and the two FP8 formats.
cudaDataType operand_type(DType dtype) {
  if (dtype == DType::e4m3) return CUDA_R_8F_E4M3;
  if (dtype == DType::e5m2) return CUDA_R_8F_E5M2;
  return blas_type(dtype);
}

// Row-major C (M,N) = alpha op(A) op(B) + beta C with op(A) (M,K), op(B) (K,N), and the epilogue,
// which in row-major terms reads: BIAS adds a vector over C's columns (length N) to every row;
// GELU_AUX* and DGELU take an (M,N) matrix like C; BGRADB writes the sums of op(A) over K
// (length M, e.g. the column sums of dy for dy^T x). Returns false when the epilogue has no
// algorithm (the caller runs it unfused). Operands at addresses cuBLASLt has no algorithm for
// (views at odd element offsets) are copied to aligned blocks first. FP8 operands come with
// their scale_invs.
bool row_major_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, Tensor& c,
                    float alpha, float beta, const LtEpilogue& epilogue = {}, const ScaleInvs& scale_invs = {}) {
  LtProblem p;
  p.trans_a = tb;
  p.trans_b = ta;
  p.m = n;
  p.n = m;
  p.k = k;
  p.a = b.raw();
  p.b = a.raw();
  p.d = c.raw();
  p.epilogue = epilogue;
  p.a_type = operand_type(b.dtype());
  p.b_type = operand_type(a.dtype());
  p.d_type = blas_type(c.dtype());
  if (scale_invs.a.defined()) p.b_scale_inv = device_data<float>(scale_invs.a);
  if (scale_invs.b.defined()) p.a_scale_inv = device_data<float>(scale_invs.b);
  p.a_scale_mode = scale_invs.b_mode;  // cuBLASLt's A is our B (row-major C^T = B A^T)
  p.b_scale_mode = scale_invs.a_mode;
  p.fast_accumulation = scale_invs.fast_accumulation;
  p.alpha = alpha;
  p.beta = beta;
  if (try_lt_matmul(p)) return true;
  if (epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT) return false;
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

// FP8 transpose: out (cols, rows) = in (rows, cols)^T, bytes, through a 32x32 shared tile (reads
// and writes both along rows). Blocks of 32x8 threads, 4 rows each.
constexpr int kTile = 32;
__global__ void transpose_bytes_kernel(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = int(threadIdx.y); i < kTile; i += int(blockDim.y)) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out row c, column r
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

// A transposed copy of a 2-D FP8 tensor.
Tensor transposed_fp8(const Tensor& t) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty({cols, rows}, t.dtype(), t.device());
  const dim3 grid(unsigned(ceil_div(cols, kTile)), unsigned(ceil_div(rows, kTile)));
  MEGATRON_CHECK(grid.y <= 65535, "fp8 transpose: " << rows << " rows exceed the kernel's grid; split the GEMM");
  transpose_bytes_kernel<<<grid, dim3(kTile, 8), 0, stream()>>>(static_cast<uint8_t*>(out.raw()),
                                                                static_cast<const uint8_t*>(t.raw()), rows, cols);
  CUDA_CHECK_LAUNCH();
  return out;
}

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
  blas_type(t.dtype());  // rejects f64 and non-float dtypes with a clear message
}

constexpr checks::GemmBackend kCudaGemm{check_cuda, check_cuda_gemm_dtype};

// ---- shared pieces of the linear ops -------------------------------------------------------

// The GELU epilogues run for 16-bit outputs only, whose rounding (2^-9 or 2^-12) dwarfs any
// shortcut cuBLASLt's GELU may take; f32 runs the GELU kernels, which track the CPU to float
// rounding. cuBLASLt also needs the GELU matrix's leading dimension (its row length) a multiple of 8.
bool gelu_epilogue_applies(const Tensor& out, const Tensor& aux, int64_t row_length) {
  if (out.dtype() != DType::bf16 && out.dtype() != DType::f16) return false;
  const bool fits = row_length % 8 == 0 && is_aligned16(out.raw()) && is_aligned16(aux.raw());
  if (!fits) count_op_path(OpPath::gemm_epilogue_unfused);
  return fits;
}

// dW (out,in) += dy^T (out,N) @ x (N,in) straight into the fp32 main grad (= with
// GradWrite::overwrite: beta 0, so cuBLASLt never reads the old values), and db += the column
// sums of dy: from the same GEMM through the BGRADB epilogue (into a scratch vector, added to
// db), else from the column-sum kernel.
void weight_and_bias_grads(Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                           const checks::LinearDims& dims, GradWrite dweight_write) {
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  if (!dweight.defined()) return;  // dx only
  const bool overwrite = dweight_write == GradWrite::overwrite;
  if (n == 0 || out_features == 0) {  // nothing to accumulate: an overwritten dW is zero
    if (overwrite) dweight.zero();
    return;
  }
  const float beta = overwrite ? 0.0f : 1.0f;
  if (in_features > 0 && dbias.defined()) {
    Tensor db_step = Tensor::empty({out_features}, DType::f32, dy.device());
    if (row_major_gemm(true, false, out_features, in_features, n, dy, x, dweight, 1.0f, beta,
                       {CUBLASLT_EPILOGUE_BGRADB, db_step.raw(), nullptr})) {
      add_scaled(dbias, db_step, 1.0f);
      return;
    }
  }
  if (in_features > 0) row_major_gemm(true, false, out_features, in_features, n, dy, x, dweight, 1.0f, beta);
  if (dbias.defined()) {
    dispatch_storage(dy.dtype(), "linear_backward", [&]<class T>(std::type_identity<T>) {
      bias_grad<T>(device_data<float>(dbias), device_data<T>(dy), n, out_features, dy.device());
    });
  }
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params) {
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
  row_major_gemm(ta, tb, m, n, k, a, b, c, params.alpha, params.beta);
}

void cuda::fp8_matmul(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                      const MatmulParams& params) {
  const auto [m, n, k] = checks::check_fp8_matmul(c, a, a_scale_inv, b, b_scale_inv, params, check_cuda);
  // cuBLASLt's FP8 rules (16-byte leading dimensions of the FP8 operands and of C), which
  // Transformer Engine states as "dimensions divisible by 16".
  MEGATRON_CHECK(
      k > 0 && n > 0 && k % 16 == 0 && n % 16 == 0,
      "fp8_matmul C (" << m << "," << n << ") with K = " << k << ": FP8 GEMMs on CUDA need K and C's column "
                       << "count to be positive multiples of 16; pad the sizes (hidden, FFN, heads x head dim, "
                       << "micro-batch x sequence tokens) to multiples of 16, or train in bf16");
  if (m == 0) return;
  // Hopper's TN rule: A (m,k) and B (n,k) as stored rows.
  const Tensor a_rows = params.trans_a == Transpose::yes ? transposed_fp8(a) : a;
  const Tensor b_rows = params.trans_b == Transpose::yes ? b : transposed_fp8(b);
  row_major_gemm(false, true, m, n, k, a_rows, b_rows, c, params.alpha, params.beta, {},
                 {.a = a_scale_inv, .b = b_scale_inv, .fast_accumulation = params.fp8_fast_accumulation});
}

void cuda::fp8_matmul_blockwise(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, Fp8BlockShape a_blocks,
                                const Tensor& b, const Tensor& b_scale_inv, Fp8BlockShape b_blocks,
                                const MatmulParams& params) {
  const auto [m, n, k] =
      checks::check_fp8_matmul_blockwise(c, a, a_scale_inv, a_blocks, b, b_scale_inv, b_blocks, params, check_cuda);
  MEGATRON_CHECK(k > 0 && n > 0 && k % 16 == 0 && n % 16 == 0,
                 "fp8_matmul_blockwise C ("
                     << m << "," << n << ") with K = " << k << ": FP8 GEMMs on CUDA need K and C's "
                     << "column count to be positive multiples of 16; pad the sizes (hidden, FFN, heads x "
                     << "head dim, micro-batch x sequence tokens) to multiples of 16, or train in bf16");
  if (m == 0) return;
  const auto mode = [](Fp8BlockShape blocks) {
    return blocks == Fp8BlockShape::tile_1x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  };
  row_major_gemm(false, true, m, n, k, a, b, c, params.alpha, params.beta, {},
                 {a_scale_inv, b_scale_inv, mode(a_blocks), mode(b_blocks)});
}

void cuda::linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // Plain variables, not structured bindings: the lambdas below capture them.
  const checks::LinearDims dims = checks::check_linear_forward(y, x, weight, bias, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  MEGATRON_CHECK(in_features > 0, "linear weight " << shape_str(weight.shape()) << " has no input features");
  if (n == 0 || out_features == 0) return;
  // y (N,out) = x (N,in) W^T (+ bias)
  if (!bias.defined()) {
    row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 0.0f);
    return;
  }
  if (row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 0.0f,
                     {CUBLASLT_EPILOGUE_BIAS, bias.raw(), nullptr}))
    return;
  dispatch_storage(y.dtype(), "linear_forward", [&]<class T>(std::type_identity<T>) {
    broadcast_rows_kernel<T><<<grid_for(n * out_features), kThreads, 0, stream()>>>(
        device_data<T>(y), device_data<T>(bias), n, out_features);
    CUDA_CHECK_LAUNCH();
  });
  row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 1.0f);
}

void cuda::linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                           const Tensor& weight, GradWrite dweight_write) {
  const checks::LinearDims dims = checks::check_linear_backward(dx, dweight, dbias, dy, x, weight, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  if (dx.defined() && n > 0 && in_features > 0) {
    // dx (N,in) = dy (N,out) @ W (out,in); no output features: dx = 0
    if (out_features == 0) {
      dx.zero();
    } else {
      row_major_gemm(false, false, n, in_features, out_features, dy, weight, dx, 1.0f, 0.0f);
    }
  }
  weight_and_bias_grads(dweight, dbias, dy, x, dims, dweight_write);
}

void cuda::linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const checks::LinearDims dims = checks::check_linear_gelu_forward(y, pre, x, weight, bias, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  MEGATRON_CHECK(in_features > 0, "linear weight " << shape_str(weight.shape()) << " has no input features");
  if (n == 0 || out_features == 0) return;
  // pre (N,out) = x W^T (+ bias) as the epilogue's aux output, y = gelu(pre) as D.
  if (gelu_epilogue_applies(y, pre, out_features)) {
    const LtEpilogue epilogue{bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                              bias.defined() ? bias.raw() : nullptr, pre.raw()};
    if (row_major_gemm(false, true, n, out_features, in_features, x, weight, y, 1.0f, 0.0f, epilogue)) return;
  }
  linear_forward(pre, x, weight, bias);
  gelu_forward(y, pre);
}

void cuda::gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                const Tensor& weight, const Tensor& pre, GradWrite dweight_write) {
  const checks::LinearDims dims =
      checks::check_gelu_linear_backward(dpre, dweight, dbias, dy, x, weight, pre, kCudaGemm);
  const int64_t n = dims.n, out_features = dims.out_features, in_features = dims.in_features;
  if (n > 0 && in_features > 0) {
    // dpre (N,in) = (dy (N,out) @ W (out,in)) * gelu'(pre); no output features: dpre = 0
    if (out_features == 0) {
      dpre.zero();
    } else if (!gelu_epilogue_applies(dpre, pre, in_features) ||
               !row_major_gemm(false, false, n, in_features, out_features, dy, weight, dpre, 1.0f, 0.0f,
                               {CUBLASLT_EPILOGUE_DGELU, nullptr, pre.raw()})) {
      Tensor dact = Tensor::empty(dpre.shape(), dpre.dtype(), dpre.device());
      row_major_gemm(false, false, n, in_features, out_features, dy, weight, dact, 1.0f, 0.0f);
      gelu_backward(dpre, dact, pre);
    }
  }
  weight_and_bias_grads(dweight, dbias, dy, x, dims, dweight_write);
}

}  // namespace megatron::ops
