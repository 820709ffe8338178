#include "megatron/planning/described_group.h"

#include <numeric>

#include "megatron/core/error.h"

namespace megatron::planning {

DescribedGroup::DescribedGroup(std::string name, int rank, int size)
    : name_(std::move(name)), rank_(rank), size_(size), world_ranks_(size_t(size)) {
  std::iota(world_ranks_.begin(), world_ranks_.end(), 0);
}

CommHandlePtr DescribedGroup::refuse(const char* what) const {
  MEGATRON_CHECK(false, "the " << name_ << " group of `megatron plan` describes a layout and joins no ranks; "
                               << what << " was called on it (plan builds models, it runs nothing)");
  return nullptr;
}

CommHandlePtr DescribedGroup::all_reduce_coalesced_async(std::span<Tensor>, ReduceOp) { return refuse("all-reduce"); }
CommHandlePtr DescribedGroup::all_gather_coalesced_async(std::span<Tensor>, std::span<const Tensor>) {
  return refuse("all-gather");
}
CommHandlePtr DescribedGroup::reduce_scatter_coalesced_async(std::span<Tensor>, std::span<const Tensor>, ReduceOp) {
  return refuse("reduce-scatter");
}
CommHandlePtr DescribedGroup::broadcast_async(Tensor&, int) { return refuse("broadcast"); }
CommHandlePtr DescribedGroup::all_to_all_async(Tensor&, const Tensor&) { return refuse("all-to-all"); }
CommHandlePtr DescribedGroup::all_to_all_v_async(Tensor&, std::span<const int64_t>, const Tensor&,
                                                 std::span<const int64_t>) {
  return refuse("all-to-all-v");
}
CommHandlePtr DescribedGroup::batch_p2p_async(std::span<const P2POp>) { return refuse("send/recv"); }
CommHandlePtr DescribedGroup::barrier_async() { return refuse("barrier"); }

ParallelContext described_context(const ParallelArgs& args, int64_t world_size, int tp_rank, int pp_rank) {
  ParallelSizes s = args.sizes();
  s.world = world_size;
  const auto group = [](const char* name, int rank, int64_t size) {
    return std::make_shared<DescribedGroup>(name, rank, int(size));
  };
  const bool ends = pp_rank == 0 || pp_rank == s.pp - 1;
  ParallelContext groups;
  groups.world = group("world", 0, s.world);
  groups.tp = group("tp", tp_rank, s.tp);
  groups.dp = group("dp", 0, s.dp());
  groups.pp = group("pp", pp_rank, s.pp);
  groups.pp_grad = group("pp_grad", pp_rank, s.pp);
  groups.cp = group("cp", 0, s.cp);
  groups.dp_cp = group("dp_cp", 0, s.dp() * s.cp);
  groups.mp = group("mp", 0, s.tp * s.pp);
  groups.ep = group("ep", 0, s.ep);
  groups.expert_tp = group("expert_tp", 0, s.expert_tp());
  groups.expert_dp = group("expert_dp", 0, s.expert_dp());
  groups.expert_tp_ep = group("expert_tp_ep", 0, s.expert_tp() * s.ep);
  groups.expert_mp = group("expert_mp", 0, s.expert_tp() * s.ep * s.pp);
  groups.embedding = group("embedding", pp_rank == 0 ? 0 : 1, ends && s.pp > 1 ? 2 : 1);
  groups.position_embedding = group("position_embedding", 0, 1);
  return model_context(groups, args);
}

}  // namespace megatron::planning
