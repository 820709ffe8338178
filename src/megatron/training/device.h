#pragma once
// Which device a run computes on, and how much memory it has used there.
#include <string>

#include "megatron/core/tensor.h"

namespace megatron {

// --device auto|cpu|cuda. auto takes the GPU (local_rank) when this build has the CUDA backend
// and sees one. cuda without a usable GPU is an error naming the reason.
Device select_device(const std::string& requested, int local_rank);

// Peak bytes handed out on the device (MiB), for the log line.
double peak_memory_mib(Device device);

}  // namespace megatron
