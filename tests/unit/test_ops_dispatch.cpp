// The op declaration (ops/op.h): MEGATRON_OP declares both backends and the entry point from one
// signature, and the entry point runs the backend of its first defined tensor's device, timed by
// the op profiler under the op's name. A probe op declared here records which backend ran.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "megatron/ops/norm.h"
#include "megatron/ops/op.h"
#include "megatron/ops/profiler.h"
#include "test_util.h"

namespace megatron::ops {

// out = x + 1 on the CPU; the probe's CUDA backend is never reached without a GPU.
MEGATRON_OP(dispatch_probe, void(Tensor& out, const Tensor& x, float* ran_on));

void cpu::dispatch_probe(Tensor& out, const Tensor& x, float* ran_on) {
  *ran_on = 1.0f;
  if (out.defined()) out.set_item(0, x.item(0) + 1.0);
}
void cuda::dispatch_probe(Tensor&, const Tensor&, float* ran_on) { *ran_on = 2.0f; }

}  // namespace megatron::ops

namespace megatron {
namespace {

TEST(OpDispatch, RunsTheBackendOfTheFirstDefinedTensor) {
  const Tensor x = Tensor::from_vector({41.0f}, {1});
  Tensor out = Tensor::zeros({1}, DType::f32);
  float ran_on = 0.0f;
  ops::dispatch_probe(out, x, &ran_on);
  EXPECT_EQ(ran_on, 1.0f);
  EXPECT_EQ(out.item(0), 42.0);
  Tensor undefined;  // a leading output may be undefined (linear_backward without dX)
  ran_on = 0.0f;
  ops::dispatch_probe(undefined, x, &ran_on);
  EXPECT_EQ(ran_on, 1.0f);
}

TEST(OpDispatch, BackendsAreTheDeclaredFunctions) {
  EXPECT_EQ(ops::dispatch_probe.backend(Device::cpu()), &ops::cpu::dispatch_probe);
  EXPECT_EQ(ops::norm_forward.backend(Device::cpu()), &ops::cpu::norm_forward);
#ifdef MEGATRON_WITH_CUDA
  EXPECT_EQ(ops::dispatch_probe.backend(Device::cuda(0)), &ops::cuda::dispatch_probe);
#else
  const std::string error = testing::error_of([] { ops::dispatch_probe.backend(Device::cuda(0)); });
  EXPECT_NE(error.find("dispatch_probe got a CUDA tensor but this build has no CUDA backend"), std::string::npos)
      << error;
#endif
  EXPECT_STREQ(ops::dispatch_probe.name(), "dispatch_probe");
}

TEST(OpDispatch, TheProfilerTimesEachCallUnderTheOpsName) {
  const Tensor x = Tensor::from_vector({1.0f}, {1});
  Tensor out = Tensor::zeros({1}, DType::f32);
  float ran_on = 0.0f;
  ops::OpProfiler::instance().start();
  for (int i = 0; i < 3; ++i) ops::dispatch_probe(out, x, &ran_on);
  ops::dispatch_probe.backend(Device::cpu())(out, x, &ran_on);  // a backend called directly is not timed
  const std::vector<ops::OpTiming> timings = ops::OpProfiler::instance().stop().ops;
  ASSERT_EQ(timings.size(), 1u);
  EXPECT_EQ(timings[0].op, "dispatch_probe");
  EXPECT_EQ(timings[0].calls, 3);
}

// The host clock times CPU ops, so a sleep between two ops is a gap of at least its length, put
// on the pair around it; an op timed inside another (nested scopes) leaves no gap of its own.
TEST(OpDispatch, TheProfilerPutsTheIdleTimeBetweenOpsOnThePairAroundIt) {
  using Scope = ops::OpProfiler::Scope;
  static constexpr double kSleepMs = 20.0;
  const auto sleep = [] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kSleepMs)); };
  ops::OpProfiler::instance().start();
  {
    Scope outer("outer", Device::cpu());
    Scope inner("inner", Device::cpu());
  }
  sleep();
  { Scope next("next", Device::cpu()); }
  sleep();
  { Scope next("next", Device::cpu()); }
  const ops::OpProfile profile = ops::OpProfiler::instance().stop();
  ASSERT_EQ(profile.ops.size(), 3u);
  ASSERT_EQ(profile.gaps.size(), 2u) << ops::format_op_profile(profile, 0.0);
  for (const ops::OpGap& g : profile.gaps) {
    EXPECT_EQ(g.after, "next");
    EXPECT_EQ(g.calls, 1);
    EXPECT_GE(g.milliseconds, kSleepMs);
  }
  // The outer scope ended last (scopes close inner first), so the first gap follows it.
  EXPECT_TRUE((profile.gaps[0].before == "outer") != (profile.gaps[1].before == "outer"));
  EXPECT_NE(profile.gaps[0].before, "inner");
  EXPECT_NE(profile.gaps[1].before, "inner");
}

}  // namespace
}  // namespace megatron
