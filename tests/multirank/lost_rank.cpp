// The program behind the lost-rank acceptance test (lost_rank_test.sh): 4 ranks (TP=2, DP=2)
// train-like steps of TP, DP and world collectives; in step 3, rank 2 stops answering
// (`stop`: SIGSTOP, as a hung or descheduled process) or dies (`exit`: _exit without MPI_Finalize)
// just before a world all-reduce. The others must end within the timeout with a report that
// names rank 2; the driver checks the output.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megatron/parallel/parallel_state.h"

int main(int argc, char** argv) {
  using namespace megatron;
  if (argc != 2 || (std::strcmp(argv[1], "stop") != 0 && std::strcmp(argv[1], "exit") != 0)) {
    std::fprintf(stderr, "usage: %s stop|exit (under mpirun -np 4)\n", argv[0]);
    return 2;
  }
  const bool stop = std::strcmp(argv[1], "stop") == 0;
  auto mpi = std::make_shared<MpiRuntime>(process_info_from_env());
  ParallelOptions options;
  options.timeout_seconds = 0.05 * 60;  // --distributed-timeout-minutes 0.05
  options.mpi = mpi;
  ParallelSizes sizes;
  sizes.tp = 2;
  ParallelState st = initialize_parallel(sizes, options);
  const int rank = st.process.rank;
  Tensor x = Tensor::from_vector(std::vector<float>(16, float(rank)), {16});
  for (int step = 1; step <= 5; ++step) {
    st.ctx.tp->all_reduce(x, ReduceOp::sum);
    st.ctx.dp->all_reduce(x, ReduceOp::avg);
    if (step == 3 && rank == 2) {
      std::fprintf(stderr, "[rank 2] lost_rank: %s before world all_reduce in step 3\n", stop ? "stopping" : "exiting");
      std::fflush(stderr);
      if (stop) raise(SIGSTOP);
      _exit(3);
    }
    st.ctx.world->all_reduce(x, ReduceOp::max);
  }
  std::fprintf(stderr, "[rank %d] lost_rank: finished all steps, which a lost rank should have prevented\n", rank);
  return 0;
}
