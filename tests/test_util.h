#pragma once
// Helpers shared by the test suites.
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/error.h"

namespace megatron::testing {

// A command line written as one string, split at whitespace (argument lists in tests).
inline std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// The message of the megatron::Error that fn throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A fresh directory under /tmp, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "megatron-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The smallest valid `megatron train` command line (mock data): tests add or override flags.
inline std::vector<std::string> minimal_train_argv(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"--num-layers",
                                "2",
                                "--hidden-size",
                                "64",
                                "--num-attention-heads",
                                "4",
                                "--seq-length",
                                "128",
                                "--micro-batch-size",
                                "2",
                                "--train-iters",
                                "10",
                                "--lr",
                                "1e-3",
                                "--mock-data",
                                "--tokenizer-type",
                                "NullTokenizer",
                                "--vocab-size",
                                "100"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace megatron::testing
