#pragma once
// megatron plan's expected step time on a GPU: the step's work split into GEMMs, attention,
// elementwise passes, the optimizer and exposed communication, each divided by a throughput this
// engine measured (op_throughputs.h), then the pipeline bubble and the host's gaps between ops.
#include <string>

#include "megatron/training/arguments.h"

namespace megatron::planning {

struct StepTime {
  const char* device = "";
  double gemm_ms = 0, attention_ms = 0, elementwise_ms = 0, optimizer_ms = 0, communication_ms = 0;
  double bubble_fraction = 0;  // (PP - 1) / (micro-batches x virtual stages)
  double host_gap_factor = 1;
  double step_ms = 0;
  double tokens_per_second_per_rank = 0;
};

StepTime plan_step_time(const TrainingArgs& args);
std::string format_step_time(const StepTime& t);

}  // namespace megatron::planning
