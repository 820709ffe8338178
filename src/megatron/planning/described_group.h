#pragma once
// A rank's place in a layout, without the layout: communicators that know their group's size and
// this rank's index in it, and join nothing. `megatron plan` builds the model a rank of the planned
// layout would build (the same constructors, so the same parameters, shards and padding), without
// launching that layout; every collective on these groups raises.
#include <string>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/parallel_args.h"

namespace megatron::planning {

class DescribedGroup final : public Communicator {
 public:
  DescribedGroup(std::string name, int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  void set_timeout(double) override {}
  double timeout() const override { return 0.0; }
  CommHandlePtr all_reduce_coalesced_async(std::span<Tensor>, ReduceOp) override;
  CommHandlePtr all_gather_coalesced_async(std::span<Tensor>, std::span<const Tensor>) override;
  CommHandlePtr reduce_scatter_coalesced_async(std::span<Tensor>, std::span<const Tensor>, ReduceOp) override;
  CommHandlePtr broadcast_async(Tensor&, int) override;
  CommHandlePtr all_to_all_async(Tensor&, const Tensor&) override;
  CommHandlePtr all_to_all_v_async(Tensor&, std::span<const int64_t>, const Tensor&,
                                   std::span<const int64_t>) override;
  CommHandlePtr batch_p2p_async(std::span<const P2POp>) override;
  CommHandlePtr barrier_async() override;

 private:
  CommHandlePtr refuse(const char* what) const;
  std::string name_;
  int rank_, size_;
  std::vector<int> world_ranks_;
};

// The model context of the rank at tensor-parallel rank `tp_rank` and pipeline rank `pp_rank` (every
// other index 0) of a world of `world_size` ranks laid out by `args`, with the run's sequence
// parallelism and overlap flags (model_context).
ParallelContext described_context(const ParallelArgs& args, int64_t world_size, int tp_rank, int pp_rank);

}  // namespace megatron::planning
