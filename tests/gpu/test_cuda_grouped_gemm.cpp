// The grouped GEMM (ops/grouped_gemm.h) on CUDA: all three products (forward y = x W^T, dgrad
// dx = dy W, wgrad dW += dy^T x) against the CPU reference run in f64 on the same bf16-exact
// values, expert by expert, on shapes that cut every tile edge (row counts not multiples of the
// 128-row tile, empty experts, widths past a 256-column tile or a 64-deep k step) and at the
// llama-1b MoE preset's widths; the op path each call took (our tensor-core kernel for 16-bit
// operands it takes, cuBLAS otherwise); against the per-expert loop of cuBLASLt linear ops, with
// both speeds printed (bench/kernels/grouped_gemm.cu times every product and tile shape).
//
// Tolerance (the bound of test_cuda_gemm.cpp): every output element is a K-term dot product
// accumulated in fp32 (the tensor cores' or cuBLAS's), so |computed - exact| <= gamma_K |A||B|
// elementwise, gamma_K ~ K u32; we take 2 (K + 2) u32 |A||B| (the factor 2 covers the tensor cores'
// truncating alignment of addends), computed by the CPU op on absolute values, plus one rounding of
// the output to its dtype: u |exact| with u = 2^-8 for bf16, 2^-11 for f16 (0 for the fp32 dW).
// K is `in` for the forward, `out` for dgrad, and the expert's rows + 1 for wgrad (its sum is
// added to the random fp32 dW already there). A wrong tile, expert or edge gives errors of the
// size of the values themselves, orders of magnitude above this bound.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/cuda/op_paths.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"

using namespace megatron;
using namespace megatron::test;
using ops::cuda::OpPath;

namespace {

class CudaGroupedGemm : public CudaTest {};

Tensor bound_of(const Tensor& abs_result, const Tensor& ref, int64_t k, DType out_dtype) {
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  const double u = out_dtype == DType::f32 ? 0.0 : unit_roundoff(out_dtype);
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = 2.0 * double(k + 2) * kUnitRoundoffF32 * abs_result.item(i);
    bound.set_item(i, e * (1.0 + u) + u * std::fabs(ref.item(i)));
  }
  return bound;
}

