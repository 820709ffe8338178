#pragma once
// What would make a run fit a device's memory: the plan of the command line with one change at a
// time (activation recomputation, the distributed optimizer, tensor or pipeline parallelism, a
// smaller micro-batch, combinations), each parsed and validated as train would parse it; those
// whose every rank fits are listed, smallest peak first.
#include <string>
#include <vector>

#include "megatron/planning/activation_model.h"

namespace megatron::planning {

// "" when the command line fits `device_gib`.
std::string fit_advice(const std::vector<std::string>& train_args, int64_t world_size, double device_gib,
                       PlanBackend backend);

// train_args with each flag of `changes` (a flag and its values) set: a flag already given is
// replaced, with all its values.
std::vector<std::string> with_flags(const std::vector<std::string>& train_args,
                                    const std::vector<std::vector<std::string>>& changes);

}  // namespace megatron::planning
