// multirank-np: 2 4
// Pipeline schedules (schedule.h) executed over real MPI communicators by run_schedule
// (pipeline_run_checks.h): 1F1B, interleaved and forward-only, several micro-batch counts.
#include "multirank/pipeline_run_checks.h"

namespace megatron::testing {
namespace {

TEST(PipelineScheduleRun, EveryScheduleDeliversEveryTensor) {
  ParallelSizes sizes;
  sizes.pp = process_info_from_env().world_size;
  const ParallelState st = make_state(sizes);
  run_every_schedule(st.ctx, Device::cpu());
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
