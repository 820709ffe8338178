// The grouped GEMM on CUDA: every expert's GEMM in one launch.
//   - bf16/f16: our tensor-core kernel (grouped_gemm_kernels.cuh), one launch per product
//     (forward, dgrad, wgrad) over all experts, fp32 accumulation, dW accumulated into the fp32
//     main grad. It takes widths (in, out) that are multiples of 8, 16-byte aligned operands and at
//     most kMaxGroups experts; other shapes go the cuBLAS way below.
//   - f32 (and 16-bit shapes our kernel does not take): one cublasGemmGroupedBatchedEx launch (one
//     group per expert with rows), full FP32 compute as the other GEMMs (never TF32). cuBLAS is
//     column-major; a row-major (r,c) matrix is its (c,r) transpose, so each product is written
//     transposed: y^T = W x^T, dx^T = W^T dy^T, dW^T += x^T dy. The per-group pointer arrays go to
//     the device through a small caching-allocator buffer per call; the sizes stay on the host
//     (cuBLAS reads m, n, k there). Where cuBLAS has no grouped kernel for the types (it answers
//     NOT_SUPPORTED, as CUDA 13 does for bf16 -> bf16) or the operands are not 16-byte aligned
//     (its kernels fault on those), the op runs the per-expert cuBLASLt loop of gemm.h instead
//     (cuBLASLt picks its kernels by alignment) and warns once.
// Host counts with many rows per expert (kPerExpertGemmRows) run the per-expert cuBLASLt loop
// too: there one library GEMM per expert outruns our one launch.
// Rows given as device offsets (routing on the device): our kernel builds its tile table on the
// device; the cuBLAS ways read the counts back first (a wait for the device, on f32 and odd
// shapes only).
// Each launch is counted in op_paths.h (grouped_gemm_mma / _cublas / _per_expert).
#include <cublas_v2.h>

#include <array>

#include "megatron/core/logging.h"
#include "megatron/ops/checks/grouped_gemm.h"
#include "megatron/ops/cuda/blas_type.h"
#include "megatron/ops/cuda/grouped_gemm_kernels.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/cuda/op_paths.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"

namespace megatron::ops::cuda {
namespace {

// One problem per group: C (m,n) = alpha op(A) op(B) + beta C, column-major.
struct Problem {
  cublasOperation_t trans_a, trans_b;
  int m, n, k, lda, ldb, ldc;
  const void* a;
  const void* b;
  void* c;
};

// Every matrix starts on a 16-byte boundary and its columns (cuBLAS's; our rows) are a multiple
// of 16 bytes apart. cuBLAS's grouped kernels seem to assume it without checking: on an H200
// (CUDA 13) bf16 experts whose rows start at 8-byte boundaries (in = 20) ended in a
// misaligned-address fault, where the only grouped call cuBLAS accepted was the bf16 -> f32
// weight gradient (the others answer NOT_SUPPORTED and loop over cuBLASLt, which picks its
// kernels by alignment).
bool aligned16(const Problem& p, size_t ab_bytes, size_t c_bytes) {
  return is_aligned16(p.a) && is_aligned16(p.b) && is_aligned16(p.c) && size_t(p.lda) * ab_bytes % 16 == 0 &&
         size_t(p.ldb) * ab_bytes % 16 == 0 && size_t(p.ldc) * c_bytes % 16 == 0;
}

// Runs the problems in one grouped launch; false when cuBLAS has no kernel for these types, or
// the operands are not all 16-byte aligned (aligned16): the caller then loops over the experts.
bool run_grouped(const std::vector<Problem>& problems, DType ab_dtype, DType c_dtype, float beta, Device device) {
  if (problems.empty()) return true;
  for (const Problem& p : problems)
    if (!aligned16(p, dtype_size(ab_dtype), dtype_size(c_dtype))) return false;
  const cudaDataType_t ab_type = blas_type(ab_dtype), c_type = blas_type(c_dtype);
  const size_t G = problems.size();
  std::vector<cublasOperation_t> ta(G), tb(G);
  std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), group_size(G, 1);
  std::vector<float> alphas(G, 1.0f), betas(G, beta);
  std::vector<const void*> pointers(3 * G);  // [A... | B... | C...]
  for (size_t g = 0; g < G; ++g) {
    const Problem& p = problems[g];
    ta[g] = p.trans_a, tb[g] = p.trans_b;
    m[g] = p.m, n[g] = p.n, k[g] = p.k, lda[g] = p.lda, ldb[g] = p.ldb, ldc[g] = p.ldc;
    pointers[g] = p.a, pointers[G + g] = p.b, pointers[2 * G + g] = p.c;
  }
  Tensor device_pointers = Tensor::empty({int64_t(3 * G)}, DType::i64, device);
  CUDA_CHECK(
      cudaMemcpyAsync(device_pointers.raw(), pointers.data(), 3 * G * sizeof(void*), cudaMemcpyHostToDevice, stream()));
  auto* const* table = static_cast<void* const*>(device_pointers.raw());
  cublasHandle_t handle = megatron::cuda::current_context().blas();
  CUBLAS_CHECK(cublasSetStream(handle, stream()));
  const cublasStatus_t status =
      cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(), table,
                                 ab_type, lda.data(), table + G, ab_type, ldb.data(), betas.data(), table + 2 * G,
                                 c_type, ldc.data(), int(G), group_size.data(), CUBLAS_COMPUTE_32F);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  CUBLAS_CHECK(status);
  count_op_path(OpPath::grouped_gemm_cublas);
  // The pointer table is freed here, but the caching allocator hands it out again only in stream
  // order, after the launch has read it.
  return true;
}

