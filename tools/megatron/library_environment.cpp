#include "library_environment.h"

#include <cstdio>
#include <cstdlib>

namespace megatron::tools {

namespace {
// setenv without overwriting: a value the user chose stands.
void set_default(const char* name, const char* value, const char* consequence) {
  if (setenv(name, value, 0) != 0)
    std::fprintf(stderr, "megatron: could not set %s=%s; %s\n", name, value, consequence);
}
}  // namespace

void set_nccl_defaults() { set_default("NCCL_NVLS_ENABLE", "0", "NCCL communicators will refuse to start"); }

void set_tensor_parallel_defaults(int64_t tensor_model_parallel_size) {
  if (tensor_model_parallel_size > 1)
    set_default("CUDA_DEVICE_MAX_CONNECTIONS", "1", "TP communication may overlap its GEMMs less");
}

void set_deterministic_defaults(bool deterministic_mode) {
  if (deterministic_mode)
    set_default("NCCL_ALGO", "Ring", "NCCL picks its algorithm, which may not sum in a fixed order");
}

}  // namespace megatron::tools
