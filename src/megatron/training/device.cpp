#include "megatron/training/device.h"

#include "megatron/core/logging.h"
#include "megatron/core/memory.h"
#include "megatron/cuda_runtime/device.h"

namespace megatron {

Device select_device(const std::string& requested, int local_rank) {
  if (requested == "cpu") return Device::cpu();
  if (requested == "auto" && !cuda::cuda_available()) return Device::cpu();
  const cuda::DeviceInfo info = cuda::init_device(local_rank);
  LOG_INFO("> using GPU " << info.index << ": " << info.name << " (sm_" << info.sm_major << info.sm_minor << ", "
                          << info.total_memory / (1024 * 1024) << " MiB)");
  return Device::cuda(info.index);
}

double peak_memory_mib(Device device) { return double(memory_stats(device).peak_bytes) / (1024.0 * 1024.0); }

}  // namespace megatron
