#include "megatron/parallel/comm.h"

#include <algorithm>
#include <cmath>

#include "megatron/parallel/collective_checks.h"

namespace megatron {

namespace {

class CompletedHandle final : public CommHandle {
 public:
  void wait() override {}
  bool test() override { return true; }
};

void copy_if_distinct(Tensor& out, const Tensor& in) {
  if (out.raw() != in.raw()) out.copy_from(in);
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

CommHandlePtr completed_handle() { return std::make_unique<CompletedHandle>(); }

SingleRankCommunicator::SingleRankCommunicator(std::string group_name, int world_rank)
    : name_(std::move(group_name)), world_ranks_{world_rank} {}

void SingleRankCommunicator::set_timeout(double seconds) {
  MEGATRON_CHECK(std::isfinite(seconds) && seconds > 0,
                 name_ << ": timeout " << seconds << " s must be positive (--distributed-timeout-minutes)");
  timeout_ = seconds;
}

CommHandlePtr SingleRankCommunicator::all_reduce_coalesced_async(std::span<Tensor> tensors, ReduceOp op) {
  for (const Tensor& t : tensors) {
    MEGATRON_CHECK(t.defined(), name_ << " all_reduce: undefined tensor");
    check_reduce_op(*this, "all_reduce", t.dtype(), op);
  }
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::all_gather_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " all_gather: " << outs.size() << " outputs for " << ins.size() << " inputs");
  for (size_t i = 0; i < outs.size(); ++i) {
    check_all_gather(*this, outs[i], ins[i]);
    copy_if_distinct(outs[i], ins[i]);
  }
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::reduce_scatter_coalesced_async(std::span<Tensor> outs,
                                                                     std::span<const Tensor> ins, ReduceOp op) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " reduce_scatter: " << outs.size() << " outputs for " << ins.size() << " inputs");
  for (size_t i = 0; i < outs.size(); ++i) {
    check_reduce_scatter(*this, outs[i], ins[i], op);
    copy_if_distinct(outs[i], ins[i]);
  }
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::broadcast_async(Tensor& tensor, int root) {
  check_broadcast(*this, tensor, root);
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::all_to_all_async(Tensor& out, const Tensor& in) {
  check_all_to_all(*this, out, in);
  out.copy_from(in);
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::all_to_all_v_async(Tensor& out, std::span<const int64_t> recv_rows,
                                                         const Tensor& in, std::span<const int64_t> send_rows) {
  check_all_to_all_v(*this, out, recv_rows, in, send_rows);
  MEGATRON_CHECK(recv_rows[0] == send_rows[0], name_ << " all_to_all_v: this rank sends itself " << send_rows[0]
                                                     << " rows but expects " << recv_rows[0]);
  if (out.numel() > 0) out.copy_from(in);
  return completed_handle();
}

// Sends to self are received in order, as between two ranks.
CommHandlePtr SingleRankCommunicator::batch_p2p_async(std::span<const P2POp> ops) {
  check_p2p(*this, ops);
  std::vector<Tensor> sends, recvs;
  for (const P2POp& op : ops) (op.kind == P2POp::Kind::send ? sends : recvs).push_back(op.tensor);
  MEGATRON_CHECK(sends.size() == recvs.size(), name_ << " batch_p2p: " << sends.size() << " sends and " << recvs.size()
                                                     << " receives on a one-rank group never match");
  for (size_t i = 0; i < sends.size(); ++i) {
    MEGATRON_CHECK(sends[i].numel() == recvs[i].numel() && sends[i].dtype() == recvs[i].dtype(),
                   name_ << " batch_p2p: send " << i << " (" << sends[i].numel() << " " << dtype_name(sends[i].dtype())
                         << ") does not match receive " << i << " (" << recvs[i].numel() << " "
                         << dtype_name(recvs[i].dtype()) << ")");
    recvs[i].copy_from(sends[i]);
  }
  return completed_handle();
}

CommHandlePtr SingleRankCommunicator::barrier_async() { return completed_handle(); }

std::vector<std::shared_ptr<Communicator>> ParallelContext::communicators() const {
  std::vector<std::shared_ptr<Communicator>> all;
  for (const auto& c : {world,
                        tp,
                        dp,
                        pp,
                        pp_grad,
                        cp,
                        cp_a2a,
                        cp_p2p,
                        dp_cp,
                        mp,
                        ep,
                        expert_tp,
                        expert_dp,
                        expert_tp_ep,
                        expert_mp,
                        embedding,
                        position_embedding,
                        pp_channels.activations_in,
                        pp_channels.activations_out,
                        pp_channels.grads_in,
                        pp_channels.grads_out})
    if (c && std::find(all.begin(), all.end(), c) == all.end()) all.push_back(c);
  return all;
}

void ParallelContext::set_timeout(double seconds) const {
  for (const auto& c : communicators()) c->set_timeout(seconds);
}

ParallelContext ParallelContext::single_process() {
  ParallelContext ctx;
  for (auto [slot, name] : {std::pair{&ctx.world, "world"},
                            {&ctx.tp, "tp"},
                            {&ctx.dp, "dp"},
                            {&ctx.pp, "pp"},
                            {&ctx.pp_grad, "pp_grad"},
                            {&ctx.cp, "cp"},
                            {&ctx.dp_cp, "dp_cp"},
                            {&ctx.mp, "mp"},
                            {&ctx.ep, "ep"},
                            {&ctx.expert_tp, "expert_tp"},
                            {&ctx.expert_dp, "expert_dp"},
                            {&ctx.expert_tp_ep, "expert_tp_ep"},
                            {&ctx.expert_mp, "expert_mp"},
                            {&ctx.embedding, "embedding"},
                            {&ctx.position_embedding, "position_embedding"}})
    *slot = std::make_shared<SingleRankCommunicator>(name);
  return ctx;
}

}  // namespace megatron
