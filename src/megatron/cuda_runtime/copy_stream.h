#pragma once
// A stream for copies between a GPU and pinned host memory, beside the compute stream, with events
// that order it against the host and the compute stream: what lets the offloaded optimizer step
// (optimizer/offload_copies.h) move gradients down and parameters up while the CPU computes.
// Free of CUDA headers and declared in every build (without the CUDA backend, creating one is an
// error that says so).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace megatron::cuda {

class CopyStream {
 public:
  // A non-blocking stream on GPU `device` (made current on the calling thread): only its events
  // order it, never the legacy default stream.
  explicit CopyStream(int device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // The copies queued from now on start after the work queued so far on this thread's current
  // stream (compute work that writes their sources). Starts a new set of events: those record()
  // returned before are reused from here on.
  void wait_for_current_stream();
  // Queues a copy of `bytes` (cudaMemcpyAsync; one side on the GPU, the other pinned host memory).
  void copy(void* dst, const void* src, size_t bytes);
  // An event after the copies queued so far; the index names it until the next
  // wait_for_current_stream().
  int64_t record();
  // Returns once the copies before event `event` have finished (the host may read and reuse their
  // memory).
  void host_wait(int64_t event);
  // This thread's current stream runs its later work after the copies before event `event`,
  // without blocking the host.
  void current_stream_waits(int64_t event);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace megatron::cuda