int64_t total(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

// One product's output split into the experts' parts: rows [begin, end) of a 2-D output (forward,
// dgrad), or slice e of the (E,out,in) dW.
struct ExpertPart {
  int64_t begin, end;  // in rows of the output viewed as (rows, width)
};
std::vector<ExpertPart> parts_by_rows(const std::vector<int64_t>& counts) {
  std::vector<ExpertPart> parts;
  int64_t begin = 0;
  for (int64_t c : counts) {
    parts.push_back({begin, begin + c});
    begin += c;
  }
  return parts;
}
std::vector<ExpertPart> parts_by_matrix(size_t experts, int64_t out) {
  std::vector<ExpertPart> parts;
  for (size_t e = 0; e < experts; ++e) parts.push_back({int64_t(e) * out, int64_t(e + 1) * out});
  return parts;
}

// |gpu - ref| <= bound everywhere; a failure names the product, the expert (its rows and the
// shape), how many elements broke the bound, the worst one (row, column, values, error, bound) and
// the expert's largest error, so a wrong edge, tile or expert offset shows at once. Also checks
// that no NaN (the poisoned start) survived and the guards around the output.
void expect_within_bound_per_expert(const std::string& what, const Pair& out, const Tensor& ref, const Tensor& bound,
                                    const std::vector<ExpertPart>& parts, const std::vector<int64_t>& counts) {
  const Tensor actual = out.gpu.to(Device::cpu());
  const int64_t width = ref.dim(-1);
  for (size_t e = 0; e < parts.size(); ++e) {
    int64_t bad = 0, worst = -1;
    double max_error = 0.0, worst_ratio = 0.0;
    for (int64_t i = parts[e].begin * width; i < parts[e].end * width; ++i) {
      const double a = actual.item(i), r = ref.item(i), b = bound.item(i), err = std::fabs(a - r);
      const bool ok = err <= b;  // false for NaN
      if (!ok) ++bad;
      if (std::isnan(err) || err > max_error) max_error = err;
      const double ratio = std::isnan(err) ? INFINITY : err / (b > 0 ? b : 1e-300);
      if (worst < 0 || ratio > worst_ratio) worst = i, worst_ratio = ratio;
    }
    if (bad == 0) continue;
    const int64_t row = worst / width - parts[e].begin, col = worst % width;
    ADD_FAILURE() << what << ", expert " << e << " (" << counts[e] << " rows, output part " << parts[e].end - parts[e].begin
                  << "x" << width << "): " << bad << " elements exceed the bound; worst at (" << row << ", " << col
                  << ") of the expert's part: got " << actual.item(worst) << ", expected " << ref.item(worst)
                  << ", error " << std::fabs(actual.item(worst) - ref.item(worst)) << ", bound " << bound.item(worst)
                  << "; the expert's max error " << max_error;
  }
  EXPECT_TRUE(out.guards_intact()) << what;
}

// The grouped GEMM's op-path counters (op_paths.h), read before and after a test's calls.
struct PathCounts {
  int64_t mma, cublas, per_expert;
};
PathCounts path_counts() {
  return {ops::cuda::op_path_count(OpPath::grouped_gemm_mma), ops::cuda::op_path_count(OpPath::grouped_gemm_cublas),
          ops::cuda::op_path_count(OpPath::grouped_gemm_per_expert)};
}

// Waits for the op's launches; a fault (sticky: every later CUDA call fails too) is reported as
// this product's, with its message, instead of surfacing at some later copy.
::testing::AssertionResult completed(const std::string& what) {
  try {
    cuda::synchronize();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << what << ": a launch faulted: " << e.what();
  }
  return ::testing::AssertionSuccess();
}

// Which way the op goes for these operands (grouped_gemm.cu): our kernel for 16-bit operands with
// widths a multiple of 8 on 16-byte aligned memory, one launch per product; one cuBLASLt GEMM per
// expert for host counts of at least kPerExpertGemmRows rows per expert.
enum class Expect { our_kernel, cublas_way, per_expert };

void check_forward_and_backward(DType dtype, const std::vector<int64_t>& counts, int64_t in, int64_t out,
                                Expect path = Expect::our_kernel, int64_t misalign = 0) {
  const int64_t N = total(counts), E = int64_t(counts.size());
  const std::string shape = std::string(dtype_name(dtype)) + " (" + std::to_string(E) + " experts, " +
                            std::to_string(N) + " rows, in " + std::to_string(in) + ", out " + std::to_string(out) +
                            (misalign ? ", misaligned x" : "") + ")";
  const Pair x = random_pair({N, in}, dtype, 1, 1.0, misalign), w = random_pair({E, out, in}, dtype, 2, 0.5);
  const Pair dy = random_pair({N, out}, dtype, 3);
  const PathCounts before = path_counts();

  // forward: K = in
  Pair y = poisoned_pair({N, out}, dtype);
  ops::cuda::grouped_linear_forward(y.gpu, x.gpu, w.gpu, counts);
  ASSERT_TRUE(completed("forward, " + shape));
  Tensor ref = Tensor::empty({N, out}, DType::f64), abs_ref = Tensor::empty({N, out}, DType::f64);
  ops::cpu::grouped_linear_forward(ref, f64(x.cpu), f64(w.cpu), counts);
  ops::cpu::grouped_linear_forward(abs_ref, abs_f64(x.cpu), abs_f64(w.cpu), counts);
  expect_within_bound_per_expert("forward y = x W^T, " + shape, y, ref, bound_of(abs_ref, ref, in, dtype),
                                 parts_by_rows(counts), counts);

  // backward: dx (K = out) overwritten, dW (K = rows of the expert, at most N, + the old value)
  // accumulated in f32
  Pair dx = poisoned_pair({N, in}, dtype), dw = random_pair({E, out, in}, DType::f32, 4);
  ops::cuda::grouped_linear_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, counts, ops::GradWrite::accumulate);
  ASSERT_TRUE(completed("backward (dgrad and wgrad), " + shape));
  Tensor dx_ref = Tensor::empty({N, in}, DType::f64), dx_abs = Tensor::empty({N, in}, DType::f64);
  Tensor dw_ref = f64(dw.cpu), dw_abs = abs_f64(dw.cpu);
  ops::cpu::grouped_linear_backward(dx_ref, dw_ref, f64(dy.cpu), f64(x.cpu), f64(w.cpu), counts,
                                    ops::GradWrite::accumulate);
  ops::cpu::grouped_linear_backward(dx_abs, dw_abs, abs_f64(dy.cpu), abs_f64(x.cpu), abs_f64(w.cpu), counts,
                                    ops::GradWrite::accumulate);
  expect_within_bound_per_expert("dgrad dx = dy W, " + shape, dx, dx_ref, bound_of(dx_abs, dx_ref, out, dtype),
                                 parts_by_rows(counts), counts);
  expect_within_bound_per_expert("wgrad dW += dy^T x, " + shape, dw, dw_ref,
                                 bound_of(dw_abs, dw_ref, N + 1, DType::f32), parts_by_matrix(counts.size(), out),
                                 counts);

  // wgrad over a NaN-poisoned dW (GradWrite::overwrite, the step's first gradient): every element
  // written, the experts without rows with zeros.
  Pair dw_over = poisoned_pair({E, out, in}, DType::f32);
  Tensor no_dx, no_dx_ref;
  ops::cuda::grouped_linear_backward(no_dx, dw_over.gpu, dy.gpu, x.gpu, w.gpu, counts, ops::GradWrite::overwrite);
  ASSERT_TRUE(completed("backward (wgrad over the old values), " + shape));
  Tensor dw_over_ref = Tensor::empty(dw_ref.shape(), DType::f64),
         dw_over_abs = Tensor::empty(dw_ref.shape(), DType::f64);
  ops::cpu::grouped_linear_backward(no_dx_ref, dw_over_ref, f64(dy.cpu), f64(x.cpu), f64(w.cpu), counts,
                                    ops::GradWrite::overwrite);
  ops::cpu::grouped_linear_backward(no_dx_ref, dw_over_abs, abs_f64(dy.cpu), abs_f64(x.cpu), abs_f64(w.cpu), counts,
                                    ops::GradWrite::overwrite);
  expect_within_bound_per_expert("wgrad dW = dy^T x, " + shape, dw_over, dw_over_ref,
                                 bound_of(dw_over_abs, dw_over_ref, N, DType::f32), parts_by_matrix(counts.size(), out),
                                 counts);

  const PathCounts after = path_counts();
  if (path == Expect::our_kernel) {
    EXPECT_EQ(after.mma - before.mma, 4) << shape
                                         << ": forward, dgrad and wgrad (twice), one launch of our kernel each";
    EXPECT_EQ(after.cublas - before.cublas + after.per_expert - before.per_expert, 0) << shape;
  } else if (path == Expect::per_expert) {
    EXPECT_EQ(after.mma - before.mma + after.cublas - before.cublas, 0) << shape;
    EXPECT_EQ(after.per_expert - before.per_expert, 3) << shape << ": the forward's loop and the two backwards'";
  } else {
    EXPECT_EQ(after.mma - before.mma, 0) << shape << ": our kernel does not take these operands";
    EXPECT_GT(after.cublas - before.cublas + after.per_expert - before.per_expert, 0) << shape;
  }
}

}  // namespace

