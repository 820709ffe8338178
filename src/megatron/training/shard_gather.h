#pragma once
// Collects every rank's checkpoint shards on one rank. The checkpoint layer writes from a single
// process (checkpointing/checkpoint.h), so under data parallelism the ranks send the shards they
// are responsible for (model weights from DP rank 0, optimizer state from every rank that owns
// some) to the writing rank, which saves them as separate shards with their global offsets.
//
// Protocol over `comm`, collectives only, so a rank that never arrives is named by the watchdog:
// all-gather of each rank's sizes; then all-to-all exchanges in which every rank sends to the
// root alone: the headers (names, dtypes, shapes, offsets), then the shards' bytes. The root gets
// host copies of every shard, its own first, then the other ranks' in rank order; the others get
// an empty list. Data travel on `device` (the communicator's: NCCL needs GPU memory) and are
// packed on the host, so the root holds every shard in host memory, as the single-writer
// checkpoint layer needs anyway.
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/parallel/comm.h"

namespace megatron {

std::vector<checkpointing::ShardedTensor> gather_shards(Communicator& comm,
                                                        const std::vector<checkpointing::ShardedTensor>& mine, int root,
                                                        Device device);

}  // namespace megatron
