#include "megatron/training/device.h"

#include "megatron/core/logging.h"
#include "megatron/core/memory.h"

#ifdef MEGATRON_WITH_CUDA
#include "megatron/ops/cuda/allocator.h"
#include "megatron/ops/cuda/device.h"
#endif

namespace megatron {

Device select_device(const std::string& requested, int local_rank) {
  if (requested == "cpu") return Device::cpu();
#ifdef MEGATRON_WITH_CUDA
  if (requested == "auto" && !cuda::cuda_available()) return Device::cpu();
  const cuda::DeviceInfo info = cuda::init_device(local_rank);
  LOG_INFO("> using GPU " << info.index << ": " << info.name << " (sm_" << info.sm_major << info.sm_minor << ", "
                          << info.total_memory / (1024 * 1024) << " MiB)");
  return Device::cuda(info.index);
#else
  MEGATRON_CHECK(requested == "auto",
                 "--device cuda: this build has no CUDA backend (nvcc was not found when it "
                     << "was configured); rebuild on a machine with the CUDA toolkit or use --device cpu");
  (void)local_rank;
  return Device::cpu();
#endif
}

double peak_memory_mib(Device device) {
#ifdef MEGATRON_WITH_CUDA
  if (device.is_cuda()) return double(cuda::memory_stats().peak_bytes) / (1024.0 * 1024.0);
#endif
  (void)device;
  return double(memory_stats(DeviceType::cpu).peak_bytes) / (1024.0 * 1024.0);
}

}  // namespace megatron
