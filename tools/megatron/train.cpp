// megatron train: parse Megatron's flags (and --config YAML), then run the training loop.
// Under mpirun or srun, MPI starts before parsing, so the arguments see the launched world size.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "library_environment.h"
#include "megatron/parallel/launch.h"
#include "megatron/training/arguments.h"
#include "megatron/training/training.h"

namespace megatron::tools {

std::string train_help() { return training_args_help(); }

int train(const Args& args) {
  const ProcessInfo process = process_info_from_env();
  if (!process.launched()) {  // one process: TP is 1
    const TrainingArgs parsed = parse_training_args(args);
    set_deterministic_defaults(parsed.model.deterministic_mode);
    pretrain(parsed);
    return 0;
  }
  const auto mpi = std::make_shared<MpiRuntime>(process);
  try {
    const TrainingArgs parsed = parse_training_args(args, mpi->process().world_size);
    set_tensor_parallel_defaults(parsed.parallel.tensor_model_parallel_size);
    set_deterministic_defaults(parsed.model.deterministic_mode);
    pretrain(parsed, mpi);
  } catch (const std::exception& e) {
    // Other ranks may wait for this one in a collective: report, then end the whole job.
    std::fprintf(stderr, "megatron train: error on rank %d: %s\n", mpi->process().rank, e.what());
    mpi->abort(1);
  }
  return 0;
}

}  // namespace megatron::tools
