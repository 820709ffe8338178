// multirank-np: 2 4
// Pipeline schedules executed over NCCL, one GPU per pipeline stage (pipeline_run_checks.h): the
// activations and gradients between stages live on the GPUs and travel by ncclSend/ncclRecv in
// groups, on the pp and pp_grad communicators, or overlapped with compute, each alone on its
// one-way pipeline channel (ctx.pp_channels, a communicator and stream of its own), also in groups
// larger than the pipeline, which only the overlapped path runs.
#include "multigpu/multigpu_util.h"
#include "multirank/pipeline_run_checks.h"

namespace megatron::testing {
namespace {

TEST(MultiGpuPipelineSchedule, EveryScheduleDeliversEveryTensor) {
  if (const std::string why = multigpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  ParallelSizes sizes;
  sizes.pp = mpi_runtime()->process().world_size;
  const ParallelState st = make_gpu_state(sizes);
  run_every_schedule(st.ctx, local_gpu());
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
