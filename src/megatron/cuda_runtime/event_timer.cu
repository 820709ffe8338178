#include <cuda_runtime.h>

#include <vector>

#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/event_timer.h"

namespace megatron::cuda {

namespace {
struct EventPool {
  std::vector<cudaEvent_t> events;
  size_t used = 0;
  ~EventPool() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};
EventPool& pool() {
  static EventPool p;  // process-wide like the profiler that owns the recording
  return p;
}
}  // namespace

int64_t event_timer_record() {
  EventPool& p = pool();
  if (p.used == p.events.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    p.events.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(p.events[p.used], current_stream()));
  return int64_t(p.used++);
}

void event_timer_synchronize() {
  EventPool& p = pool();
  if (p.used > 0) CUDA_CHECK(cudaEventSynchronize(p.events[p.used - 1]));
}

float event_timer_elapsed_ms(int64_t start, int64_t end) {
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, pool().events[size_t(start)], pool().events[size_t(end)]));
  return ms;
}

void event_timer_reset() { pool().used = 0; }

}  // namespace megatron::cuda
