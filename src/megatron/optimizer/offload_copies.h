#pragma once
// The copies of the offloaded optimizer step (adamw_state.h) between the model's device and the host
// staging slots: queued in order beside the compute work, with marks that order them against the
// host (the CPU update reads a chunk's gradients, refills a slot) and the compute stream (the next
// forward reads the uploaded parameters).
//
// On a GPU they run on a copy stream (cuda_runtime/copy_stream.h) while the host updates. On the
// CPU backend they are queued too and run only when a wait asks for them, in queue order: the
// step's ordering is the same code on both backends, and a missing wait leaves stale values in a
// slot or a parameter, which the CPU tests' bit-for-bit comparisons catch.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/copy_stream.h"

namespace megatron {

class OffloadCopies {
 public:
  explicit OffloadCopies(Device model_device);

  using Mark = int64_t;
  // The copies queued from now on read what the compute work queued so far has written (the
  // step's gradients). Marks from before are spent.
  void after_compute();
  // Queues dst <- src: same dtype and element count, one on the model's device, the other a host
  // staging slot; neither may be touched until a wait covers the copy.
  void copy(Tensor dst, const Tensor& src);
  // The end of the copies queued so far.
  Mark mark();
  // Returns once the copies before `mark` are done.
  void host_wait(Mark mark);
  // The compute work queued from now on (the next forward) sees the copies before `mark`.
  void compute_waits(Mark mark);

 private:
  std::unique_ptr<cuda::CopyStream> stream_;  // on a GPU
  // On the CPU: the queue (destination, source), and how many of its copies have run.
  std::vector<std::pair<Tensor, Tensor>> queued_;
  size_t done_ = 0;
  void run_until(Mark mark);
};

}  // namespace megatron
