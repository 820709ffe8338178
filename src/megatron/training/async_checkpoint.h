#pragma once
// --async-save (Megatron's): a save takes this rank's state into host memory at the save
// iteration and writes the files from a background thread while training goes on; publishing
// (metadata, rename, tracker) stays on the training thread, a collective, as in a synchronous save,
// so it stays atomic and checksummed, and the bytes written are a synchronous save's.
//
// Megatron's order: every iteration, maybe_finalize(false) publishes the pending save once every
// rank's files are written (one all-reduce while a save is pending); the next save, and the end of
// training, wait for the pending one and publish it first. A process killed while a save is
// pending leaves its staging directory unpublished: the previous checkpoint stays the latest.
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "megatron/training/checkpoint_io.h"

namespace megatron {

class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver(Communicator& world, Device device) : world_(&world), device_(device) {}
  // Waits for the writing thread; a save still pending is left unpublished (an error unwinds).
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Publishes the pending save (waiting for it), then begins a new one with `begin` (which builds
  // it with Snapshot::host_copy) and starts writing it. Collective. The previous save is published
  // before the next one stages: publishing removes the staging directories it does not own.
  void start(const std::function<std::unique_ptr<TrainingCheckpointSave>()>& begin);
  // Publishes the pending save when every rank has written its files, or, with `blocking`, once
  // they have. Collective while a save is pending (every rank has the same one); nothing otherwise.
  void maybe_finalize(bool blocking);

 private:
  Communicator* world_;
  Device device_;
  std::unique_ptr<TrainingCheckpointSave> pending_;
  std::thread writer_;
  std::atomic<bool> written_{false};
};

}  // namespace megatron