void warn_fallback(const char* what) {
  static std::once_flag once;
  std::call_once(once, [what] {
    LOG_WARN("cuBLAS's grouped GEMM takes no " << what
                                              << " operands of this shape or alignment (or has no kernel for the type); "
                                                 "the experts run one cuBLASLt GEMM each");
  });
}

// Host counts of many rows per expert: one cuBLASLt GEMM per expert beats one launch of ours.
bool per_expert_gemms_pay(const ExpertRows& rows, int64_t total_rows) {
  return !rows.offsets.defined() && rows.experts() > 0 && total_rows >= kPerExpertGemmRows * rows.experts();
}

// The per-expert loop of gemm.h's linear ops over the experts with rows.
void per_expert_forward(Tensor& y, const Tensor& x, const Tensor& weight, const std::vector<int64_t>& counts) {
  count_op_path(OpPath::grouped_gemm_per_expert);
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    if (counts[e] == 0) continue;
    Tensor y_e = y.slice(begin, begin + counts[e]);
    cuda::linear_forward(y_e, x.slice(begin, begin + counts[e]), weight.select(int64_t(e)), Tensor());
  }
}

// An overwriting backward gives the experts without rows (whose GEMMs are skipped) zero weight
// gradients.
void zero_experts_without_rows(Tensor& dweight, const std::vector<int64_t>& counts, GradWrite dweight_write) {
  if (!dweight.defined() || dweight_write != GradWrite::overwrite) return;
  for (size_t e = 0; e < counts.size(); ++e)
    if (counts[e] == 0) dweight.select(int64_t(e)).zero();
}

// dx and dweight as grouped_linear_backward; either undefined is skipped.
void per_expert_backward(Tensor& dx, Tensor& dweight, const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const std::vector<int64_t>& counts, GradWrite dweight_write) {
  count_op_path(OpPath::grouped_gemm_per_expert);
  zero_experts_without_rows(dweight, counts, dweight_write);
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    if (counts[e] == 0) continue;
    const int64_t end = begin + counts[e];
    Tensor dx_e = dx.defined() ? dx.slice(begin, end) : Tensor();
    Tensor dw_e = dweight.defined() ? dweight.select(int64_t(e)) : Tensor();
    Tensor no_bias;
    if (dx_e.defined() || dw_e.defined())
      cuda::linear_backward(dx_e, dw_e, no_bias, dy.slice(begin, end), x.slice(begin, end), weight.select(int64_t(e)),
                            dweight_write);
  }
}