TEST_F(CudaGroupedGemm, MatchesTheCpuReferenceWithEmptyAndUnevenExperts) {
  for (const DType dtype : {DType::bf16, DType::f16}) {
    // Widths below one tile; rows 0, 1, 5, 17.
    check_forward_and_backward(dtype, {5, 0, 17, 1}, 24, 40);
    check_forward_and_backward(dtype, {64, 32, 0, 96, 8, 8, 0, 48}, 128, 96);
    // Every edge of the 128x256x64 tiles: rows one past a tile (129) and just below two (255, 300),
    // out = 256 + 8 (a second column tile of one 8-column chunk), in = 2 x 64 + 8 (a last k step
    // of one chunk), and wgrad's K (the rows) ending anywhere in a k step.
    check_forward_and_backward(dtype, {0, 129, 1, 255, 0, 300, 7, 128}, 136, 264);
    // A single expert, and an expert with every row.
    check_forward_and_backward(dtype, {200}, 64, 512);
    check_forward_and_backward(dtype, {0, 0, 131, 0}, 256, 128);
  }
  // 256 experts, the most one launch's table holds (DeepSeek-V3's routed experts on one rank):
  // rows 0, 1, 2, 0, 1, 2, ... so the binary search over the table meets runs of empty experts.
  std::vector<int64_t> many(256);
  for (size_t e = 0; e < many.size(); ++e) many[e] = int64_t(e % 3);
  check_forward_and_backward(DType::bf16, many, 32, 48);
  // f32 stays on cuBLAS's grouped GEMM (or its per-expert loop where cuBLAS has none).
  check_forward_and_backward(DType::f32, {5, 0, 17, 1}, 24, 40, Expect::cublas_way);
  check_forward_and_backward(DType::f32, {64, 32, 0, 96, 8, 8, 0, 48}, 128, 96, Expect::cublas_way);
}

