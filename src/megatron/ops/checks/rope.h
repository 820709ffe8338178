#pragma once
// Argument checks of rotary position embedding (ops/rope.h), shared by ops/cpu/rope.cpp and
// ops/cuda/rope.cu; `device` is the backend's device rule.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/rope.h"

namespace megatron::ops::checks {

// x and y (S,B,H,D); the first rot_dim channels of each head rotate.
struct RopeDims {
  int64_t S, B, H, D, rot_dim;
};
// y = rope(x) for rope_forward, dx = rope^-1(dy) for rope_backward: op and the names say which.
RopeDims check_rope(const Tensor& y, const Tensor& x, const RopeParams& p, const char* op, const char* y_name,
                    const char* x_name, TensorCheck device);

// qkv (S,B,G,(r+2)*D) with r = num_heads / G query heads per group; the first rot_dim channels of
// each query and key head rotate.
struct RopeQkvDims {
  int64_t S, B, G, r, D, rot_dim;
};
// rope_forward_qkv / rope_backward_qkv (op) on qkv, named qkv_name in errors.
RopeQkvDims check_rope_qkv(const Tensor& qkv, int64_t num_heads, const RopeParams& p, const char* op,
                           const char* qkv_name, TensorCheck device);

}  // namespace megatron::ops::checks