const char* element(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.raw()) + row * t.dim(-1) * int64_t(t.element_size());
}

// ---- our kernel (bf16, f16) ------------------------------------------------------------------

namespace ggd = grouped_gemm_detail;
// 128x256 block tiles of 8 warps (64x64 each), 64 deep, 3 stages (144 KiB of shared memory):
// chosen with bench/kernels/grouped_gemm.cu.
using MmaTiles = ggd::Tiles<128, 256, 64, 2, 4, 3>;

// Whether our kernel takes these operands: 16-bit, widths multiples of 8 (a 16-byte chunk never
// straddles a row end), every defined operand 16-byte aligned, the experts within the launch
// table and the row offsets within int.
bool mma_applies(const Tensor& x, const Tensor& weight, const ExpertRows& rows,
                 std::initializer_list<const Tensor*> operands) {
  if (x.dtype() != DType::bf16 && x.dtype() != DType::f16) return false;
  if (x.dim(1) % 8 != 0 || weight.dim(1) % 8 != 0) return false;
  // The device table's grid bound adds a tile row per expert to the rows: kept within int.
  if (rows.experts() > ggd::kMaxGroups || x.dim(0) + 256 * (rows.experts() + 1) >= (int64_t(1) << 31)) return false;
  for (const Tensor* t : operands)
    if (t->defined() && !is_aligned16(t->raw())) return false;
  return true;
}

// The kernel's view of the rows, and the device scratch for its tile table when they are device
// offsets (freed after the launches: the caching allocator reuses it in stream order only).
struct MmaRows {
  ggd::RowGroups groups;
  Tensor table;  // i32 scratch the size of a GroupTable, or undefined
  MmaRows(const ExpertRows& rows, int64_t total_rows, Device device)
      : groups{rows.offsets.defined() ? nullptr : rows.counts.data(),
               rows.offsets.defined() ? static_cast<const int32_t*>(rows.offsets.raw()) : nullptr,
               int(rows.experts()), int(total_rows)} {
    static_assert(sizeof(ggd::GroupTable) % sizeof(int32_t) == 0);
    if (rows.offsets.defined())
      table = Tensor::empty({int64_t(sizeof(ggd::GroupTable) / sizeof(int32_t))}, DType::i32, device);
  }
  ggd::GroupTable* device_table() {
    return table.defined() ? static_cast<ggd::GroupTable*>(table.raw()) : nullptr;
  }
};

template <class T>
void forward_mma(Tensor& y, const Tensor& x, const Tensor& weight, MmaRows& rows) {
  ggd::grouped_forward<MmaTiles>(device_data<T>(y), device_data<T>(x), device_data<T>(weight), x.dim(1),
                                 weight.dim(1), rows.groups, rows.device_table(), stream());
  count_op_path(OpPath::grouped_gemm_mma);
}

template <class T>
void dgrad_mma(Tensor& dx, const Tensor& dy, const Tensor& weight, MmaRows& rows) {
  ggd::grouped_dgrad<MmaTiles>(device_data<T>(dx), device_data<T>(dy), device_data<T>(weight), dx.dim(1),
                               weight.dim(1), rows.groups, rows.device_table(), stream());
  count_op_path(OpPath::grouped_gemm_mma);
}

template <class T>
void wgrad_mma(Tensor& dweight, const Tensor& dy, const Tensor& x, MmaRows& rows) {
  ggd::grouped_wgrad<MmaTiles>(device_data<float>(dweight), device_data<T>(dy), device_data<T>(x), x.dim(1),
                               dy.dim(1), rows.groups, rows.device_table(), stream());
  count_op_path(OpPath::grouped_gemm_mma);
}

