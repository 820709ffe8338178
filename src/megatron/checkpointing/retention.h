#pragma once
// Keeping only the newest checkpoints of a --save directory (--keep-last-checkpoints K; ours:
// Megatron keeps every checkpoint). Called by the process that publishes, after the tracker is
// rewritten, so the checkpoint a crash would resume from is never among those removed.
#include <cstdint>
#include <string>
#include <vector>

namespace megatron::checkpointing {

// Removes the iter_* directories of save_dir older than the newest `keep` at or below the
// tracker's iteration (a directory above it, left by a save that never published, stays for the
// run that wrote it to replace). keep >= 1. Returns the iterations removed, ascending.
std::vector<int64_t> remove_old_checkpoints(const std::string& save_dir, int64_t keep);

}  // namespace megatron::checkpointing
