#include "megatron/training/batch_size_rampup.h"

#include <cmath>

namespace megatron {

int64_t BatchSizeRampup::batch_size_at(int64_t consumed_samples) const {
  if (consumed_samples > samples) return global_batch_size;
  const double samples_per_increment = double(samples) / double((global_batch_size - start) / increment);
  // Python's int() of a non-negative float: the floor.
  return start + int64_t(std::floor(double(consumed_samples) / samples_per_increment)) * increment;
}

int64_t BatchSizeRampup::train_iterations(int64_t train_samples) const {
  int64_t iterations = 0, consumed = 0;
  while (consumed <= samples && consumed <= train_samples) {
    consumed += batch_size_at(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_batch_size;
  return iterations;
}

}  // namespace megatron
