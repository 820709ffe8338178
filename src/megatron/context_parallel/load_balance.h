#pragma once
// Megatron's load-balanced split of a sequence over C context-parallel ranks
// (get_batch_on_this_cp_rank): the sequence of S positions is cut into 2C chunks of L = S/(2C),
// and CP rank r holds chunk r followed by chunk 2C-1-r. Under a causal mask early chunks attend to
// few keys and late ones to many; pairing the r-th earliest with the r-th latest gives every rank
// the same work. The positions a rank holds are therefore [rL, (r+1)L) and [(2C-1-r)L, (2C-r)L):
// RoPE and the masks use these true positions.
#include <cstdint>

#include "megatron/core/tensor.h"

namespace megatron::context_parallel {

struct CpChunks {
  int64_t length = 0;  // L: positions per chunk
  int64_t first = 0;   // the chunk indices this rank holds, in its local order
  int64_t second = 0;
  // The true position of the first element of local half `half` (0: chunk `first`, 1: `second`).
  int64_t start(int half) const { return (half == 0 ? first : second) * length; }
};

// The chunks CP rank `rank` of `size` holds of a sequence of `sequence` positions; `sequence` must
// divide by 2 * size (the arguments check this before any work, with the fix).
CpChunks cp_chunks(int64_t sequence, int64_t size, int64_t rank);

// This rank's part of a batch-major (B,S) tensor (tokens, labels, loss mask, position and segment
// ids): (B,S/C), its two chunks in local order. Any dtype; a CPU tensor (the loader's host memory).
Tensor split_sequence(const Tensor& batch_major, int64_t size, int64_t rank);

}  // namespace megatron::context_parallel
