// FP8 training on the CPU, for its loss curve: the casts there are exact (ops/cpu/fp8.cpp: e4m3/e5m2
// rounding and saturation, Transformer Engine's delayed and current scaling) and the GEMMs multiply
// the exact FP8 values, summing in f64 where cuBLASLt's FP8 GEMM sums in f32, so the curve is a GPU
// run's but for the GEMMs' rounding of their sums. `megatron train` refuses FP8 without a GPU
// (its point there is speed); this program runs a `megatron train` command line that has --bf16
// and --fp8-* flags on the CPU, and bench/bench_fp8_curve.sh sets its curve beside bf16's.
// Usage: fp8_emulated_curve <megatron train flags>   (--device is ignored: the CPU)
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/training.h"

int main(int argc, char** argv) {
  using namespace megatron;
  try {
    std::vector<std::string> flags(argv + 1, argv + argc);
    // Parsed as for a GPU, which is what --fp8-format asks for; the run is on the CPU below.
    bool device_given = false;
    for (size_t i = 0; i + 1 < flags.size(); ++i)
      if (flags[i] == "--device") flags[i + 1] = "cuda", device_given = true;
    if (!device_given) flags.insert(flags.end(), {"--device", "cuda"});
    const TrainingArgs args = parse_training_args(flags);
    if (!args.model.fp8.enabled()) {
      std::fprintf(stderr, "fp8_emulated_curve: no --fp8-format given; run `megatron train` for bf16\n");
      return 2;
    }
    pretrain(args, ParallelContext::single_process(), Device::cpu());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_emulated_curve: error: %s\n", e.what());
    return 1;
  }
}
