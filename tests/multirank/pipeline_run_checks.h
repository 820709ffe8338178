#pragma once
// The pipeline schedules run for real, shared by the CPU (multirank) and GPU (multigpu) tests:
// every rank is one pipeline stage; virtual stage s maps its input x to 2x + (s+1) and its backward
// doubles the gradient, all in f64 on small integers, so every activation and gradient each rank
// receives has a closed form and compares with ==.
#include <map>
#include <string>
#include <vector>

#include "megatron/core/strings.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_executor.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {

using namespace pipeline_parallel;

constexpr int64_t kWidth = 5;

// Micro-batch mb's tokens on virtual stage 0: mb·10 + i.
inline double token(int64_t mb, int64_t i) { return double(mb * 10 + i); }

// The activation entering virtual stage s (s applications of x -> 2x + (k+1), k < s).
inline double activation(int64_t mb, int64_t i, int64_t s) {
  double x = token(mb, i);
  for (int64_t k = 0; k < s; ++k) x = 2 * x + double(k + 1);
  return x;
}

// The gradient arriving at virtual stage s of `stages` (the last stage starts from mb+1).
inline double gradient(int64_t mb, int64_t s, int64_t stages) {
  double g = double(mb + 1);
  for (int64_t k = stages - 1; k > s; --k) g *= 2;
  return g;
}

inline Tensor filled(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::f64);
  for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  return t;
}

// Runs `shape`'s schedule on this rank with stage tensors on `device` and checks every tensor.
inline void run_and_check(const ParallelContext& ctx, const ScheduleShape& shape, Device device) {
  const int64_t rank = ctx.pp->rank(), stages = shape.pipeline_size * shape.virtual_stages;
  const std::string where =
      concat("P", shape.pipeline_size, " V", shape.virtual_stages, " M", shape.microbatches, " N", shape.group_size(),
             shape.overlap_p2p ? " overlapped" : "", shape.forward_only ? " forward-only" : "", " rank ", rank);
  int64_t forwards = 0, backwards = 0;
  std::map<std::pair<int64_t, int64_t>, bool> forward_done;
  StageFunctions stage;
  stage.forward = [&](int64_t mb, int64_t chunk, const Tensor& device_input) {
    const int64_t s = shape.virtual_stage(rank, chunk);
    const Tensor input = device_input.defined() ? device_input.to(Device::cpu()) : Tensor();
    EXPECT_EQ(input.defined(), s > 0) << where;
    std::vector<double> y(kWidth);
    for (int64_t i = 0; i < kWidth; ++i) {
      const double x = s == 0 ? token(mb, i) : input.data<double>()[i];
      EXPECT_EQ(x, activation(mb, i, s)) << where << " F" << mb << "." << chunk << " element " << i;
      y[size_t(i)] = 2 * x + double(s + 1);
    }
    ++forwards;
    forward_done[{mb, chunk}] = true;
    return filled(y).to(device);
  };
  stage.backward = [&](int64_t mb, int64_t chunk, const Tensor& device_grad) {
    const int64_t s = shape.virtual_stage(rank, chunk);
    const Tensor output_grad = device_grad.defined() ? device_grad.to(Device::cpu()) : Tensor();
    EXPECT_TRUE(forward_done.count({mb, chunk})) << where << " B" << mb << "." << chunk << " before its forward";
    EXPECT_EQ(output_grad.defined(), s < stages - 1) << where;
    std::vector<double> dx(kWidth);
    for (int64_t i = 0; i < kWidth; ++i) {
      const double dy = s == stages - 1 ? double(mb + 1) : output_grad.data<double>()[i];
      EXPECT_EQ(dy, gradient(mb, s, stages)) << where << " B" << mb << "." << chunk << " element " << i;
      dx[size_t(i)] = 2 * dy;
    }
    ++backwards;
    return filled(dx).to(device);
  };
  const StageTensor between{.shape = {kWidth}, .dtype = DType::f64, .device = device};
  if (shape.overlap_p2p)
    run_schedule_overlapped(build_schedule(shape, rank), ctx.pp_channels, between, stage);
  else
    run_schedule(build_schedule(shape, rank), *ctx.pp, *ctx.pp_grad, between, stage);
  EXPECT_EQ(forwards, shape.microbatches * shape.virtual_stages) << where;
  EXPECT_EQ(backwards, shape.forward_only ? 0 : forwards) << where;
}

// Every valid schedule on a pipeline of the whole world: 1F1B and two virtual stages, several
// micro-batch counts, training and forward-only, blocking and overlapped (ctx.pp_channels); the
// overlapped interleaved ones also in groups larger than the pipeline (N = P+1, P+2).
inline void run_every_schedule(const ParallelContext& ctx, Device device) {
  const int64_t p = ctx.pp->size();
  for (int64_t v : {1, 2})
    for (int64_t m : {p, 2 * p, 3 * p, p + 1})
      for (bool forward_only : {false, true})
        for (bool overlap : {false, true})
          for (int64_t n : {p, p + 1, p + 2}) {
            const ScheduleShape shape{.pipeline_size = p,
                                      .virtual_stages = v,
                                      .microbatches = m,
                                      .microbatch_group_size = n,
                                      .forward_only = forward_only,
                                      .overlap_p2p = overlap};
            if ((n == p || (overlap && v > 1)) && validate(shape).empty()) run_and_check(ctx, shape, device);
          }
}

}  // namespace megatron::testing
