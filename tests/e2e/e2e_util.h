#pragma once
// Helpers for end-to-end tests: temporary directories and running the `megatron` binary.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace megatron::testing {

using megatron::testing::TempDir;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `megatron <args>` (the binary CMake passes in MEGATRON_BIN) through the shell.
inline RunResult run_megatron(const std::string& args) {
  const char* bin = std::getenv("MEGATRON_BIN");
  RunResult r;
  if (bin == nullptr) {
    r.output = "MEGATRON_BIN is not set: run these tests through ctest, or set it to the megatron executable";
    return r;
  }
  const std::string command = std::string(bin) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace megatron::testing
