#include "megatron/pipeline_parallel/schedule_executor.h"

#include <deque>
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
  // Blocking batches on `activations` and `grads`.
  Executor(const std::vector<Action>& actions, Communicator& activations, Communicator& grads, const StageTensor& t)
      : actions_(actions), activations_(&activations), grads_(&grads), between_(t) {
    for (const Action& a : actions)
      if (is_send(a.kind)) sends_.insert(key_of(a));
  }
  // Every send and receive alone on its channel.
  Executor(const std::vector<Action>& actions, const PipelineChannels& channels, const StageTensor& t)
      : actions_(actions), channels_(&channels), between_(t) {
    MEGATRON_CHECK(channels.built(),
                   "overlapped pipeline communication needs the pipeline channels "
                   "(initialize_parallel with ParallelOptions::pipeline_channels)");
    for (const Action& a : actions)
      if (is_send(a.kind)) sends_.insert(key_of(a));
  }

  void run(const StageFunctions& stage) {
    for (size_t i = 0; i < actions_.size();) {
      const Action& a = actions_[i];
      if (!is_compute(a.kind)) {
        i = channels_ != nullptr ? post(i) : communicate(i);
        continue;
      }
      const bool forward = a.kind == ActionKind::kForward;
      const Key input_key{forward ? ActionKind::kRecvActivation : ActionKind::kRecvGrad, a.microbatch, a.chunk};
      if (auto pending = receiving_.find(input_key); pending != receiving_.end()) {
        pending->second->wait();
        receiving_.erase(pending);
      }
      const Tensor input = take(input_key);
      Tensor out = forward ? stage.forward(a.microbatch, a.chunk, input) : stage.backward(a.microbatch, a.chunk, input);
      const Key send{forward ? ActionKind::kSendActivation : ActionKind::kSendGrad, a.microbatch, a.chunk};
      if (sends_.count(send)) {
        check_shape(out, a);
        held_[send] = std::move(out);
      }
      ++i;
      release_sent();
    }
    for (CommHandlePtr& send : sending_) send->wait();
    MEGATRON_CHECK(held_.empty() && receiving_.empty(), "pipeline schedule: " << held_.size() << " tensors held and "
                                                                              << receiving_.size()
                                                                              << " receives never consumed");
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
    CommHandlePtr forward_handle = forward_ops.empty() ? nullptr : activations_->batch_p2p_async(forward_ops);
    CommHandlePtr backward_handle = backward_ops.empty() ? nullptr : grads_->batch_p2p_async(backward_ops);
    if (forward_handle) forward_handle->wait();
    if (backward_handle) backward_handle->wait();
    for (auto& [key, tensor] : received) held_[key] = std::move(tensor);
    return end;
  }

  // Overlapped: posts the send or receive at `i` on its channel (the sender is the channel's rank
  // 0) and returns i + 1. A receive's tensor is held at once and read after its handle's wait.
  size_t post(size_t i) {
    const Action& a = actions_[i];
    const bool activation = is_activation(a.kind);
    P2POp op;
    if (is_send(a.kind)) {
      op.kind = P2POp::Kind::send;
      op.peer = 1;
      op.tensor = take(key_of(a));
      Communicator& out = activation ? *channels_->activations_out : *channels_->grads_out;
      sending_.push_back(out.batch_p2p_async({&op, 1}));
    } else {
      op.kind = P2POp::Kind::recv;
      op.peer = 0;
      op.tensor = Tensor::empty(between_.shape, between_.dtype, between_.device);
      Communicator& in = activation ? *channels_->activations_in : *channels_->grads_in;
      receiving_[key_of(a)] = in.batch_p2p_async({&op, 1});
      held_[key_of(a)] = op.tensor;
    }
    return i + 1;
  }

  // Drops the sends that have completed, oldest first: a later one stays until those before it are
  // seen complete (a few outputs at most), and testing lets MPI progress them.
  void release_sent() {
    while (!sending_.empty() && sending_.front()->test()) sending_.pop_front();
  }

  const std::vector<Action>& actions_;
  Communicator* activations_ = nullptr;  // blocking: the pipeline group's two communicators
  Communicator* grads_ = nullptr;
  const PipelineChannels* channels_ = nullptr;  // overlapped
  StageTensor between_;
  std::set<Key> sends_;
  std::map<Key, Tensor> held_;              // outputs waiting for their send, inputs waiting for their compute
  std::map<Key, CommHandlePtr> receiving_;  // overlapped receives posted, not yet waited
  std::deque<CommHandlePtr> sending_;       // overlapped sends posted, not yet seen complete
};

}  // namespace

void run_schedule(const std::vector<Action>& actions, Communicator& activations, Communicator& grads,
                  const StageTensor& between_stages, const StageFunctions& stage) {
  Executor(actions, activations, grads, between_stages).run(stage);
}

void run_schedule_overlapped(const std::vector<Action>& actions, const PipelineChannels& channels,
                             const StageTensor& between_stages, const StageFunctions& stage) {
  Executor(actions, channels, between_stages).run(stage);
}

}  // namespace megatron::pipeline_parallel
