#pragma once
// megatron plan's memory model: each pipeline stage's peak memory per rank, by component, for a
// `train` command line, without running it.
//
// The parameters are the engine's own: the plan builds each stage's model chunks the way a rank of
// the layout does (described_group.h: same constructors, no buffers allocated), lays them out with
// the DDP buffer layout the run uses (distributed/buffer_layout.h) and sizes the optimizer's state
// as the optimizers allocate it. Activations come from activation_model.h, the micro-batches in
// flight from the pipeline schedule the run executes (build_schedule: the largest moment of the
// forwards held plus the running backward's working set).
//
// Peak = weights (less those released then) + gradients + optimizer state + activations of the
// micro-batches in flight + the working set of the backward that is running + communication buffers
// + allocator slack at the step's largest moment, where the gradients are the buckets held then
// (without FSDP each model chunk's buckets take memory during its first backward of the step:
// distributed/ddp.h), or the set-up's peak where larger (DDP moving the parameters into its layout
// holds the registry's and its own parameter buffers at once, the gradients once:
// ParameterRegistry::GradsOnMove::drop). With --optimizer-cpu-offload the offloaded share of the
// optimizer state (optimizer/adamw_state.h: master weights always kept apart there, two staging
// slots of up to 64 Mi elements) is host memory: on a GPU it leaves the device; on the CPU backend
// it is the same memory and still counted. Megatron FSDP (--use-megatron-fsdp): optim is the
// distributed optimizer; optim_grads keeps this rank's shard of the gradients, optim_grads_params
// of the weights too, plus the units in flight at the peak (fsdp_units_in_flight: gathered
// parameters, full gradients being reduce-scattered). On the CPU backend the distributed
// optimizer's reduce-scatters return each bucket's shard in a buffer of its own, held until the
// step's reductions are waited for: with --overlap-grad-reduce from the end of the last
// micro-batch's backward, which still holds all its saved activations.
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/planning/activation_model.h"
#include "megatron/training/arguments.h"

namespace megatron::planning {

struct StageMemory {
  int64_t pipeline_rank = 0;
  int64_t parameters = 0;         // elements this rank holds (its TP and EP shard, padded)
  double weights = 0;             // bytes; in FP8 with the step's weight casts (W and W^T, a byte each)
  double weights_released = 0;    // of those, released at the peak (from their bucket's last backward to
                                  // its update: TrainingArgs::releases_weights_after_backward)
  double gradients = 0;           // fp32 main gradients held at the peak (FSDP: this rank's shards)
  double optimizer_state = 0;     // master weights (16-bit runs) and Adam moments, or this rank's shard of them,
                                  // on the device (less what --optimizer-cpu-offload moves to the host)
  double host_optimizer = 0;      // the offloaded state and its staging slots in host memory (CUDA runs)
  struct LayerActivations {
    int64_t layer = 0;  // global index
    int64_t bytes = 0;  // saved for backward by one micro-batch
  };
  std::vector<LayerActivations> layer_activations;  // every layer of the stage (all its chunks)
  double activations_per_micro_batch = 0;  // everything saved (as the log reports) plus the device's inputs,
                                           // one micro-batch through one chunk (averaged over chunks)
  int64_t in_flight = 1;                   // (micro-batch, chunk) forwards held at the peak
  double activations = 0;                  // what those hold
  double backward_working = 0;             // the running backward's gradients and copies
  double data_batches = 0;                 // the loader's batches of a step (CPU: in the same memory)
  double communication = 0;                // pipeline send/receive buffers; Megatron FSDP's units in flight
                                           // (gathered parameters, full gradients reducing); on the
                                           // CPU, the distributed optimizer's reduce-scatter results
  double allocator_slack = 0;              // CUDA's rounding of the transients (none on the CPU)
  double set_up_peak = 0;                  // while DDP lays out the buffers
  double steady_peak() const;
  double peak() const;
};

struct MemoryPlan {
  PlanBackend backend = PlanBackend::cpu;
  int64_t world_size = 1;
  std::vector<StageMemory> stages;  // one per pipeline rank
  double peak() const;              // the largest stage's
};

MemoryPlan plan_memory(const TrainingArgs& args, PlanBackend backend);

// The plan as a table, every component in MiB per stage.
std::string format_memory_plan(const MemoryPlan& plan);

}  // namespace megatron::planning
