#pragma once
// Argument checks shared by the CPU and CUDA backends (ops/cpu, ops/cuda): the rules of the op
// contract (ops/README.md) live once here, so both backends reject the same calls with the same
// messages. Plain C++: no CUDA headers, so ops/cpu can include it.
//
// Each family's checks take the backend's device rule as a TensorCheck (cpu::check_cpu or
// cuda::check_cuda) and call it where that backend checked the device before, so the first
// failing rule, and its message, do not depend on where the rules are written.
#include "megatron/core/tensor.h"

namespace megatron::ops::checks {

// A backend's rule for one tensor argument (device, supported dtypes); throws on violation.
using TensorCheck = void (*)(const Tensor& t, const char* name);

// Parameter gradients and saved statistics (mean, rstd, lse): f64 for f64 activations, f32 otherwise.
// For the storage types that is compute_t<T>; this is the same rule for a runtime dtype.
inline DType accum_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

inline void check_defined(const Tensor& t, const char* name) {
  MEGATRON_CHECK(t.defined(), name << " is undefined; the op needs it");
}

inline void check_numel(const Tensor& t, int64_t expected, const char* name) {
  check_defined(t, name);
  MEGATRON_CHECK(t.numel() == expected, name << " has " << t.numel() << " elements (shape " << shape_str(t.shape())
                                             << "), expected " << expected);
}

// x viewed as rows of its last dimension: the number of rows N (product of the leading dims).
inline int64_t rows_of(const Tensor& x, const char* name) {
  check_defined(x, name);
  MEGATRON_CHECK(x.ndim() >= 1, name << " must have at least one dimension, got a 0-d tensor");
  int64_t rows = 1;
  for (int i = 0; i + 1 < x.ndim(); ++i) rows *= x.dim(i);
  return rows;
}

// shape with its last dimension replaced by `last`.
inline Shape with_last_dim(const Shape& shape, int64_t last) {
  Shape s = shape;
  s.back() = last;
  return s;
}

}  // namespace megatron::ops::checks
