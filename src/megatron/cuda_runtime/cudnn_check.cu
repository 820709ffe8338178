#include "megatron/cuda_runtime/cudnn_check.h"

namespace megatron::cuda {

std::string cudnn_status_message(cudnnStatus_t status) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = cudnnGetErrorString(status);
  if (detail[0] != '\0') message += std::string(" (") + detail + ")";
  return message;
}

}  // namespace megatron::cuda
