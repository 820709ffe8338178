#include "megatron/training/device.h"

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/memory.h"
#include "megatron/cuda_runtime/device.h"

namespace megatron {

Device select_device(const std::string& requested, int local_rank, bool fp8, bool fp8_blockwise) {
  const bool cpu = requested == "cpu" || (requested == "auto" && !cuda::cuda_available());
  MEGATRON_CHECK(!(cpu && fp8), "--fp8-format needs a GPU with FP8 tensor cores (compute capability 8.9+), but this "
                                    << (requested == "cpu" ? "run asks for --device cpu" : "process sees no GPU")
                                    << ": run on a GPU, or drop --fp8-format");
  if (cpu) return Device::cpu();
  const cuda::DeviceInfo info = cuda::init_device(local_rank);
  MEGATRON_CHECK(!fp8 || info.sm_major * 10 + info.sm_minor >= 89,
                 "--fp8-format needs FP8 tensor cores (compute capability 8.9+: Ada, Hopper or newer), but GPU "
                     << info.index << " (" << info.name << ") is sm_" << info.sm_major << info.sm_minor
                     << ": drop --fp8-format");
  // cuBLASLt's 1x128 / 128x128 block-scaled FP8 GEMMs (VEC128_32F, BLK128x128_32F) exist for
  // compute capability 9.0 only (Blackwell's block scaling is MXFP8's).
  MEGATRON_CHECK(!fp8_blockwise || info.sm_major == 9,
                 "--fp8-recipe blockwise needs Hopper (compute capability 9.0: cuBLASLt's block-scaled FP8 GEMMs), "
                 "but GPU "
                     << info.index << " (" << info.name << ") is sm_" << info.sm_major << info.sm_minor
                     << ": use --fp8-recipe tensorwise or delayed");
  LOG_INFO("> using GPU " << info.index << ": " << info.name << " (sm_" << info.sm_major << info.sm_minor << ", "
                          << info.total_memory / (1024 * 1024) << " MiB)");
  return Device::cuda(info.index);
}

double peak_memory_mib(Device device) { return double(memory_stats(device).peak_bytes) / (1024.0 * 1024.0); }

}  // namespace megatron
