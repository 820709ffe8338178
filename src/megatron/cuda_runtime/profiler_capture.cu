#include <cuda_profiler_api.h>

#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/profiler_capture.h"

namespace megatron::cuda {

void profiler_capture_start() { CUDA_CHECK(cudaProfilerStart()); }
void profiler_capture_stop() { CUDA_CHECK(cudaProfilerStop()); }

}  // namespace megatron::cuda