// The expert widths of the moe-1b-8x preset (hidden 2048, moe-ffn-hidden-size 2816, SwiGLU):
// fc1 (2048 -> 2 x 2816) and fc2 (2816 -> 2048), few rows per expert to keep the f64 CPU oracle short.
// Host counts of many rows per expert (kPerExpertGemmRows on average) take one cuBLASLt GEMM per
// expert; just below, our kernel.
TEST_F(CudaGroupedGemm, ManyRowsPerExpertGoOneLibraryGemmPerExpert) {
  const int64_t rows = ops::kPerExpertGemmRows;
  // On average over all experts, the empty one included: 3 rows x 1024 over 3 experts.
  check_forward_and_backward(DType::bf16, {2 * rows - 40, 0, rows + 40}, 64, 72, Expect::per_expert);
  check_forward_and_backward(DType::bf16, {rows + 1, rows - 2}, 64, 72, Expect::our_kernel);
}

// The experts' row counts change every step; a GEMM of a row count not seen before runs the
// algorithm cuBLASLt chose for another count of its size class (gemm.cu), which must change no
// result. 1032 to 1072 rows share the class 1025-1152 (8 classes per power of two).
TEST_F(CudaGroupedGemm, RowCountsOfOneSizeClassShareAnAlgorithm) {
  const int64_t reused = ops::cuda::op_path_count(OpPath::gemm_algo_of_size_class);
  const int64_t rows = ops::kPerExpertGemmRows;
  check_forward_and_backward(DType::bf16, {rows + 8, rows + 24}, 72, 80, Expect::per_expert);
  check_forward_and_backward(DType::bf16, {rows + 40, rows + 48}, 72, 80, Expect::per_expert);
  EXPECT_GT(ops::cuda::op_path_count(OpPath::gemm_algo_of_size_class) - reused, 0)
      << "GEMMs of new row counts in a size class seen before asked cuBLASLt's heuristic again";
}

TEST_F(CudaGroupedGemm, MatchesTheCpuReferenceAtTheMoEPresetWidths) {
  const std::vector<int64_t> counts{0, 130, 1, 0, 64, 9, 0, 37};
  check_forward_and_backward(DType::bf16, counts, 2048, 2 * 2816);
  check_forward_and_backward(DType::bf16, counts, 2816, 2048);
}

// Operands our kernel does not take go the cuBLAS way (its grouped call where the operands are
// 16-byte aligned, else one cuBLASLt GEMM per expert) and still compute the products. One test
// each: a fault poisons the process's CUDA context, and ctest runs every test in its own process.
TEST_F(CudaGroupedGemm, InNotAMultipleOf8GoesTheCublasWay) {
  check_forward_and_backward(DType::bf16, {5, 0, 17, 1}, 20, 40, Expect::cublas_way);
}
TEST_F(CudaGroupedGemm, OutNotAMultipleOf8GoesTheCublasWay) {
  check_forward_and_backward(DType::bf16, {5, 0, 17, 1}, 24, 36, Expect::cublas_way);
}
TEST_F(CudaGroupedGemm, XOffSixteenByteAlignmentGoesTheCublasWay) {
  check_forward_and_backward(DType::bf16, {5, 0, 17, 1}, 24, 40, Expect::cublas_way, 1);
}
TEST_F(CudaGroupedGemm, MoreThan256ExpertsGoTheCublasWay) {
  check_forward_and_backward(DType::bf16, std::vector<int64_t>(257, 1), 24, 40, Expect::cublas_way);
}

