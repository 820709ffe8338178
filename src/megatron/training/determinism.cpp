#include "megatron/training/determinism.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron {

std::vector<std::string> deterministic_environment_problems(const EnvLookup& getenv) {
  std::vector<std::string> problems;
  const char* algo = getenv("NCCL_ALGO");
  if (algo == nullptr) return problems;
  std::vector<std::string> tokens;
  std::stringstream list(algo);
  for (std::string token; std::getline(list, token, ',');) {
    const size_t first = token.find_first_not_of(" \t"), last = token.find_last_not_of(" \t");
    if (first != std::string::npos) tokens.push_back(token.substr(first, last - first + 1));
  }
  const auto accepted = [](const std::string& token) {
    return std::find(std::begin(kDeterministicNcclAlgos), std::end(kDeterministicNcclAlgos), token) !=
           std::end(kDeterministicNcclAlgos);
  };
  if (tokens.empty() || !std::all_of(tokens.begin(), tokens.end(), accepted))
    problems.push_back(concat("NCCL_ALGO=", algo,
                              " beside --deterministic-mode: each comma-separated algorithm must be one of Ring, "
                              "CollnetDirect, CollnetChain or ^NVLS, whose sums run in a fixed order (Tree's order "
                              "can change between runs). Unset it (Ring is then used) or set NCCL_ALGO=Ring"));
  return problems;
}

void check_deterministic_environment() {
  const std::vector<std::string> problems =
      deterministic_environment_problems([](const char* name) -> const char* { return std::getenv(name); });
  MEGATRON_CHECK(problems.empty(), join(problems, "\n"));
}

}  // namespace megatron
