// Megatron's timer lines (Timers.log: names padded with dots to 48 columns, two decimals) and the
// straggler report, on values worked out by hand.
#include <gtest/gtest.h>

#include "megatron/training/timing_log.h"

using namespace megatron;

namespace {
const std::vector<std::string> kNames = {"forward-backward", "optimizer", "batch-generator"};
// times[rank][timer] in ms; batch-generator never ran, so it is left out.
const std::vector<std::vector<double>> kTimes = {{12.5, 1.25, 0.0}, {14.0, 1.0, 0.0}};
}  // namespace

TEST(TimingLog, MinMax) {
  EXPECT_EQ(format_timers(kNames, kTimes, "minmax"),
            "(min, max) time across ranks (ms):\n"
            "    forward-backward ...............................: (12.50, 14.00)\n"
            "    optimizer ......................................: (1.00, 1.25)");
}

TEST(TimingLog, Max) {
  EXPECT_EQ(format_timers(kNames, kTimes, "max"),
            "max time across ranks (ms):\n"
            "    forward-backward ...............................: 14.00\n"
            "    optimizer ......................................: 1.25");
}

TEST(TimingLog, All) {
  EXPECT_EQ(format_timers(kNames, kTimes, "all"),
            "times across ranks (ms):\n"
            "  forward-backward:\n"
            "     rank  0: 12.50\n"
            "     rank  1: 14.00\n"
            "  optimizer:\n"
            "     rank  0: 1.25\n"
            "     rank  1: 1.00");
}

TEST(TimingLog, NothingRanNothingPrinted) { EXPECT_EQ(format_timers({"optimizer"}, {{0.0}, {0.0}}, "minmax"), ""); }

// Ranks at 10, 40, 12, 11 ms: median (11 + 12) / 2 = 11.5; 40 / 11.5 = 3.478 -> 3.48x;
// 10 / 11.5 = 0.870 -> 0.87x; 12 / 11.5 = 1.043 -> 1.04x; 11 / 11.5 = 0.957 -> 0.96x.
TEST(TimingLog, StragglerReportNamesTheSlowestAndFastest) {
  EXPECT_EQ(format_straggler_report({10, 40, 12, 11}, 1, 11, 20),
            "straggler report, forward-backward compute per iteration over iterations 11-20 (x the median 11.50 ms): "
            "slowest rank 1 40.00 ms (3.48x) | fastest rank 0 10.00 ms (0.87x)");
  EXPECT_EQ(format_straggler_report({10, 40, 12, 11}, 2, 11, 20),
            "straggler report, forward-backward compute per iteration over iterations 11-20 (x the median 11.50 ms): "
            "slowest rank 1 40.00 ms (3.48x), rank 2 12.00 ms (1.04x) | fastest rank 0 10.00 ms (0.87x), rank 3 "
            "11.00 ms (0.96x)");
}
