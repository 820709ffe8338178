#pragma once
// A pool of CUDA events for the op profiler: record() queues an event on the current stream and
// returns its index; elapsed_ms() reads the time between two recorded events after
// synchronize(); reset() makes every pooled event reusable. Free of CUDA headers and declared in
// every build: without the CUDA backend no CUDA op runs, so nothing records, and record() is an
// error that says so.
#include <cstdint>

namespace megatron::cuda {

int64_t event_timer_record();
void event_timer_synchronize();
float event_timer_elapsed_ms(int64_t start, int64_t end);
void event_timer_reset();

}  // namespace megatron::cuda
