// The watchdog's analysis of a stuck operation (which rank is missing, from what the others
// answer), and its timeout path in a process without MPI.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "megatron/parallel/watchdog.h"
#include "megatron/parallel/watchdog_report.h"
#include "test_util.h"

using namespace megatron;

namespace {

// A rank that issued `issued` operations on dp, the last one still in flight.
PeerStatus at_dp(int rank, uint64_t issued, const std::string& op = "all_reduce", int64_t count = 10) {
  CollectiveLog log(8);
  CollectiveRecord last;
  for (uint64_t i = 0; i < issued; ++i) {
    if (i > 0) log.end(last);
    last = log.begin("dp", false, i + 1 == issued ? op : "all_reduce", count, DType::f32);
  }
  return decode_status(encode_status(rank, log));
}

CollectiveRecord stuck_dp(uint64_t seq) {
  CollectiveRecord r;
  r.group = "dp", r.seq = seq, r.op = "all_reduce", r.count = 10, r.dtype = DType::f32;
  return r;
}

std::string all_lines(const Diagnosis& d) {
  std::string s;
  for (const auto& l : d.lines) s += l + "\n";
  return s;
}

}  // namespace

TEST(WatchdogReport, StatusSurvivesTheTrip) {
  CollectiveLog log(4);
  log.end(log.begin("tp", false, "all_gather", 8, DType::bf16));
  log.begin("pp", true, "batch_p2p", 3, DType::f32, "send->1");
  const PeerStatus p = decode_status(encode_status(7, log));
  EXPECT_TRUE(p.answered);
  EXPECT_EQ(p.world_rank, 7);
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].group, "tp");
  EXPECT_EQ(p.groups[0].completed, 1u);
  EXPECT_TRUE(p.groups[1].p2p);
  ASSERT_EQ(p.in_flight.size(), 1u);
  EXPECT_EQ(p.in_flight[0].op, "batch_p2p");
  EXPECT_EQ(p.in_flight[0].count, 3);
  EXPECT_NE(megatron::testing::error_of([] { decode_status("R 1\nX what\n"); }).find("unknown watchdog status line"),
            std::string::npos);
}

// A rank that is behind with nothing in flight never arrived; one waiting inside an earlier
// operation is held up, and named only when no rank is silent (a silent rank is the likelier cause:
// the root of an all-to-all still waiting for a stopped rank is behind all the others).
PeerStatus idle_at_dp(int rank, uint64_t issued) {
  CollectiveLog log(8);
  for (uint64_t i = 0; i < issued; ++i) log.end(log.begin("dp", false, "all_reduce", 10, DType::f32));
  return decode_status(encode_status(rank, log));
}

TEST(WatchdogReport, HeldUpRanksAreNotBlamedForASilentOne) {
  const Diagnosis d = diagnose(stuck_dp(5), {at_dp(0, 4), at_dp(1, 5), PeerStatus{2, false, {}, {}}});
  EXPECT_EQ(d.missing, (std::vector<int>{2}));
  EXPECT_EQ(
      d.lines.back(),
      "timeout in dp all_reduce #5 (10 f32); rank(s) 0 wait in an earlier operation, held up; missing rank(s): 2");
  // With every rank answering, the held-up rank is the one to look at.
  EXPECT_EQ(diagnose(stuck_dp(5), {at_dp(0, 4), at_dp(1, 5)}).missing, (std::vector<int>{0}));
}

TEST(WatchdogReport, NamesRanksThatNeverAnsweredOrArrived) {
  const Diagnosis d = diagnose(stuck_dp(5), {at_dp(1, 5), PeerStatus{2, false, {}, {}}, idle_at_dp(3, 4)});
  EXPECT_EQ(d.missing, (std::vector<int>{2, 3}));
  const std::string text = all_lines(d);
  EXPECT_NE(text.find("rank 1 arrived at dp #5"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 did not answer"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 never arrived: it has issued 4 operation(s) on dp, not #5 yet; nothing in flight"),
            std::string::npos)
      << text;
  EXPECT_EQ(d.lines.back(), "timeout in dp all_reduce #5 (10 f32); missing rank(s): 2, 3");
}

