// The grouped GEMM's CPU reference (plain loops) against a loop of the linear ops of gemm.h (an
// independent implementation, OpenBLAS) on each expert's rows, with empty and uneven experts: in
// f64 (1e-12 relative: the same sums in other orders) and in bf16 outputs (one bf16 rounding of
// float sums: a step of 2^-7 relative where the two round a near-midpoint differently).
#include <gtest/gtest.h>

#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

const std::vector<int64_t> kCounts{3, 0, 5, 1};
constexpr int64_t kRows = 9, kIn = 6, kOut = 7;

void expect_close(const Tensor& a, const Tensor& b, double rel) {
  ASSERT_EQ(a.numel(), b.numel());
  const double scale = max_abs(b);
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_NEAR(a.item(i), b.item(i), rel * (std::abs(b.item(i)) + 1e-3 * scale)) << "element " << i;
}

void check(DType dtype, double rel) {
  const Tensor x = randn({kRows, kIn}, dtype, 1), w = randn({4, kOut, kIn}, dtype, 2),
               dy = randn({kRows, kOut}, dtype, 3);
  Tensor y = poisoned({kRows, kOut}, dtype), y_loop = poisoned({kRows, kOut}, dtype);
  ops::grouped_linear_forward(y, x, w, kCounts);
  Tensor dx = poisoned({kRows, kIn}, dtype), dx_loop = poisoned({kRows, kIn}, dtype);
  const DType acc = dtype == DType::f64 ? DType::f64 : DType::f32;
  Tensor dw = randn({4, kOut, kIn}, acc, 4), dw_loop = dw.clone();
  ops::grouped_linear_backward(dx, dw, dy, x, w, kCounts, ops::GradWrite::accumulate);
  // Written over NaNs (the step's first gradient): the loop's from zeros, expert 1 (no rows) zero.
  Tensor no_dx, dw_over = poisoned(dw.shape(), acc), dw_over_loop = Tensor::zeros(dw.shape(), acc);
  ops::grouped_linear_backward(no_dx, dw_over, dy, x, w, kCounts, ops::GradWrite::overwrite);
  int64_t begin = 0;
  for (size_t e = 0; e < kCounts.size(); begin += kCounts[e], ++e) {
    const int64_t end = begin + kCounts[e];
    if (end == begin) continue;
    Tensor y_e = y_loop.slice(begin, end), dx_e = dx_loop.slice(begin, end), dw_e = dw_loop.select(int64_t(e));
    Tensor no_bias, dw_over_e = dw_over_loop.select(int64_t(e));
    ops::linear_forward(y_e, x.slice(begin, end), w.select(int64_t(e)), Tensor());
    ops::linear_backward(dx_e, dw_e, no_bias, dy.slice(begin, end), x.slice(begin, end), w.select(int64_t(e)),
                         ops::GradWrite::accumulate);
    ops::linear_backward(no_dx, dw_over_e, no_bias, dy.slice(begin, end), x.slice(begin, end), w.select(int64_t(e)),
                         ops::GradWrite::overwrite);
  }
  expect_close(y, y_loop, rel);
  expect_close(dx, dx_loop, rel);
  expect_close(dw, dw_loop, dtype == DType::f64 ? rel : 1e-6);  // f32 main grads: float sums of 6 terms
  expect_close(dw_over, dw_over_loop, dtype == DType::f64 ? rel : 1e-6);
}

}  // namespace

TEST(OpsGroupedGemm, EqualsALoopOfLinearOps) {
  check(DType::f64, 1e-12);
  check(DType::bf16, 0x1p-7);
}

TEST(OpsGroupedGemm, RejectsCountsThatDoNotCoverTheRows) {
  const Tensor x = randn({kRows, kIn}, DType::f32, 1), w = randn({4, kOut, kIn}, DType::f32, 2);
  Tensor y = Tensor::empty({kRows, kOut}, DType::f32);
  EXPECT_THROW(ops::grouped_linear_forward(y, x, w, std::vector<int64_t>{3, 0, 5, 2}), Error);
  EXPECT_THROW(ops::grouped_linear_forward(y, x, w, std::vector<int64_t>{9, 0, 0}), Error);
}

// Rows given as offsets (the device routing's plan; a CPU tensor here) compute what the counts do.
TEST(OpsGroupedGemm, RowOffsetsEqualCounts) {
  const std::vector<int64_t> counts{3, 0, 5, 2};
  Tensor offsets = Tensor::empty({5}, DType::i32);
  for (int64_t e = 0, begin = 0; e <= 4; begin += e < 4 ? counts[size_t(e)] : 0, ++e) offsets.set_item(e, double(begin));
  const ops::ExpertRows rows = ops::ExpertRows::on_device(offsets);
  EXPECT_EQ(rows.host_counts(), counts);
  const Tensor x = randn({10, kIn}, DType::f64, 1), w = randn({4, kOut, kIn}, DType::f64, 2);
  const Tensor dy = randn({10, kOut}, DType::f64, 3);
  Tensor y_counts = Tensor::empty({10, kOut}, DType::f64), y_offsets = Tensor::empty({10, kOut}, DType::f64);
  ops::grouped_linear_forward(y_counts, x, w, counts);
  ops::grouped_linear_forward(y_offsets, x, w, rows);
  EXPECT_TRUE(all_close(y_offsets, y_counts, 0.0, 0.0));
  Tensor dx_counts = Tensor::empty({10, kIn}, DType::f64), dx_offsets = Tensor::empty({10, kIn}, DType::f64);
  Tensor dw_counts = Tensor::zeros(w.shape(), DType::f64), dw_offsets = Tensor::zeros(w.shape(), DType::f64);
  ops::grouped_linear_backward(dx_counts, dw_counts, dy, x, w, counts, ops::GradWrite::accumulate);
  ops::grouped_linear_backward(dx_offsets, dw_offsets, dy, x, w, rows, ops::GradWrite::accumulate);
  EXPECT_TRUE(all_close(dx_offsets, dx_counts, 0.0, 0.0));
  EXPECT_TRUE(all_close(dw_offsets, dw_counts, 0.0, 0.0));
}
