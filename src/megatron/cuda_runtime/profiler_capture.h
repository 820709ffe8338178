#pragma once
// The CUDA profiler's capture range: what `nsys profile --capture-range=cudaProfilerApi` records
// (Megatron's --profile). Without a profiler attached, starting and stopping does nothing. Free of
// CUDA headers and declared in every build: without the CUDA backend (without_cuda.cpp) both are
// errors that say so.
namespace megatron::cuda {

void profiler_capture_start();  // cudaProfilerStart on the current device
void profiler_capture_stop();   // cudaProfilerStop

}  // namespace megatron::cuda
