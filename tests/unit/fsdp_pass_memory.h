#pragma once
// Megatron FSDP's transient buckets as the device's allocator counts them (every byte in use, not
// FSDP's own HeldBytes), shared by the CPU test (test_fsdp_pass_memory.cpp) and its GPU form over
// NCCL (tests/gpu/test_nccl_comm.cpp): a model of equal decoder layers, one f32
// parameter each (so one FSDP unit and bucket each), goes through the notifications a model's
// forward and backward make, under DDP with optim_grads_params over a data-parallel group of one
// rank. Nothing is computed: what is measured is what FSDP and its communicator keep alive.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "megatron/core/memory.h"
#include "megatron/distributed/ddp.h"
#include "megatron/parameters/parameter_registry.h"

namespace megatron::testing {

struct FsdpPassMemory {
  int64_t bucket_bytes = 0;      // one layer's parameter (and full gradient) in f32
  int64_t peak_above_start = 0;  // the most bytes in use above the pass's start, after any notification
};

// Two passes of `layers` layers of `numel` elements (a multiple of 128, so buckets are unpadded)
// over `group`; the second is measured, after `before_measured_pass` (the GPU form stalls its
// stream there, so the host runs ahead of the device as it does in training). The first pass fills
// the allocator's cache with every block size the second needs.
inline FsdpPassMemory fsdp_pass_memory(Device device, std::shared_ptr<Communicator> group, int layers, int64_t numel,
                                       const std::function<void()>& before_measured_pass) {
  ParameterRegistry registry;
  std::vector<Parameter*> params;
  for (int i = 0; i < layers; ++i)
    params.push_back(registry.add(
        {.name = "decoder.layers." + std::to_string(i) + ".mlp.linear_fc1.weight", .global_shape = {numel}}));
  registry.allocate(DType::f32, device);
  ParallelContext ctx = ParallelContext::single_process();
  ctx.dp = group;
  ctx.dp_cp = group;
  DistributedDataParallel ddp(
      registry, ctx,
      {.overlap_grad_reduce = true, .use_distributed_optimizer = true, .shard_grads = true, .shard_params = true});
  FsdpPassMemory m{numel * int64_t(sizeof(float)), 0};
  int64_t start = 0;
  const auto sample = [&] {
    m.peak_above_start = std::max(m.peak_above_start, int64_t(memory_stats(device).current_bytes) - start);
  };
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      before_measured_pass();
      start = int64_t(memory_stats(device).current_bytes);
      m.peak_above_start = 0;
    }
    ddp.zero_grad();
    for (Parameter* p : params) {
      registry.before_forward(*p);
      sample();
      registry.after_forward(*p);
      sample();
    }
    for (auto p = params.rbegin(); p != params.rend(); ++p) {
      registry.before_backward(**p);
      sample();
      registry.grad_ready(**p);
      sample();
    }
    ddp.finish_grad_sync();
    sample();
  }
  return m;
}

// What FSDP holds above its shards at most in this model between two notifications, in buckets
// (fully_sharded.h): two gathered (the running unit and the one prefetched), the running unit's full
// gradient, and two reductions in flight, each a full gradient and its reduced part (a whole bucket
// at DP 1). (Starting a third reduction holds one more reduced part for a moment, until the oldest
// is finished.)
inline constexpr int64_t kFsdpBucketsAtPeak = 2 + 1 + 2 * 2;

}  // namespace megatron::testing
