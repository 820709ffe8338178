#pragma once
// The whole-model gradient check shared by test_gpt_model and test_moe_layer: three sampled
// elements of every parameter, their analytic gradient against central differences in f64 of the
// objective `loss` (which runs a forward with the parameters as they are).
// Central differences in f64: truncation O(h^2 * f''') ~ 1e-12 and roundoff ~ eps * |L| / h
// ~ 1e-10, against gradients of order 1e-3..1: 1e-6 relative (plus 1e-9 absolute) leaves margin.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"

namespace megatron::test {

// `analytic`: the gradient buffer after one backward of the same objective.
inline void expect_gradients_match_finite_differences(GPTModel& model, const Tensor& analytic,
                                                      const std::function<double()>& loss) {
  const double h = 1e-5;
  int checked = 0;
  HostRng pick(5);
  for (const auto& p : model.parameters().params()) {
    for (int sample = 0; sample < 3; ++sample) {
      const int64_t i = int64_t(pick.uniform_int(uint64_t(p->data.numel())));
      const double original = p->data.item(i);
      p->data.set_item(i, original + h);
      const double up = loss();
      p->data.set_item(i, original - h);
      const double down = loss();
      p->data.set_item(i, original);
      const double numeric = (up - down) / (2 * h);
      const double exact = p->view_of(analytic).item(i);
      EXPECT_NEAR(exact, numeric, 1e-9 + 1e-6 * std::abs(numeric)) << p->spec.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

}  // namespace megatron::test
