#pragma once
// Which device a run computes on, and how much memory it has used there.
#include <string>

#include "megatron/core/tensor.h"

namespace megatron {

// --device auto|cpu|cuda. auto takes the GPU (local_rank) when this build has the CUDA backend
// and sees one. cuda without a usable GPU is an error naming the reason. `fp8` (--fp8-format): a
// run without a GPU, or on one older than FP8's compute capability 8.9, is an error too;
// `fp8_blockwise` (--fp8-recipe blockwise) needs compute capability 9.0 (Hopper).
Device select_device(const std::string& requested, int local_rank, bool fp8 = false, bool fp8_blockwise = false);

// Peak bytes handed out on the device (MiB), for the log line.
double peak_memory_mib(Device device);

}  // namespace megatron
