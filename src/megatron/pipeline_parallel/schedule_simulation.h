#pragma once
// A discrete-event run of a pipeline schedule (schedule.h) on every rank at once: the proof that
// the per-rank action lists fit together (every send meets the receive of the same micro-batch and
// stage, no deadlock) and the measure of what they cost (the bubble). Costs are inputs, so times
// measured on a GPU feed the same simulation as the unit costs of the tests.
#include <cstdint>
#include <vector>

#include "megatron/pipeline_parallel/schedule.h"

namespace megatron::pipeline_parallel {

struct ActionCosts {
  double forward = 1;   // one model chunk's forward of one micro-batch
  double backward = 2;  // its backward
  double p2p = 0;       // one batch of sends and receives, from the moment both ends have posted it
  // Costs measured per virtual stage (chunk·P + rank): where given they replace forward and
  // backward, since the stage holding the embedding or the output layer and loss costs more.
  std::vector<double> forward_by_stage = {}, backward_by_stage = {};

  // The cost of a forward or backward of virtual stage `stage`.
  double compute(ActionKind kind, int64_t stage) const;
};

// What a compute action of an overlapped schedule waits for before it starts.
enum class ReceiveWait {
  kOwnInput,  // the receive of its own input (MPI; NCCL while nothing waits for the whole device)
  // The first forward and the first backward of each model chunk on a rank wait for every receive
  // the rank has posted: on a GPU the first run of a kernel or plan sets things up (cuDNN's plans
  // and their compiled kernels, a module's load, the caching allocator's growth), and a set-up call
  // that waits for the whole device also waits for the receive kernels queued on the channels'
  // streams, which complete only once their peers have sent.
  kEveryPostedAtFirstUse,
};

struct SimulatedPipeline {
  std::vector<double> finish;           // per rank: when its last action ends
  std::vector<double> busy;             // per rank: time spent computing
  std::vector<int64_t> peak_in_flight;  // per rank: most (micro-batch, chunk) forwards awaiting backward
  double makespan() const;              // the latest finish
  double bubble_fraction() const;       // idle over busy time on the busiest rank
};

// Forwards whose backward has not run yet, at most, along one rank's actions (each holds its
// saved activations).
int64_t peak_in_flight(const std::vector<Action>& actions);

// Runs every rank's actions (`per_rank[r]`, normally build_schedule(shape, r)) together. A compute action takes its
// cost; a batch of consecutive sends and receives (posted together, as one NCCL group) completes once each of its
// operations has met its peer's, matched in posting order per ordered pair of ranks and kind of
// tensor (activation or gradient), at the later
// of the two posting times plus costs.p2p. With shape.overlap_p2p nothing waits at a send or receive:
// each is posted when the rank reaches it, and a compute action waits for its input to arrive (the
// later of its receive's posting and its send's posting plus costs.p2p).
// With ReceiveWait::kEveryPostedAtFirstUse the first run of each (kind, chunk) on a rank waits for
// every receive the rank posted before it instead.
// Throws, naming every stuck rank and what it waits on,
// when the ranks deadlock; and when a send meets a receive of another micro-batch or stage.
SimulatedPipeline simulate(const ScheduleShape& shape, const std::vector<std::vector<Action>>& per_rank,
                           const ActionCosts& costs, ReceiveWait wait = ReceiveWait::kOwnInput);
// The same for build_schedule's lists.
SimulatedPipeline simulate(const ScheduleShape& shape, const ActionCosts& costs,
                           ReceiveWait wait = ReceiveWait::kOwnInput);

}  // namespace megatron::pipeline_parallel
