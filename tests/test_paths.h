#pragma once
// Where the tests find the repository (fixtures, sources). CMake passes it to test_paths.cpp alone:
// __FILE__ is no guide, since ccache's base_dir makes it relative to the build directory.
#include <filesystem>

namespace megatron::testing {

std::filesystem::path repo_root();

}  // namespace megatron::testing
