// megatron plan's fit advice (planning/fit_advice.h): flags replaced with all their values, and the
// advice for a model that does not fit: each listed change re-planned fits, smallest peak first,
// and a limit nothing reaches says so.
#include <gtest/gtest.h>

#include <sstream>

#include "megatron/planning/fit_advice.h"
#include "megatron/planning/memory_plan.h"
#include "megatron/training/arguments.h"

#include "test_util.h"

using namespace megatron;
using megatron::testing::words;

namespace {

TEST(PlanAdvice, WithFlagsReplacesAFlagAndAllItsValues) {
  const std::vector<std::string> given =
      words("--model-preset tiny --recompute-modules core_attn mlp --micro-batch-size=4 --bf16");
  EXPECT_EQ(planning::with_flags(given, {{"--recompute-modules", "mlp"}, {"--micro-batch-size", "2"}}),
            words("--model-preset tiny --bf16 --recompute-modules mlp --micro-batch-size 2"));
  EXPECT_EQ(planning::with_flags(given, {{"--use-distributed-optimizer"}}),
            words("--model-preset tiny --recompute-modules core_attn mlp --micro-batch-size=4 --bf16 "
                  "--use-distributed-optimizer"));
}

const std::string kRun =
    "--model-preset llama-1b --micro-batch-size 8 --global-batch-size 8 --train-iters 1 --lr 1e-3 "
    "--mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --device cpu";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double peak_gib(const std::vector<std::string>& argv) {
  return planning::plan_memory(parse_training_args(argv), planning::PlanBackend::cpu).peak() / kGiB;
}

TEST(PlanAdvice, ListsChangesThatFitSmallestFirst) {
  const double peak = peak_gib(words(kRun));
  const double limit = 0.8 * peak;
  const std::string advice = planning::fit_advice(words(kRun), 1, limit, planning::PlanBackend::cpu);
  ASSERT_NE(advice.find("does not fit"), std::string::npos) << advice;
  // Every listed change, applied to the command line and planned again, fits; the list is sorted.
  std::istringstream lines(advice);
  std::string line;
  std::getline(lines, line);
  double previous = 0;
  int listed = 0;
  while (std::getline(lines, line)) {
    const size_t colon = line.find("GiB: ");
    ASSERT_NE(colon, std::string::npos) << line;
    const double gib = std::stod(line);
    const std::vector<std::string> change = words(line.substr(colon + 5));
    std::vector<std::vector<std::string>> flags;
    for (const std::string& w : change) {
      if (w.rfind("--", 0) == 0) flags.push_back({w});
      else flags.back().push_back(w);
    }
    EXPECT_NEAR(peak_gib(planning::with_flags(words(kRun), flags)), gib, 0.005) << line;  // printed to 0.01
    EXPECT_LE(gib, limit) << line;
    EXPECT_GE(gib, previous) << line;
    previous = gib;
    ++listed;
  }
  EXPECT_GT(listed, 0) << advice;
  EXPECT_NE(advice.find("--recompute-granularity full"), std::string::npos) << advice;
  EXPECT_EQ(planning::fit_advice(words(kRun), 1, 2 * peak, planning::PlanBackend::cpu).rfind("fits", 0), 0u);
  EXPECT_NE(planning::fit_advice(words(kRun), 1, 1e-4 * peak, planning::PlanBackend::cpu).find("none of"),
            std::string::npos);
}

// bf16 weights: the precision-aware optimizer alone (2 bytes a master less) is advice where it
// fits, and is not offered again where it is given.
TEST(PlanAdvice, OffersThePrecisionAwareOptimizerForBf16Weights) {
  const std::string run = std::string(kRun) + " --bf16";
  const double with_remainders = peak_gib(planning::with_flags(words(run), {{"--use-precision-aware-optimizer"}}));
  ASSERT_LT(with_remainders, peak_gib(words(run)));
  const std::string advice = planning::fit_advice(words(run), 1, with_remainders + 0.001, planning::PlanBackend::cpu);
  EXPECT_NE(advice.find("GiB: --use-precision-aware-optimizer\n"), std::string::npos) << advice;
  const std::string given = planning::fit_advice(words(run + " --use-precision-aware-optimizer"), 1,
                                                 0.9 * with_remainders, planning::PlanBackend::cpu);
  EXPECT_EQ(given.find("GiB: --use-precision-aware-optimizer\n"), std::string::npos) << given;
}

}  // namespace
