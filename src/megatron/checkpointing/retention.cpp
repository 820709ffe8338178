#include "megatron/checkpointing/retention.h"

#include <algorithm>
#include <filesystem>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/core/error.h"

namespace megatron::checkpointing {

std::vector<int64_t> remove_old_checkpoints(const std::string& save_dir, int64_t keep) {
  MEGATRON_CHECK(keep >= 1, "remove_old_checkpoints keeps at least one checkpoint (got " << keep << ")");
  const std::optional<int64_t> tracked = read_tracker(save_dir);
  if (!tracked || *tracked == kReleaseIteration) return {};
  std::vector<int64_t> published = list_checkpoints(save_dir);
  std::erase_if(published, [&](int64_t it) { return it > *tracked; });
  if (int64_t(published.size()) <= keep) return {};
  published.resize(published.size() - size_t(keep));
  for (const int64_t iteration : published) {
    std::error_code ec;
    std::filesystem::remove_all(checkpoint_directory(save_dir, iteration), ec);
    MEGATRON_CHECK(!ec, "cannot remove the old checkpoint " << checkpoint_directory(save_dir, iteration)
                                                            << " (--keep-last-checkpoints): " << ec.message()
                                                            << "; check the permissions of " << save_dir);
  }
  return published;
}

}  // namespace megatron::checkpointing
