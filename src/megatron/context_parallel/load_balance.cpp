#include "megatron/context_parallel/load_balance.h"

#include <cstring>

#include "megatron/core/error.h"

namespace megatron::context_parallel {

CpChunks cp_chunks(int64_t sequence, int64_t size, int64_t rank) {
  MEGATRON_CHECK(size > 0 && rank >= 0 && rank < size,
                 "context-parallel rank " << rank << " is outside a group of " << size << " ranks");
  MEGATRON_CHECK(sequence % (2 * size) == 0, "sequence length " << sequence << " is not divisible by 2 x "
                                                                << "--context-parallel-size = " << 2 * size
                                                                << ": each CP rank holds two equal chunks");
  return {.length = sequence / (2 * size), .first = rank, .second = 2 * size - 1 - rank};
}

Tensor split_sequence(const Tensor& batch_major, int64_t size, int64_t rank) {
  MEGATRON_CHECK(batch_major.ndim() == 2 && batch_major.device().is_cpu(),
                 "split_sequence takes a (B,S) CPU tensor, got " << shape_str(batch_major.shape()) << " on "
                                                                 << batch_major.device().str());
  const int64_t B = batch_major.dim(0), S = batch_major.dim(1);
  const CpChunks c = cp_chunks(S, size, rank);
  Tensor local = Tensor::empty({B, 2 * c.length}, batch_major.dtype());
  const size_t element = batch_major.element_size(), chunk_bytes = size_t(c.length) * element;
  const auto* src = static_cast<const char*>(batch_major.raw());
  auto* dst = static_cast<char*>(local.raw());
  for (int64_t b = 0; b < B; ++b) {
    for (int half = 0; half < 2; ++half) {
      std::memcpy(dst + (size_t(b * 2 + half) * chunk_bytes), src + size_t(b * S + c.start(half)) * element,
                  chunk_bytes);
    }
  }
  return local;
}

}  // namespace megatron::context_parallel
