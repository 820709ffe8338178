// multirank-np: 2 4
// Pipeline schedules (schedule.h) executed over real MPI communicators by run_schedule: every
// rank is one pipeline stage; virtual stage s maps its input x to 2x + (s+1) and its backward
// doubles the gradient, all in f64 on small integers, so every activation and gradient each rank
// receives has a closed form and compares with ==. 1F1B, interleaved and forward-only, several
// micro-batch counts.
#include <map>
#include <vector>

#include "megatron/core/strings.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_executor.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

using namespace pipeline_parallel;

constexpr int64_t kWidth = 5;

// Micro-batch mb's tokens on virtual stage 0: mb·10 + i.
double token(int64_t mb, int64_t i) { return double(mb * 10 + i); }

// The activation entering virtual stage s (s applications of x -> 2x + (k+1), k < s).
double activation(int64_t mb, int64_t i, int64_t s) {
  double x = token(mb, i);
  for (int64_t k = 0; k < s; ++k) x = 2 * x + double(k + 1);
  return x;
}

// The gradient arriving at virtual stage s of `stages` (the last stage starts from mb+1).
double gradient(int64_t mb, int64_t s, int64_t stages) {
  double g = double(mb + 1);
  for (int64_t k = stages - 1; k > s; --k) g *= 2;
  return g;
}

Tensor filled(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::f64);
  for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  return t;
}

void run_and_check(const ParallelContext& ctx, const ScheduleShape& shape) {
  const int64_t rank = ctx.pp->rank(), stages = shape.pipeline_size * shape.virtual_stages;
  const std::string where = concat("P", shape.pipeline_size, " V", shape.virtual_stages, " M", shape.microbatches,
                                   shape.forward_only ? " forward-only" : "", " rank ", rank);
  int64_t forwards = 0, backwards = 0;
  std::map<std::pair<int64_t, int64_t>, bool> forward_done;
  StageFunctions stage;
  stage.forward = [&](int64_t mb, int64_t chunk, const Tensor& input) {
    const int64_t s = shape.virtual_stage(rank, chunk);
    EXPECT_EQ(input.defined(), s > 0) << where;
    std::vector<double> y(kWidth);
    for (int64_t i = 0; i < kWidth; ++i) {
      const double x = s == 0 ? token(mb, i) : input.data<double>()[i];
      EXPECT_EQ(x, activation(mb, i, s)) << where << " F" << mb << "." << chunk << " element " << i;
      y[size_t(i)] = 2 * x + double(s + 1);
    }
    ++forwards;
    forward_done[{mb, chunk}] = true;
    return filled(y);
  };
  stage.backward = [&](int64_t mb, int64_t chunk, const Tensor& output_grad) {
    const int64_t s = shape.virtual_stage(rank, chunk);
    EXPECT_TRUE(forward_done.count({mb, chunk})) << where << " B" << mb << "." << chunk << " before its forward";
    EXPECT_EQ(output_grad.defined(), s < stages - 1) << where;
    std::vector<double> dx(kWidth);
    for (int64_t i = 0; i < kWidth; ++i) {
      const double dy = s == stages - 1 ? double(mb + 1) : output_grad.data<double>()[i];
      EXPECT_EQ(dy, gradient(mb, s, stages)) << where << " B" << mb << "." << chunk << " element " << i;
      dx[size_t(i)] = 2 * dy;
    }
    ++backwards;
    return filled(dx);
  };
  run_schedule(build_schedule(shape, rank), *ctx.pp, *ctx.pp_grad, {.shape = {kWidth}, .dtype = DType::f64}, stage);
  EXPECT_EQ(forwards, shape.microbatches * shape.virtual_stages) << where;
  EXPECT_EQ(backwards, shape.forward_only ? 0 : forwards) << where;
}

TEST(PipelineScheduleRun, EveryScheduleDeliversEveryTensor) {
  ParallelSizes sizes;
  sizes.pp = process_info_from_env().world_size;
  const ParallelState st = make_state(sizes);
  const int64_t p = sizes.pp;
  for (int64_t v : {1, 2})
    for (int64_t m : {p, 2 * p, 3 * p, p + 1})
      for (bool forward_only : {false, true}) {
        const ScheduleShape shape{
            .pipeline_size = p, .virtual_stages = v, .microbatches = m, .forward_only = forward_only};
        if (!validate(shape).empty()) continue;
        run_and_check(st.ctx, shape);
      }
}

TEST(PipelineScheduleRun, AStageOfTheWrongShapeIsNamed) {
  ParallelSizes sizes;
  sizes.pp = process_info_from_env().world_size;
  const ParallelState st = make_state(sizes);
  // Rank 0 runs its first forward, whose output cannot be sent; it fails before communicating
  // (the other ranks, which would wait for it, stay out).
  if (st.ctx.pp->rank() != 0) return;
  StageFunctions stage;
  stage.forward = [](int64_t, int64_t, const Tensor&) { return Tensor::zeros({2}, DType::f64); };
  const std::string error = error_of([&] {
    run_schedule(build_schedule({.pipeline_size = sizes.pp, .microbatches = 1, .forward_only = true}, 0), *st.ctx.pp,
                 *st.ctx.pp_grad, {.shape = {3}, .dtype = DType::f64}, stage);
  });
  EXPECT_NE(error.find("F0.0 produced [2] f64 but tensors between stages are [3] f64"), std::string::npos) << error;
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
