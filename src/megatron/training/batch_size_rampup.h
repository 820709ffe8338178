#pragma once
// Megatron's --rampup-batch-size START INCREMENT SAMPLES (its
// RampupBatchsizeNumMicroBatchesCalculator and update_train_iters; reference/megatron-compat.md,
// the note on rampup): the global batch grows from START by INCREMENT in equal steps of samples
// until SAMPLES have been consumed, then stays at --global-batch-size (GBS):
//   increments = (GBS - START) / INCREMENT; samples_per_increment = SAMPLES / increments (real);
//   batch size at c consumed samples = GBS when c > SAMPLES, else
//                                      START + floor(c / samples_per_increment) * INCREMENT.
// Training is counted in samples (--train-samples): the iterations are those of the ramp (each
// consuming the batch size of its consumed samples, while consumed <= SAMPLES and <= train
// samples) plus (train samples - consumed) / GBS at the full size (a partial last batch dropped).
#include <cstdint>

namespace megatron {

struct BatchSizeRampup {
  int64_t start = 0;
  int64_t increment = 0;
  int64_t samples = 0;
  int64_t global_batch_size = 0;

  int64_t batch_size_at(int64_t consumed_samples) const;
  int64_t train_iterations(int64_t train_samples) const;
};

}  // namespace megatron
