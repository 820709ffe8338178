#pragma once
// A pool of CUDA events for the op profiler: record() queues an event on the current stream and
// returns its index; elapsed_ms() reads the time between two recorded events after
// synchronize(). Free of CUDA headers so host code can use it.
#include <cstdint>

namespace megatron::cuda {

int64_t event_timer_record();
void event_timer_synchronize();
float event_timer_elapsed_ms(int64_t start, int64_t end);
void event_timer_reset();  // makes every pooled event reusable

}  // namespace megatron::cuda
