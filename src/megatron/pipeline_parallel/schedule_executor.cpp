#include "megatron/pipeline_parallel/schedule_executor.h"

#include <map>
#include <set>
#include <tuple>

#include "megatron/core/error.h"

namespace megatron::pipeline_parallel {

namespace {

using Key = std::tuple<ActionKind, int64_t, int64_t>;  // (send or receive kind, micro-batch, chunk)

Key key_of(const Action& a) { return {a.kind, a.microbatch, a.chunk}; }

bool is_activation(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kRecvActivation; }
bool is_send(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kSendGrad; }

class Executor {
 public:
  Executor(const std::vector<Action>& actions, Communicator& activations, Communicator& grads, const StageTensor& t)
      : actions_(actions), activations_(activations), grads_(grads), between_(t) {
    for (const Action& a : actions)
      if (is_send(a.kind)) sends_.insert(key_of(a));
  }

  void run(const StageFunctions& stage) {
    for (size_t i = 0; i < actions_.size();) {
      const Action& a = actions_[i];
      if (!is_compute(a.kind)) {
        i = communicate(i);
        continue;
      }
      const bool forward = a.kind == ActionKind::kForward;
      const Tensor input = take({forward ? ActionKind::kRecvActivation : ActionKind::kRecvGrad, a.microbatch, a.chunk});
      Tensor out = forward ? stage.forward(a.microbatch, a.chunk, input) : stage.backward(a.microbatch, a.chunk, input);
      const Key send{forward ? ActionKind::kSendActivation : ActionKind::kSendGrad, a.microbatch, a.chunk};
      if (sends_.count(send)) {
        check_shape(out, a);
        held_[send] = std::move(out);
      }
      ++i;
    }
    MEGATRON_CHECK(held_.empty(), "pipeline schedule: " << held_.size() << " tensors computed but never sent");
  }

 private:
  // The received (or computed) tensor under `key`, removed; undefined when none is held.
  Tensor take(const Key& key) {
    auto it = held_.find(key);
    if (it == held_.end()) return Tensor();
    Tensor t = std::move(it->second);
    held_.erase(it);
    return t;
  }

  void check_shape(const Tensor& t, const Action& a) const {
    MEGATRON_CHECK(t.defined() && t.shape() == between_.shape && t.dtype() == between_.dtype,
                   "pipeline stage: " << to_string(a) << " produced "
                                      << (t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) : "nothing")
                                      << " but tensors between stages are " << shape_str(between_.shape) << " "
                                      << dtype_name(between_.dtype));
  }

  // Posts the batch starting at `first` (activations and gradients on their communicators), waits
  // for it, and returns the index after it.
  size_t communicate(size_t first) {
    std::vector<P2POp> forward_ops, backward_ops;
    std::vector<std::pair<Key, Tensor>> received;
    size_t end = first;
    for (; end < actions_.size() && !is_compute(actions_[end].kind); ++end) {
      const Action& a = actions_[end];
      P2POp op;
      op.peer = int(a.peer);
      if (is_send(a.kind)) {
        op.kind = P2POp::Kind::send;
        op.tensor = take(key_of(a));
      } else {
        op.kind = P2POp::Kind::recv;
        op.tensor = Tensor::empty(between_.shape, between_.dtype, between_.device);
        received.emplace_back(key_of(a), op.tensor);
      }
      (is_activation(a.kind) ? forward_ops : backward_ops).push_back(std::move(op));
    }
    CommHandlePtr forward_handle = forward_ops.empty() ? nullptr : activations_.batch_p2p_async(forward_ops);
    CommHandlePtr backward_handle = backward_ops.empty() ? nullptr : grads_.batch_p2p_async(backward_ops);
    if (forward_handle) forward_handle->wait();
    if (backward_handle) backward_handle->wait();
    for (auto& [key, tensor] : received) held_[key] = std::move(tensor);
    return end;
  }

  const std::vector<Action>& actions_;
  Communicator& activations_;
  Communicator& grads_;
  StageTensor between_;
  std::set<Key> sends_;
  std::map<Key, Tensor> held_;  // outputs waiting for their send, inputs waiting for their compute
};

}  // namespace

void run_schedule(const std::vector<Action>& actions, Communicator& activations, Communicator& grads,
                  const StageTensor& between_stages, const StageFunctions& stage) {
  Executor(actions, activations, grads, between_stages).run(stage);
}

}  // namespace megatron::pipeline_parallel
