// megatron plan: for a `train` command line, each rank's peak memory by component and where it
// comes from, without running anything (src/megatron/planning/). The train flags are parsed by the
// train flag table itself (parse_training_args: the same derivation and validation), so a command
// line plan accepts is one train accepts. plan's own options start with --plan-:
//   --plan-world-size N         ranks the run will launch (default 1)
//   --plan-device-memory-gib G  device memory per rank; when the plan exceeds it, layouts,
//                               recomputation and offload that would fit are tried and listed
#include <cstdio>
#include <string>

#include "commands.h"
#include "megatron/core/error.h"
#include "megatron/planning/fit_advice.h"
#include "megatron/planning/memory_plan.h"
#include "megatron/planning/step_time.h"
#include "megatron/training/arguments.h"

namespace megatron::tools {

namespace {
struct PlanOptions {
  int64_t world_size = 1;
  double device_memory_gib = 0;  // 0: no fit check
  Args train_args;
};

PlanOptions split_plan_options(const Args& args) {
  PlanOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--plan-", 0) != 0) {
      o.train_args.push_back(a);
      continue;
    }
    MEGATRON_CHECK(i + 1 < args.size(), a << " needs a value");
    const std::string& v = args[++i];
    MEGATRON_CHECK(a == "--plan-world-size" || a == "--plan-device-memory-gib",
                   "unknown flag " << a << "; plan's own flags are --plan-world-size N and "
                                   << "--plan-device-memory-gib G (the rest are train's)");
    size_t used = 0;
    try {
      if (a == "--plan-world-size")
        o.world_size = std::stoll(v, &used);
      else
        o.device_memory_gib = std::stod(v, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    MEGATRON_CHECK(used == v.size() && !v.empty(), a << " " << v << " is not a number");
  }
  MEGATRON_CHECK(o.world_size >= 1, "--plan-world-size " << o.world_size << " must be >= 1");
  MEGATRON_CHECK(o.device_memory_gib >= 0, "--plan-device-memory-gib " << o.device_memory_gib << " must be >= 0");
  return o;
}
}  // namespace

std::string plan_help() {
  return "usage: megatron plan [--plan-world-size N] [--plan-device-memory-gib G] TRAIN FLAGS...\n"
         "Prints each pipeline stage's peak memory per rank by component (weights, gradients, optimizer\n"
         "state, activations per layer and micro-batches in flight, the backward's working set, data,\n"
         "communication buffers, allocator slack) and an expected step time, without running. With\n"
         "--plan-device-memory-gib, a plan that does not fit lists the changes that would.\n"
         "The train flags are train's (megatron train --help); --device cpu plans the CPU backend, any\n"
         "other device one GPU per rank (step time from H100 measurements).\n";
}

int plan(const Args& args) {
  const PlanOptions o = split_plan_options(args);
  const TrainingArgs train = parse_training_args(o.train_args, o.world_size);
  const planning::PlanBackend backend = train.device == "cpu" ? planning::PlanBackend::cpu : planning::PlanBackend::cuda;
  const planning::MemoryPlan memory = planning::plan_memory(train, backend);
  std::fputs(planning::format_memory_plan(memory).c_str(), stdout);
  if (backend == planning::PlanBackend::cuda)
    std::fputs(planning::format_step_time(planning::plan_step_time(train)).c_str(), stdout);
  if (o.device_memory_gib > 0)
    std::fputs(planning::fit_advice(o.train_args, o.world_size, o.device_memory_gib, backend).c_str(), stdout);
  return 0;
}

}  // namespace megatron::tools
