// The MoE permutation ops (ops/moe_permute.h) on the CPU: known answers worked out by hand, and
// each op's backward as the adjoint of its forward (<A x, y> = <x, A^T y>) in f64.
#include <gtest/gtest.h>

#include "megatron/ops/moe_permute.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

Tensor ints(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor values(const std::vector<float>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector(v, shape, dtype);
}

// Three tokens, two experts: expert 0 takes tokens 0 and 2 (rows 0, 1), expert 1 takes token 1
// and token 2 (rows 2, 3).
const std::vector<int32_t> kRowToken{0, 2, 1, 2};
const std::vector<int32_t> kTokenRows{0, -1, -1, 2, 1, 3};

}  // namespace

TEST(OpsMoePermute, KnownAnswers) {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {3, 2}, DType::f32);
  Tensor rows = poisoned({4, 2}, DType::f32);
  ops::moe_permute(rows, x, ints(kRowToken, {4}), Tensor());
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{1, 2, 5, 6, 3, 4, 5, 6}));
  ops::moe_permute(rows, x, ints(kRowToken, {4}), values({1, 0.5f, 2, 0.25f}, {4}, DType::f32));
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{1, 2, 2.5f, 3, 6, 8, 1.25f, 1.5f}));

  // out[2] = 0.5 * rows[1] + 0.25 * rows[3]; out[1] = 0.75 * rows[2]; out[0] = 1 * rows[0].
  const Tensor r = values({1, 1, 2, 2, 3, 3, 4, 4}, {4, 2}, DType::f32);
  Tensor out = poisoned({3, 2}, DType::f32);
  ops::moe_unpermute(out, r, ints(kTokenRows, {3, 2}), values({1, 0, 0, 0.75f, 0.5f, 0.25f}, {3, 2}, DType::f32));
  EXPECT_EQ(out.to_vector(), (std::vector<float>{1, 1, 2.25f, 2.25f, 2, 2}));

  // dweight[t,e] = <dout[t], rows of (t,e)>, 0 where (t,e) has no row.
  Tensor dweight = poisoned({3, 2}, DType::f32);
  ops::moe_unpermute_weight_backward(dweight, values({1, -1, 2, 0, 1, 1}, {3, 2}, DType::f32), r,
                                     ints(kTokenRows, {3, 2}));
  EXPECT_EQ(dweight.to_vector(), (std::vector<float>{0, 0, 0, 6, 4, 8}));
}

TEST(OpsMoePermute, BackwardsAreAdjoints) {
  // In f64 the two sides sum the same products in other orders: 1e-12 relative.
  const Tensor x = randn({3, 5}, DType::f64, 1), dy_rows = randn({4, 5}, DType::f64, 2);
  const Tensor probs = randn({3, 2}, DType::f64, 3);
  Tensor row_prob = Tensor::empty({4}, DType::f64);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t i = 0; i < 6; ++i)
      if (kTokenRows[size_t(i)] == r) row_prob.set_item(r, probs.item(i));
  }
  Tensor rows = Tensor::empty({4, 5}, DType::f64), back = Tensor::empty({3, 5}, DType::f64);
  // permute with row weights vs unpermute with the same weights per (t,e)
  ops::moe_permute(rows, x, ints(kRowToken, {4}), row_prob);
  ops::moe_unpermute(back, dy_rows, ints(kTokenRows, {3, 2}), probs);
  const double lhs = sum_product(rows, dy_rows), rhs = sum_product(x, back);
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs));
}

TEST(OpsMoePermute, RejectsMismatchedArguments) {
  const Tensor x = values({1, 2, 3, 4, 5, 6}, {3, 2}, DType::f32);
  Tensor rows = Tensor::empty({4, 3}, DType::f32);
  EXPECT_THROW(ops::moe_permute(rows, x, ints(kRowToken, {4}), Tensor()), Error);
  Tensor ok = Tensor::empty({4, 2}, DType::f32);
  EXPECT_THROW(ops::moe_permute(ok, x, ints(kRowToken, {4}), values({1, 1, 1, 1}, {4}, DType::f64)), Error);
}
