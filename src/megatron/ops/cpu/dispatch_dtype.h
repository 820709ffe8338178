#pragma once
// Shared by the CPU kernels: choose a template instantiation from a runtime dtype, and check the
// rules every op of the contract states (ops/README.md).
//
// Usage: dispatch_floating(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) { kernel<T>(...); });
#include <type_traits>

#include "megatron/core/tensor.h"
#include "megatron/ops/checks/common.h"

namespace megatron::ops::cpu {

// Backend-neutral argument helpers (ops/checks/common.h), named here for the kernels' brevity.
using checks::accum_dtype;
using checks::check_defined;
using checks::check_numel;
using checks::rows_of;

// The dtypes activations and weights may have on the CPU: f32, the 16-bit storage formats bf16
// and f16 (arithmetic in float, rounded once per stored result), and f64 (gradient checks).
template <class Fn>
void dispatch_floating(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(std::type_identity<float>{});
    case DType::f64:
      return fn(std::type_identity<double>{});
    case DType::bf16:
      return fn(std::type_identity<bf16>{});
    case DType::f16:
      return fn(std::type_identity<f16>{});
    default:
      break;
  }
  MEGATRON_FAIL(op << ": dtype " << dtype_name(dtype) << " is not supported on the CPU; use f32, bf16, f16 or f64");
}

// Loops doing less work than this (element operations) stay on one thread: waking the OpenMP
// team costs microseconds, and milliseconds on a loaded machine, which would dominate small ops.
inline bool worth_parallel(int64_t work) { return work >= (int64_t(1) << 15); }

// An op runs on the device of its first defined tensor (ops/op.h); every other tensor must live on
// the CPU too.
inline void check_cpu(const Tensor& t, const char* name) {
  MEGATRON_CHECK(!t.defined() || t.device().is_cpu(),
                 name << " is on " << t.device().str() << " but the op runs on the CPU; pass CPU tensors only");
}

}  // namespace megatron::ops::cpu