// The counts as the device routing gives them: row offsets on the GPU.
ops::ExpertRows rows_on_device(const std::vector<int64_t>& counts) {
  const int64_t E = int64_t(counts.size());
  Tensor offsets = Tensor::empty({E + 1}, DType::i32);
  offsets.set_item(0, 0.0);
  for (int64_t e = 0; e < E; ++e) offsets.set_item(e + 1, offsets.item(e) + double(counts[size_t(e)]));
  return ops::ExpertRows::on_device(offsets.to(gpu()));
}

// Rows given as device offsets (the device routing's plan, ops/moe_routing.h): our kernel builds
// its tile table on the device and runs on a bounding grid, the cuBLAS way reads the counts back;
// either computes what the host counts give, bit for bit (the same tiles do the same arithmetic).
void check_device_offsets_equal_host_counts(DType dtype, const std::vector<int64_t>& counts, int64_t in,
                                            int64_t out) {
  const int64_t N = total(counts), E = int64_t(counts.size());
  const std::string shape = std::string(dtype_name(dtype)) + " (" + std::to_string(E) + " experts, " +
                            std::to_string(N) + " rows, in " + std::to_string(in) + ", out " + std::to_string(out) + ")";
  const ops::ExpertRows on_device = rows_on_device(counts);
  const Pair x = random_pair({N, in}, dtype, 21), w = random_pair({E, out, in}, dtype, 22, 0.5);
  const Pair dy = random_pair({N, out}, dtype, 23), dw0 = random_pair({E, out, in}, DType::f32, 24);

  Tensor y_host = Tensor::empty({N, out}, dtype, gpu()), y_device = Tensor::empty({N, out}, dtype, gpu());
  ops::cuda::grouped_linear_forward(y_host, x.gpu, w.gpu, counts);
  ops::cuda::grouped_linear_forward(y_device, x.gpu, w.gpu, on_device);
  Tensor dx_host = Tensor::empty({N, in}, dtype, gpu()), dx_device = Tensor::empty({N, in}, dtype, gpu());
  Tensor dw_host = dw0.gpu.clone(), dw_device = dw0.gpu.clone();
  ops::cuda::grouped_linear_backward(dx_host, dw_host, dy.gpu, x.gpu, w.gpu, counts, ops::GradWrite::accumulate);
  ops::cuda::grouped_linear_backward(dx_device, dw_device, dy.gpu, x.gpu, w.gpu, on_device, ops::GradWrite::accumulate);
  ASSERT_TRUE(completed("device offsets, " + shape));
  const auto same = [](const Tensor& a, const Tensor& b) {
    const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
    return std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
  };
  EXPECT_TRUE(same(y_device, y_host)) << "forward, " << shape;
  EXPECT_TRUE(same(dx_device, dx_host)) << "dgrad, " << shape;
  EXPECT_TRUE(same(dw_device, dw_host)) << "wgrad, " << shape;
}

TEST_F(CudaGroupedGemm, DeviceOffsetsEqualHostCounts) {
  check_device_offsets_equal_host_counts(DType::bf16, {5, 0, 17, 1}, 24, 40);
  check_device_offsets_equal_host_counts(DType::bf16, {0, 129, 1, 255, 0, 300, 7, 128}, 136, 264);
  check_device_offsets_equal_host_counts(DType::f16, {0, 0, 131, 0}, 256, 128);
  check_device_offsets_equal_host_counts(DType::bf16, {0, 0, 0, 0}, 64, 64);  // no rows: nothing to do
  std::vector<int64_t> many(256);
  for (size_t e = 0; e < many.size(); ++e) many[e] = int64_t(e % 3);
  check_device_offsets_equal_host_counts(DType::bf16, many, 32, 48);
  check_device_offsets_equal_host_counts(DType::f32, {64, 32, 0, 96, 8, 8, 0, 48}, 128, 96);  // the cuBLAS way
}

