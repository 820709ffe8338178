// The program behind the pipeline's lost-stage acceptance test (lost_rank_test.sh, as for the
// watchdog): 4 ranks, one pipeline stage each, run the 1F1B schedule step after step; in step 3,
// rank 2 stops answering (`stop`: SIGSTOP) or dies (`exit`) inside its forward of micro-batch 1, so
// its neighbours wait on sends and receives that never complete. They must end within the timeout
// with a report naming rank 2; the driver checks the output. With `overlapped`, the interleaved
// schedule (two chunks per rank) runs with its sends and receives overlapped on the pipeline
// channels: the neighbours then wait on a receive (or, at the end, a background send) instead.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

#include "megatron/parallel/parallel_state.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_executor.h"

int main(int argc, char** argv) {
  using namespace megatron;
  using namespace megatron::pipeline_parallel;
  const bool overlapped = argc == 3 && std::strcmp(argv[2], "overlapped") == 0;
  if ((argc != 2 && !overlapped) || (std::strcmp(argv[1], "stop") != 0 && std::strcmp(argv[1], "exit") != 0)) {
    std::fprintf(stderr, "usage: %s stop|exit [overlapped] (under mpirun -np 4)\n", argv[0]);
    return 2;
  }
  const bool stop = std::strcmp(argv[1], "stop") == 0;
  auto mpi = std::make_shared<MpiRuntime>(process_info_from_env());
  ParallelOptions options;
  options.timeout_seconds = 0.05 * 60;  // --distributed-timeout-minutes 0.05
  options.pipeline_channels = overlapped;
  options.mpi = mpi;
  ParallelSizes sizes;
  sizes.pp = 4;
  ParallelState st = initialize_parallel(sizes, options);
  const int rank = st.process.rank;
  const ScheduleShape shape{
      .pipeline_size = 4, .virtual_stages = overlapped ? 2 : 1, .microbatches = 4, .overlap_p2p = overlapped};
  for (int step = 1; step <= 5; ++step) {
    StageFunctions stage;
    stage.forward = [&](int64_t mb, int64_t, const Tensor&) {
      if (step == 3 && rank == 2 && mb == 1) {
        std::fprintf(stderr, "[rank 2] pipeline_lost_stage: %s in the forward of micro-batch 1, step 3\n",
                     stop ? "stopping" : "exiting");
        std::fflush(stderr);
        if (stop) raise(SIGSTOP);
        _exit(3);
      }
      return Tensor::zeros({8}, DType::f32);
    };
    stage.backward = [](int64_t, int64_t, const Tensor&) { return Tensor::zeros({8}, DType::f32); };
    if (overlapped)
      run_schedule_overlapped(build_schedule(shape, rank), st.ctx.pp_channels, {.shape = {8}}, stage);
    else
      run_schedule(build_schedule(shape, rank), *st.ctx.pp, *st.ctx.pp_grad, {.shape = {8}}, stage);
  }
  std::fprintf(stderr, "[rank %d] pipeline_lost_stage: finished all steps, which a lost stage should have prevented\n",
               rank);
  return 0;
}
