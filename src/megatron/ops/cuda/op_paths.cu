#include <array>
#include <atomic>

#include "megatron/ops/cuda/op_paths.h"

namespace megatron::ops::cuda {
namespace {

// Process-wide, as the routing decisions it counts (plan caches, warnings) are.
std::array<std::atomic<int64_t>, kOpPaths>& counts() {
  static std::array<std::atomic<int64_t>, kOpPaths> c{};
  return c;
}

}  // namespace

void count_op_path(OpPath path) { counts()[size_t(path)].fetch_add(1, std::memory_order_relaxed); }

int64_t op_path_count(OpPath path) { return counts()[size_t(path)].load(std::memory_order_relaxed); }

}  // namespace megatron::ops::cuda
