#pragma once
// --deterministic-mode's launcher environment (Megatron's megatron/training/determinism.py). The
// ops take fixed-order kernels from TransformerConfig::deterministic_mode; what the process
// environment decides is NCCL's algorithm, which fixes the order of a collective's sums. The
// `megatron` program sets NCCL_ALGO=Ring, Megatron's default, where the launcher left it unset
// (tools/megatron/library_environment.h); a value the launcher set must be one whose order is fixed.
#include <string>
#include <vector>

#include "megatron/parallel/launch.h"

namespace megatron {

// NCCL_ALGO values accepted beside --deterministic-mode: comma-separated tokens from this set
// (Megatron's; Tree is left out: its reduction order can change between runs).
inline constexpr const char* kDeterministicNcclAlgos[] = {"Ring", "CollnetDirect", "CollnetChain", "^NVLS"};

// One message per setting that breaks determinism (value, rule, fix); empty when none does.
std::vector<std::string> deterministic_environment_problems(const EnvLookup& getenv);
// The same for the process's environment, raised as one error. Called by pretrain for a run with
// --deterministic-mode before any communicator exists.
void check_deterministic_environment();

}  // namespace megatron