TEST(WatchdogReport, NamesARankThatCalledAnotherCollective) {
  const Diagnosis d = diagnose(stuck_dp(3), {at_dp(4, 3, "all_gather", 20)});
  EXPECT_EQ(d.missing, (std::vector<int>{4}));
  EXPECT_NE(all_lines(d).find("the ranks call different collectives"), std::string::npos) << all_lines(d);
}

// Each member of an all_to_all_v sends its own number of elements: no mismatch, and the silent
// rank is the one missing (the CI failure of multirank_ep_training_kill_stop).
TEST(WatchdogReport, AllToAllVCountsMayDifferBetweenRanks) {
  CollectiveRecord stuck = stuck_dp(3);
  stuck.op = "all_to_all_v", stuck.count = 1056;
  const Diagnosis d =
      diagnose(stuck, {at_dp(0, 3, "all_to_all_v", 1184), PeerStatus{2, false, {}, {}}, at_dp(3, 3, "all_to_all_v", 768)});
  EXPECT_EQ(d.missing, (std::vector<int>{2}));
  EXPECT_EQ(all_lines(d).find("different collectives"), std::string::npos) << all_lines(d);
  EXPECT_NE(diagnose(stuck, {at_dp(0, 3, "all_to_all", 1056)}).missing, std::vector<int>{}) << "op still compared";
}

TEST(WatchdogReport, EveryoneArrivedMeansNoMissingRank) {
  const Diagnosis d = diagnose(stuck_dp(2), {at_dp(0, 2), at_dp(1, 3)});
  EXPECT_TRUE(d.missing.empty());
  EXPECT_NE(d.lines.back().find("no rank is missing"), std::string::npos);
}

TEST(WatchdogReport, PointToPointNamesPeersThatPostNothing) {
  CollectiveRecord stuck;
  stuck.group = "pp", stuck.p2p = true, stuck.seq = 4, stuck.op = "batch_p2p";
  CollectiveLog busy_log(4);
  busy_log.begin("pp", true, "batch_p2p", 1, DType::f32);
  const PeerStatus busy = decode_status(encode_status(1, busy_log));
  const Diagnosis d = diagnose(stuck, {busy, at_dp(3, 2)});
  EXPECT_EQ(d.missing, (std::vector<int>{3}));
  EXPECT_TRUE(diagnose(stuck, {busy}).lines.back().find("do not match") != std::string::npos);
}

TEST(Watchdog, PolledWorkEndsItsRecord) {
  WatchdogOptions options;
  options.timeout_seconds = 30;
  Watchdog dog(MPI_COMM_NULL, options);
  std::atomic<bool> finished{false};
  const CollectiveRecord r = dog.log().begin("tp", false, "all_reduce", 4, DType::f32);
  dog.watch(r, 30, {}, [&] { return finished.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(dog.log().recent(1)[0].in_flight());
  finished = true;
  for (int i = 0; i < 200 && dog.log().recent(1)[0].in_flight(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(dog.log().recent(1)[0].in_flight());
}

TEST(Watchdog, RejectsANonPositiveTimeout) {
  WatchdogOptions options;
  options.timeout_seconds = 0;
  EXPECT_NE(
      megatron::testing::error_of([&] { Watchdog dog(MPI_COMM_NULL, options); }).find("--distributed-timeout-minutes"),
      std::string::npos);
}

// A wait past its deadline ends the process with the record of this rank.
TEST(WatchdogDeathTest, TimeoutPrintsTheLogAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        WatchdogOptions options;
        options.timeout_seconds = 0.2;
        Watchdog dog(MPI_COMM_NULL, options);
        dog.log().end(dog.log().begin("dp", false, "all_gather", 6, DType::bf16));
        const CollectiveRecord r = dog.log().begin("dp", false, "all_reduce", 4, DType::f32);
        Watchdog::Scope wait(dog, r, 0.2, {});
        std::this_thread::sleep_for(std::chrono::seconds(10));
      },
      ::testing::ExitedWithCode(1),
      "error: dp all_reduce #2 \\(4 f32\\) did not complete within 0.2 s(.|\n)*dp all_gather #1(.|\n)*aborting");
}
