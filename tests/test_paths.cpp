#include "test_paths.h"

namespace megatron::testing {

std::filesystem::path repo_root() { return MEGATRON_SOURCE_DIR; }

}  // namespace megatron::testing
