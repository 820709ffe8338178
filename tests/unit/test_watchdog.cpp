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

PeerStatus silent(int rank) {
  PeerStatus p;
  p.world_rank = rank;
  return p;
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
  EXPECT_TRUE(p.waits_on.empty());
  EXPECT_EQ(decode_status(encode_status(7, log, {1, 12})).waits_on, (std::vector<int>{1, 12}));
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
  const Diagnosis d = diagnose(stuck_dp(5), {at_dp(0, 4), at_dp(1, 5), silent(2)});
  EXPECT_EQ(d.missing, (std::vector<int>{2}));
  EXPECT_EQ(d.lines.back(),
            "timeout in dp all_reduce #5 (10 f32); rank(s) 0 wait in other operations, held up; missing rank(s): 2");
  // With every rank answering, the held-up rank is the one to look at.
  EXPECT_EQ(diagnose(stuck_dp(5), {at_dp(0, 4), at_dp(1, 5)}).missing, (std::vector<int>{0}));
}

TEST(WatchdogReport, NamesRanksThatNeverAnsweredOrArrived) {
  const Diagnosis d = diagnose(stuck_dp(5), {at_dp(1, 5), silent(2), idle_at_dp(3, 4)});
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
  const Diagnosis d = diagnose(stuck, {at_dp(0, 3, "all_to_all_v", 1184), silent(2), at_dp(3, 3, "all_to_all_v", 768)});
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

// A pipeline whose middle stage stopped (the kill test's layout E|t|t|L, rank 2 stopped): rank 3
// times out in the embedding all-reduce that rank 0 has not reached, since rank 0 waits on rank 1's
// send, and rank 1 on rank 2's. Rank 0 alone is not the answer: its chain of waits is followed,
// one round of questions per link, to the rank that never answered.
namespace {

// A rank inside a point-to-point batch on pp (after `embedding_issued` embedding all-reduces)
// whose watched operations wait on `waits_on`.
PeerStatus in_pp_batch(int rank, uint64_t embedding_issued, const std::vector<int>& waits_on) {
  CollectiveLog log(8);
  for (uint64_t i = 0; i < embedding_issued; ++i) log.end(log.begin("embedding", false, "all_reduce", 10, DType::f32));
  log.begin("pp", true, "batch_p2p", 4, DType::f32, "recv<-1");
  return decode_status(encode_status(rank, log, waits_on));
}

CollectiveRecord stuck_embedding(uint64_t seq) {
  CollectiveRecord r = stuck_dp(seq);
  r.group = "embedding";
  return r;
}

}  // namespace

TEST(WatchdogReport, FollowsAChainOfWaitsToTheRankThatHoldsIt) {
  const CollectiveRecord stuck = stuck_embedding(5);
  const std::vector<PeerStatus> peers{in_pp_batch(0, 4, {1})};
  // Rank 3 (this rank) asks rank 0; rank 0 is behind inside a batch waiting on rank 1: ask 1.
  EXPECT_EQ(ranks_to_follow(stuck, peers, {}, 3), (std::vector<int>{1}));
  std::vector<PeerStatus> followed{in_pp_batch(1, 5, {0, 2})};
  // Rank 1 waits on 0 (asked already) and 2.
  EXPECT_EQ(ranks_to_follow(stuck, peers, followed, 3), (std::vector<int>{2}));
  followed.push_back(silent(2));
  EXPECT_TRUE(ranks_to_follow(stuck, peers, followed, 3).empty());

  const Diagnosis d = diagnose(stuck, peers, followed);
  EXPECT_EQ(d.missing, (std::vector<int>{2}));
  EXPECT_NE(all_lines(d).find("rank 0 is held up by rank 2, which did not answer (0 waits on 1, 1 on 2)"),
            std::string::npos)
      << all_lines(d);
  EXPECT_EQ(d.lines.back(),
            "timeout in embedding all_reduce #5 (10 f32); rank(s) 0 wait in other operations, held up; missing "
            "rank(s): 2");
  // Without the chain, rank 0 is the one named (what the kill test's rank 3 printed before).
  EXPECT_EQ(diagnose(stuck, peers).missing, (std::vector<int>{0}));
  // A chain may end at a rank that answers with nothing in flight (busy outside communication).
  followed.back() = idle_at_dp(2, 1);
  EXPECT_EQ(diagnose(stuck, peers, followed).missing, (std::vector<int>{2}));
  EXPECT_NE(all_lines(diagnose(stuck, peers, followed)).find("rank 2, which has nothing in flight"), std::string::npos);
}

// Rank 0 times out receiving from rank 1, which is in a batch on the same group that also waits on
// the stopped rank 2: before, every peer being in a batch read as sends and receives that do not
// match.
TEST(WatchdogReport, FollowsAPointToPointPeerThatWaitsOnAnotherRank) {
  CollectiveRecord stuck;
  stuck.group = "pp", stuck.p2p = true, stuck.seq = 40, stuck.op = "batch_p2p";
  const std::vector<PeerStatus> peers{in_pp_batch(1, 5, {0, 2})};
  EXPECT_EQ(ranks_to_follow(stuck, peers, {}, 0), (std::vector<int>{2}));
  EXPECT_NE(diagnose(stuck, peers).lines.back().find("do not match"), std::string::npos);
  const Diagnosis d = diagnose(stuck, peers, {silent(2)});
  EXPECT_EQ(d.missing, (std::vector<int>{2}));
  EXPECT_EQ(d.lines.back(),
            "timeout in pp p2p batch_p2p #40 (0 f32); rank(s) 1 wait in other operations, held up; "
            "missing rank(s): 2");
}

// Waits that go round (0 on 1, 1 on 0) end nowhere: the held-up rank is named, as without
// following, and the questions stop.
TEST(WatchdogReport, AChainThatGoesRoundNamesTheHeldUpRank) {
  const CollectiveRecord stuck = stuck_embedding(5);
  const std::vector<PeerStatus> peers{in_pp_batch(0, 4, {1})};
  const std::vector<PeerStatus> followed{in_pp_batch(1, 5, {0})};
  EXPECT_TRUE(ranks_to_follow(stuck, peers, followed, 3).empty());
  EXPECT_EQ(diagnose(stuck, peers, followed).missing, (std::vector<int>{0}));
}
