#include <cuda_runtime.h>

#include <vector>

#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/copy_stream.h"
#include "megatron/cuda_runtime/cuda_check.h"

namespace megatron::cuda {

struct CopyStream::State {
  cudaStream_t stream = nullptr;
  // Events without timing (cheaper to record and wait on), created as a step first needs them and
  // reused by every later one: the steady state creates none.
  std::vector<cudaEvent_t> events;
  size_t used = 0;
  cudaEvent_t compute_done = nullptr;

  ~State() {  // destructors must not throw; a failure shows at the next checked call
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (compute_done != nullptr) cudaEventDestroy(compute_done);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  cudaEvent_t at(int64_t event) const {
    MEGATRON_CHECK(event >= 0 && size_t(event) < used,
                   "copy-stream event " << event << " was not recorded since the last wait_for_current_stream() ("
                                        << used << " were)");
    return events[size_t(event)];
  }
};

CopyStream::CopyStream(int device) : state_(std::make_unique<State>()) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&state_->compute_done, cudaEventDisableTiming));
}

CopyStream::~CopyStream() = default;

void CopyStream::wait_for_current_stream() {
  CUDA_CHECK(cudaEventRecord(state_->compute_done, current_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(state_->stream, state_->compute_done, 0));
  state_->used = 0;
}

void CopyStream::copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, state_->stream));  // unified addressing: direction
}

int64_t CopyStream::record() {
  if (state_->used == state_->events.size()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    state_->events.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(state_->events[state_->used], state_->stream));
  return int64_t(state_->used++);
}

void CopyStream::host_wait(int64_t event) { CUDA_CHECK(cudaEventSynchronize(state_->at(event))); }

void CopyStream::current_stream_waits(int64_t event) {
  CUDA_CHECK(cudaStreamWaitEvent(current_stream(), state_->at(event), 0));
}

}  // namespace megatron::cuda
