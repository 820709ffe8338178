#pragma once
// Error checking for cuDNN calls (the context's handle here, the attention graphs in
// ops/cuda/cudnn_plan.h): a failure throws megatron::Error with the call, cuDNN's status and its
// last error message.
#include <cudnn_graph.h>

#include <string>

#include "megatron/core/error.h"

namespace megatron::cuda {

// cuDNN's name for `status` followed by its last error message (cudnnGetLastErrorString).
std::string cudnn_status_message(cudnnStatus_t status);

}  // namespace megatron::cuda

#define CUDNN_CHECK(call)                                                                                   \
  do {                                                                                                      \
    const cudnnStatus_t megatron_cudnn_status_ = (call);                                                    \
    MEGATRON_CHECK(megatron_cudnn_status_ == CUDNN_STATUS_SUCCESS,                                          \
                   #call << " failed: " << ::megatron::cuda::cudnn_status_message(megatron_cudnn_status_)); \
  } while (0)
