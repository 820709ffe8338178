// The per-rank ring of communication records the watchdog prints and reports.
#include <gtest/gtest.h>

#include "megatron/parallel/collective_log.h"
#include "test_util.h"

using namespace megatron;

TEST(CollectiveLog, NumbersOperationsPerGroupAndKind) {
  CollectiveLog log(8);
  const CollectiveRecord a = log.begin("dp", false, "all_reduce", 10, DType::f32);
  const CollectiveRecord b = log.begin("tp", false, "all_gather", 4, DType::bf16);
  const CollectiveRecord c = log.begin("dp", false, "reduce_scatter", 8, DType::f32);
  const CollectiveRecord d = log.begin("dp", true, "batch_p2p", 3, DType::f32, "send->1");
  EXPECT_EQ(a.id, 1u);
  EXPECT_EQ(d.id, 4u);
  EXPECT_EQ(a.seq, 1u);
  EXPECT_EQ(b.seq, 1u);
  EXPECT_EQ(c.seq, 2u);
  EXPECT_EQ(d.seq, 1u) << "point-to-point operations are counted apart from collectives";
  EXPECT_TRUE(c.in_flight());
}

TEST(CollectiveLog, RingKeepsTheLastRecordsOldestFirst) {
  CollectiveLog log(3);
  for (int i = 0; i < 5; ++i) log.end(log.begin("dp", false, "all_reduce", i, DType::f32));
  const auto last = log.recent(10);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_EQ(last[0].seq, 3u);
  EXPECT_EQ(last[2].seq, 5u);
  EXPECT_FALSE(last[2].in_flight());
  ASSERT_EQ(log.recent(2).size(), 2u);
  EXPECT_EQ(log.recent(2)[0].seq, 4u);
  EXPECT_TRUE(CollectiveLog(4).recent(4).empty());
}

TEST(CollectiveLog, ProgressCountsRecordsThatLeftTheRing) {
  CollectiveLog log(2);
  const CollectiveRecord first = log.begin("dp", false, "all_reduce", 1, DType::f32);
  log.begin("tp", false, "all_reduce", 1, DType::f32);
  const CollectiveRecord third = log.begin("tp", false, "all_reduce", 1, DType::f32);
  log.end(first);  // evicted already: only its group's count moves
  const auto progress = log.progress();
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].group, "dp");
  EXPECT_EQ(progress[0].issued, 1u);
  EXPECT_EQ(progress[0].completed, 1u);
  EXPECT_EQ(progress[1].issued, 2u);
  EXPECT_EQ(progress[1].completed, 0u);
  EXPECT_EQ(progress[1].last.id, third.id);
  const auto open = log.in_flight();
  ASSERT_EQ(open.size(), 2u);
  EXPECT_EQ(open[1].id, third.id);
}

TEST(CollectiveLog, RejectsDoubleCompletionAndZeroCapacity) {
  CollectiveLog log(4);
  const CollectiveRecord r = log.begin("pp", false, "barrier", 0, DType::f32);
  log.end(r);
  EXPECT_NE(megatron::testing::error_of([&] { log.end(r); }).find("completed twice"), std::string::npos);
  EXPECT_NE(megatron::testing::error_of([] { CollectiveLog none(0); }).find("capacity 0"), std::string::npos);
}

TEST(CollectiveLog, FormatsWhatRanksCompare) {
  CollectiveLog log(4);
  CollectiveRecord r = log.begin("dp/dp_cp", false, "all_reduce", 100, DType::bf16, "op avg");
  EXPECT_EQ(record_name(r), "dp/dp_cp all_reduce #1 (100 bf16; op avg)");
  const std::string line = format_record(r, r.start + 2.5);
  EXPECT_NE(line.find("#1 dp/dp_cp all_reduce #1 (100 bf16; op avg) at "), std::string::npos) << line;
  EXPECT_NE(line.find("in flight for 2.500 s"), std::string::npos) << line;
  r.end = r.start + 0.25;
  EXPECT_NE(format_record(r, 0).find("done in 0.250 s"), std::string::npos);
  const CollectiveRecord p = log.begin("pp", true, "batch_p2p", 6, DType::f32, "send->3 recv<-1");
  EXPECT_EQ(record_name(p), "pp p2p batch_p2p #1 (6 f32; send->3 recv<-1)");
}
