#pragma once
// The --save directory, made ready before any work starts, so that a directory that cannot take
// checkpoints stops the run at once instead of at the first save, hours later.
#include <string>

namespace megatron::checkpointing {

// Creates `save_dir` (and its parents) when missing, as Megatron does, then creates and removes a
// probe file named `probe_name` in it (unique per writing process, e.g. its rank). Throws naming
// the directory, the reason and the fix when the path is not a directory, cannot be created or
// cannot be written.
void prepare_save_directory(const std::string& save_dir, const std::string& probe_name);

}  // namespace megatron::checkpointing