// Runs fn with T the 16-bit device type of dtype (mma_applies has ruled out the others).
template <class Fn>
void dispatch_mma(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) {
    fn(std::type_identity<__nv_bfloat16>{});
  } else {
    fn(std::type_identity<__half>{});
  }
}

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::grouped_linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const ExpertRows& rows) {
  checks::check_grouped_linear_forward(y, x, weight, rows, check_cuda);
  if (per_expert_gemms_pay(rows, x.dim(0))) return per_expert_forward(y, x, weight, rows.counts);
  if (mma_applies(x, weight, rows, {&y, &x, &weight})) {
    MmaRows mma_rows(rows, x.dim(0), x.device());
    dispatch_mma(x.dtype(), [&]<class T>(std::type_identity<T>) { forward_mma<T>(y, x, weight, mma_rows); });
    return;
  }
  const std::vector<int64_t> counts = rows.host_counts();
  const int in = int(x.dim(1)), out = int(weight.dim(1));
  std::vector<Problem> problems;
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    if (counts[e] == 0) continue;
    // y_e^T (out, N_e) = W_e (out,in as col-major (in,out), transposed) x_e^T (in, N_e)
    problems.push_back({CUBLAS_OP_T, CUBLAS_OP_N, out, int(counts[e]), in, in, in, out,
                        element(weight, int64_t(e) * out), element(x, begin), const_cast<char*>(element(y, begin))});
  }
  if (run_grouped(problems, x.dtype(), y.dtype(), 0.0f, x.device())) return;
  warn_fallback(dtype_name(x.dtype()));
  per_expert_forward(y, x, weight, counts);
}

void cuda::grouped_linear_backward(Tensor& dx, Tensor& dweight, const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const ExpertRows& rows, GradWrite dweight_write) {
  checks::check_grouped_linear_backward(dx, dweight, dy, x, weight, rows, check_cuda);
  if (per_expert_gemms_pay(rows, x.dim(0)))
    return per_expert_backward(dx, dweight, dy, x, weight, rows.counts, dweight_write);
  if (mma_applies(x, weight, rows, {&dx, &dweight, &dy, &x, &weight})) {
    // Our kernel only accumulates (its rows may be known on the device only).
    if (dweight.defined() && dweight_write == GradWrite::overwrite) dweight.zero();
    MmaRows mma_rows(rows, x.dim(0), x.device());
    dispatch_mma(x.dtype(), [&]<class T>(std::type_identity<T>) {
      if (dx.defined()) dgrad_mma<T>(dx, dy, weight, mma_rows);
      if (dweight.defined()) wgrad_mma<T>(dweight, dy, x, mma_rows);
    });
    return;
  }
  const std::vector<int64_t> counts = rows.host_counts();
  const int in = int(x.dim(1)), out = int(weight.dim(1));
  std::vector<Problem> dx_problems, dw_problems;
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    if (counts[e] == 0) continue;
    const int rows = int(counts[e]);
    const char* w_e = element(weight, int64_t(e) * out);
    // dx_e^T (in, N_e) = W_e^T (in,out: W_e row-major read as col-major) dy_e^T (out, N_e)
    if (dx.defined())
      dx_problems.push_back({CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, in, out, in, w_e, element(dy, begin),
                             const_cast<char*>(element(dx, begin))});
    // dW_e^T (in, out) += x_e^T (in, N_e) dy_e (N_e, out)
    if (dweight.defined())
      dw_problems.push_back({CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, in, out, in, element(x, begin),
                             element(dy, begin), const_cast<char*>(element(dweight, int64_t(e) * out))});
  }
  const bool dx_done = run_grouped(dx_problems, x.dtype(), x.dtype(), 0.0f, x.device());
  const bool overwrite = dweight_write == GradWrite::overwrite;
  const bool dw_done = run_grouped(dw_problems, x.dtype(), DType::f32, overwrite ? 0.0f : 1.0f, x.device());
  if (dw_done) zero_experts_without_rows(dweight, counts, dweight_write);
  if (dx_done && dw_done) return;
  warn_fallback(dtype_name(x.dtype()));
  Tensor dx_left = dx_done ? Tensor() : dx, dw_left = dw_done ? Tensor() : dweight;
  per_expert_backward(dx_left, dw_left, dy, x, weight, counts, dweight_write);
}

}  // namespace megatron::ops
