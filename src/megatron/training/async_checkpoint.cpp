#include "megatron/training/async_checkpoint.h"

namespace megatron {

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointSaver::start(const std::function<std::unique_ptr<TrainingCheckpointSave>()>& begin) {
  maybe_finalize(/*blocking=*/true);
  pending_ = begin();
  written_ = false;
  writer_ = std::thread([this] {
    pending_->write();  // keeps its failure for publish(); never throws
    written_ = true;
  });
}

void AsyncCheckpointSaver::maybe_finalize(bool blocking) {
  if (!pending_) return;
  if (blocking) {
    writer_.join();
  } else {
    // Min over the world: publish only when every rank's files are on disk.
    Tensor done = Tensor::zeros({1}, DType::f32);
    done.set_item(0, written_ ? 1.0 : 0.0);
    Tensor reduced = done.to(device_);
    world_->all_reduce(reduced, ReduceOp::min);
    if (reduced.item(0) == 0.0) return;
    writer_.join();
  }
  const std::unique_ptr<TrainingCheckpointSave> save = std::move(pending_);
  save->publish();
}

}  // namespace megatron