TEST_F(CudaGroupedGemm, EqualsThePerExpertLoopAndReportsSpeed) {
  // 8 experts, top-2 of 8192 tokens spread unevenly; fc1 of a SwiGLU expert of the moe-1b-8x preset.
  const std::vector<int64_t> counts{2560, 1536, 2048, 3072, 1024, 2560, 2048, 1536};
  const int64_t N = total(counts), E = 8, in = 2048, out = 2 * 2816;
  const Pair x = random_pair({N, in}, DType::bf16, 11), w = random_pair({E, out, in}, DType::bf16, 12, 0.02);
  Tensor grouped = Tensor::empty({N, out}, DType::bf16, gpu()), looped = Tensor::empty({N, out}, DType::bf16, gpu());
  const auto run_loop = [&] {
    int64_t begin = 0;
    for (int64_t e = 0; e < E; begin += counts[size_t(e)], ++e) {
      Tensor y_e = looped.slice(begin, begin + counts[size_t(e)]);
      ops::cuda::linear_forward(y_e, x.gpu.slice(begin, begin + counts[size_t(e)]), w.gpu.select(e), Tensor());
    }
  };
  // Our kernel, as device routing runs it (row offsets on the device): with these host counts the
  // op would take the per-expert loop itself (kPerExpertGemmRows).
  const ops::ExpertRows on_device = rows_on_device(counts);
  const auto run_grouped = [&] { ops::cuda::grouped_linear_forward(grouped, x.gpu, w.gpu, on_device); };
  run_loop();
  run_grouped();
  // Both sum the same 2048 products in fp32 and round once to bf16, in different orders. With s, s'
  // the two fp32 sums, |s - s'| <= 2 gamma_K sum|x_i w_i| <= 2 (2 (K + 2) u32) ||x_row|| ||w_row||
  // (Cauchy-Schwarz: an O(K) pass over the rows instead of the O(N out K) pass the CPU oracle would
  // need at this size), and each rounding to bf16 moves a value by at most 2^-8 of itself. A wrong
  // expert, tile or edge moves values by their own size, ~||x|| ||w|| / sqrt(K): 40 times this bound.
  const auto row_norms = [](const Tensor& t, int64_t rows, int64_t width) {
    std::vector<double> norms(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < width; ++i) norms[size_t(r)] += t.item(r * width + i) * t.item(r * width + i);
    for (double& n : norms) n = std::sqrt(n);
    return norms;
  };
  const std::vector<double> x_norms = row_norms(x.cpu, N, in), w_norms = row_norms(w.cpu, E * out, in);
  const Tensor g = grouped.to(Device::cpu()).to(DType::f64), l = looped.to(Device::cpu()).to(DType::f64);
  const double gamma = 2.0 * 2.0 * double(in + 2) * kUnitRoundoffF32;
  int64_t bad = 0, first_bad = -1, row = 0, expert = 0;
  for (int64_t e = 0, begin = 0; e < E; begin += counts[size_t(e)], ++e) {
    for (int64_t r = begin; r < begin + counts[size_t(e)]; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        const int64_t i = r * out + o;
        const double a = g.item(i), b = l.item(i);
        const double bound = 0x1p-8 * (std::fabs(a) + std::fabs(b)) + gamma * x_norms[size_t(r)] * w_norms[size_t(e * out + o)];
        if (!(std::fabs(a - b) <= bound) && bad++ == 0) first_bad = i, row = r - begin, expert = e;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "forward, grouped vs per-expert loop: first at expert " << expert << " row " << row
                    << " column " << (first_bad >= 0 ? first_bad % out : 0) << ": grouped "
                    << (first_bad >= 0 ? g.item(first_bad) : 0.0) << ", loop " << (first_bad >= 0 ? l.item(first_bad) : 0.0);

  const auto time_ms = [](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) fn();
    cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20;
  };
  const double loop_ms = time_ms(run_loop), grouped_ms = time_ms(run_grouped);
  const double tflops = 2.0 * double(N) * double(in) * double(out) / 1e12;
  std::printf(
      "grouped GEMM 8 experts, %lld rows, %lldx%lld bf16: grouped %.3f ms (%.0f TFLOP/s), per-expert loop "
      "%.3f ms (%.0f TFLOP/s)\n",
      static_cast<long long>(N), static_cast<long long>(out), static_cast<long long>(in), grouped_ms,
      tflops / (grouped_ms * 1e-3), loop_ms, tflops / (loop_ms * 1e-3));
}
