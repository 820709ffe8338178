#pragma once
// The dot product of two rows of n stored elements in compute_t (float, or double for f64), summed
// in index order: one definition for the CPU ops that take one (attention, the sigmoid gate).
#include <cstdint>

#include "megatron/core/dtype.h"

namespace megatron::ops::cpu {

template <class T>
compute_t<T> dot_row(const T* a, const T* b, int64_t n) {
  compute_t<T> sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += load(a[i]) * load(b[i]);
  return sum;
}

}  // namespace megatron::ops::cpu
