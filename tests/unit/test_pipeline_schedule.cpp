// Pipeline schedules (pipeline_parallel/schedule.h) read as data: Megatron's orders worked out by
// hand from its rules (megatron-compat.md §8), each micro-batch's forward and backward once per
// chunk, the ranks' lists fitting together (simulated sends and receives), activations in flight as
// Megatron bounds them, and the bubble of a simulated run against the textbook formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_simulation.h"

using namespace megatron;
using namespace megatron::pipeline_parallel;

namespace {

// Compute actions only, as "F<mb>.<chunk>" / "B<mb>.<chunk>" joined by spaces.
std::string compute_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions)
    if (is_compute(a.kind)) s += (s.empty() ? "" : " ") + to_string(a);
  return s;
}

std::string full_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) s += (s.empty() ? "" : " ") + to_string(a);
  return s;
}

// Every valid shape with P <= 8, V <= 3, M <= 16 (and forward-only), blocking and overlapped; the
// overlapped interleaved ones also with every group size N from P to M (N > P needs overlap), for
// the sweeping tests.
std::vector<ScheduleShape> valid_shapes() {
  std::vector<ScheduleShape> shapes;
  for (int64_t p : {1, 2, 3, 4, 8})
    for (int64_t v : {1, 2, 3})
      for (int64_t m = 1; m <= 16; ++m)
        for (bool fwd : {false, true})
          for (bool overlap : {false, true})
            for (int64_t n = p; n <= (overlap && v > 1 ? m : p); ++n) {
              const ScheduleShape s{.pipeline_size = p,
                                    .virtual_stages = v,
                                    .microbatches = m,
                                    .microbatch_group_size = n,
                                    .forward_only = fwd,
                                    .overlap_p2p = overlap};
              if (validate(s).empty()) shapes.push_back(s);
            }
  return shapes;
}

std::string shape_string(const ScheduleShape& s) {
  return concat("P", s.pipeline_size, " V", s.virtual_stages, " M", s.microbatches, " N", s.group_size(),
                s.overlap_p2p ? " overlapped" : "", s.forward_only ? " forward-only" : "");
}

}  // namespace

TEST(PipelineSchedule, OneFOneBOrderIsMegatrons) {
  // P=4, M=6: rank r warms up with min(P-r-1, M) forwards, then alternates, then cools down.
  const ScheduleShape s{.pipeline_size = 4, .microbatches = 6};
  EXPECT_EQ(compute_string(build_schedule(s, 0)), "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(compute_string(build_schedule(s, 1)), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 F5.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(compute_string(build_schedule(s, 3)), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
  // Fewer micro-batches than warm-up slots: every forward first.
  EXPECT_EQ(compute_string(build_schedule({.pipeline_size = 4, .microbatches = 2}, 0)), "F0.0 F1.0 B0.0 B1.0");
}

TEST(PipelineSchedule, OneFOneBCommunicationPairsAsMegatron) {
  // P=2, M=3: the steady state pairs the send of a forward's output with the receive of the next
  // backward's gradient (send_forward_recv_backward) and the reverse after a backward.
  const ScheduleShape s{.pipeline_size = 2, .microbatches = 3};
  EXPECT_EQ(full_string(build_schedule(s, 0)),
            "F0.0 sendA0.0->1 F1.0 sendA1.0->1 recvG0.0<-1 B0.0 F2.0 sendA2.0->1 recvG1.0<-1 B1.0 recvG2.0<-1 B2.0");
  EXPECT_EQ(full_string(build_schedule(s, 1)),
            "recvA0.0<-0 F0.0 B0.0 sendG0.0->0 recvA1.0<-0 F1.0 B1.0 sendG1.0->0 recvA2.0<-0 F2.0 B2.0 sendG2.0->0");
}

TEST(PipelineSchedule, InterleavedTableIsMegatrons) {
  // megatron-compat.md §8.2: P=2, N=3, M=5, V=2.
  const ScheduleShape s{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 5, .microbatch_group_size = 3};
  const std::vector<MicrobatchChunk> want{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                          {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  EXPECT_EQ(schedule_table(s), want);
}

TEST(PipelineSchedule, InterleavedOrderIsMegatrons) {
  // P=2, V=2, M=4, N=2: table (0,0)(1,0)(0,1)(1,1)(2,0)(3,0)(2,1)(3,1); warm-up 2(P-r-1)+(V-1)N;
  // steady step k runs forward k+W and backward k on chunk V-1-table[k].chunk.
  const ScheduleShape s{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 4};
  EXPECT_EQ(warmup_microbatches(s, 0), 4);
  EXPECT_EQ(warmup_microbatches(s, 1), 2);
  EXPECT_EQ(compute_string(build_schedule(s, 0)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(compute_string(build_schedule(s, 1)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

TEST(PipelineSchedule, ForwardOnlyRunsEveryForwardInTableOrder) {
  const ScheduleShape s{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 4, .forward_only = true};
  EXPECT_EQ(compute_string(build_schedule(s, 1)), "F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 F2.1 F3.1");
  EXPECT_EQ(full_string(build_schedule({.pipeline_size = 2, .microbatches = 2, .forward_only = true}, 1)),
            "recvA0.0<-0 F0.0 recvA1.0<-0 F1.0");
}

TEST(PipelineSchedule, EveryForwardAndBackwardOncePerChunkInDependencyOrder) {
  for (const ScheduleShape& s : valid_shapes())
    for (int64_t r = 0; r < s.pipeline_size; ++r) {
      const std::vector<Action> actions = build_schedule(s, r);
      // Received activations and gradients apart: overlapped, a backward's gradient may arrive
      // before the forward of the same (micro-batch, chunk) runs.
      std::set<std::pair<int64_t, int64_t>> forwards, backwards, activations, grads;
      for (const Action& a : actions) {
        const std::pair key{a.microbatch, a.chunk};
        const std::string where = concat(shape_string(s), " rank ", r, ": ", to_string(a));
        if (a.kind == ActionKind::kRecvActivation) activations.insert(key);
        if (a.kind == ActionKind::kRecvGrad) grads.insert(key);
        if (a.kind == ActionKind::kForward) {
          EXPECT_TRUE(forwards.insert(key).second) << where << " twice";
          EXPECT_EQ(activations.erase(key), s.is_first_stage(r, a.chunk) ? 0u : 1u) << where << " without its input";
        }
        if (a.kind == ActionKind::kBackward) {
          EXPECT_TRUE(forwards.count(key)) << where << " before its forward";
          EXPECT_TRUE(backwards.insert(key).second) << where << " twice";
          EXPECT_EQ(grads.erase(key), s.is_last_stage(r, a.chunk) ? 0u : 1u) << where << " without its gradient";
        }
      }
      const size_t per_rank = size_t(s.microbatches * s.virtual_stages);
      EXPECT_EQ(forwards.size(), per_rank);
      EXPECT_EQ(backwards.size(), s.forward_only ? 0u : per_rank);
      EXPECT_TRUE(activations.empty() && grads.empty());
    }
}

TEST(PipelineSchedule, RanksFitTogetherWithoutDeadlock) {
  // The simulation throws on a deadlock or on a send meeting another micro-batch's receive.
  // Overlapped shapes include groups larger than the pipeline (P=2, V=2, N=3 and 4, ...), which
  // deadlock blocking batches: only sends completing in the background let them run.
  int64_t larger_groups = 0;
  for (const ScheduleShape& s : valid_shapes()) {
    EXPECT_NO_THROW(simulate(s, ActionCosts{})) << shape_string(s);
    larger_groups += s.group_size() > s.pipeline_size;
  }
  EXPECT_GT(larger_groups, 100);
}

TEST(PipelineSchedule, OverlappedSurvivesFirstUseWaitsOnGpus) {
  // On a GPU the first forward and backward of a chunk may wait for the whole device (set-up
  // calls), queued receive kernels included. Every overlapped shape, groups larger than P too,
  // stays live when they do: each posted receive depends only on work the rank has posted.
  int64_t overlapped = 0;
  for (const ScheduleShape& s : valid_shapes())
    if (s.overlap_p2p) {
      ++overlapped;
      EXPECT_NO_THROW(simulate(s, ActionCosts{}, ReceiveWait::kEveryPostedAtFirstUse)) << shape_string(s);
    }
  EXPECT_GT(overlapped, 500);
  // The placement that hung on two GPUs (the first backward's gradient received first of all, a
  // receive that needs rank 0's own forwards) deadlocks there as it did: each rank in its first
  // forward, rank 0 waiting for that gradient, rank 1 for rank 0's first activation. It runs when
  // only a compute action's own input is waited for (CPU ranks).
  const ScheduleShape s{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 4, .overlap_p2p = true};
  std::vector<std::vector<Action>> hung{build_schedule(s, 0), build_schedule(s, 1)};
  const auto first_grad = std::find_if(hung[0].begin(), hung[0].end(),
                                       [](const Action& a) { return a.kind == ActionKind::kRecvGrad; });
  ASSERT_NE(first_grad, hung[0].end());
  std::rotate(hung[0].begin(), first_grad, first_grad + 1);
  EXPECT_NO_THROW(simulate(s, hung, {}));
  try {
    simulate(s, hung, {}, ReceiveWait::kEveryPostedAtFirstUse);
    ADD_FAILURE() << "no deadlock reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks: rank 0 waits at F0.0; rank 1 waits at F0.0"), std::string::npos)
        << e.what();
  }
}

TEST(PipelineSchedule, OverlappedPlacementPostsEachReceiveOneActionAhead) {
  // 1F1B, P = 2, M = 2. Rank 0 computes F0 F1 B0 B1: the first backward's receive follows the
  // send of the forward it is the gradient of, B1's follows B0; its forwards read tokens and
  // receive nothing. Rank 1 computes F0 B0 F1 B1:
  // F1's receive follows F0, and each send follows the action that made it.
  const ScheduleShape s{.pipeline_size = 2, .microbatches = 2, .overlap_p2p = true};
  EXPECT_EQ(full_string(build_schedule(s, 0)), "F0.0 sendA0.0->1 recvG0.0<-1 F1.0 sendA1.0->1 B0.0 recvG1.0<-1 B1.0");
  EXPECT_EQ(full_string(build_schedule(s, 1)), "recvA0.0<-0 F0.0 recvA1.0<-0 B0.0 sendG0.0->0 F1.0 B1.0 sendG1.0->0");
  // Interleaved, P = 2, V = 2, M = 2: the steady pair (F, B) runs as two steps, the forward's
  // output sent before the backward beside it; rank 1 passes chunk 0's output to rank 0's chunk 1.
  const ScheduleShape inter{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 2, .overlap_p2p = true};
  EXPECT_EQ(compute_string(build_schedule(inter, 1)), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0");
  EXPECT_EQ(full_string(build_schedule(inter, 1)),
            "recvA0.0<-0 F0.0 sendA0.0->0 recvA1.0<-0 F1.0 sendA1.0->0 recvA0.1<-0 F0.1 recvA1.1<-0 B0.1 "
            "sendG0.1->0 F1.1 B1.1 sendG1.1->0 recvG0.0<-0 B0.0 sendG0.0->0 recvG1.0<-0 B1.0 sendG1.0->0");
}

TEST(PipelineSchedule, OverlapKeepsTheBubble) {
  // Without communication cost the overlapped placement computes in the same order as the
  // blocking one, so the simulated bubble is the same (P-1)/(M V); groups larger than P run too.
  for (int64_t p : {2, 4})
    for (int64_t v : {1, 2}) {
      const ScheduleShape s{.pipeline_size = p, .virtual_stages = v, .microbatches = 2 * p, .overlap_p2p = true};
      const double scale = 1.0 / double(v);
      EXPECT_NEAR(simulate(s, {.forward = scale, .backward = 2 * scale}).bubble_fraction(),
                  double(p - 1) / double(2 * p * v), 1e-12)
          << shape_string(s);
    }
  const ScheduleShape larger{
      .pipeline_size = 2, .virtual_stages = 2, .microbatches = 4, .microbatch_group_size = 4, .overlap_p2p = true};
  EXPECT_LT(simulate(larger, {.forward = 0.5, .backward = 1}).bubble_fraction(), 0.5);
}

TEST(PipelineSchedule, SimulationCatchesDeadlockAndMismatch) {
  const ScheduleShape s{.pipeline_size = 2, .microbatches = 3};
  std::vector<std::vector<Action>> lists{build_schedule(s, 0), build_schedule(s, 1)};
  // Rank 1 receiving micro-batch 1 where rank 0 sends micro-batch 0.
  std::vector<std::vector<Action>> mismatched = lists;
  mismatched[1][0].microbatch = 1;
  EXPECT_THROW(simulate(s, mismatched, {}), Error);
  // Rank 0 waiting for a gradient before sending the activation that produces it.
  std::vector<std::vector<Action>> stuck = lists;
  std::swap(stuck[0][0], stuck[0][1]);
  std::swap(stuck[0][0], stuck[0][4]);  // recvG0.0<-1 first
  try {
    simulate(s, stuck, {});
    ADD_FAILURE() << "no deadlock reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks: rank 0 waits at recvG0.0<-1"), std::string::npos) << e.what();
  }
}

TEST(PipelineSchedule, ActivationsInFlightBoundedAsMegatron) {
  for (const ScheduleShape& s : valid_shapes()) {
    const SimulatedPipeline run = simulate(s, ActionCosts{});
    for (int64_t r = 0; r < s.pipeline_size; ++r) {
      const int64_t total = s.microbatches * s.virtual_stages, warmup = warmup_microbatches(s, r);
      // Megatron holds the warm-up's forwards plus the steady state's one more.
      const int64_t want = s.forward_only ? total : std::min(warmup + 1, total);
      EXPECT_EQ(run.peak_in_flight[size_t(r)], want)
          << "P" << s.pipeline_size << " V" << s.virtual_stages << " M" << s.microbatches << " rank " << r;
    }
  }
  // 1F1B: min(P - r, M), independent of M once M >= P.
  EXPECT_EQ(peak_in_flight(build_schedule({.pipeline_size = 4, .microbatches = 16}, 0)), 4);
  EXPECT_EQ(peak_in_flight(build_schedule({.pipeline_size = 4, .microbatches = 16}, 3)), 1);
}

TEST(PipelineSchedule, SimulatedBubbleMatchesTheFormulas) {
  // Backward = 2 x forward, no communication cost: idle time over busy time is exactly (P-1)/M
  // for 1F1B and (P-1)/(M V) interleaved, whose chunks cost 1/V of a stage. The costs are small
  // integers over V, so the times add exactly in binary only for V a power of two; 1e-12 covers
  // the rounding of the others.
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {p, 2 * p, 4 * p}) {
      const SimulatedPipeline run = simulate({.pipeline_size = p, .microbatches = m}, {.forward = 1, .backward = 2});
      EXPECT_NEAR(run.bubble_fraction(), double(p - 1) / double(m), 1e-12) << "1F1B P" << p << " M" << m;
      for (int64_t v : {2, 4}) {
        const ScheduleShape s{.pipeline_size = p, .virtual_stages = v, .microbatches = m};
        const SimulatedPipeline inter = simulate(s, {.forward = 1.0 / double(v), .backward = 2.0 / double(v)});
        EXPECT_NEAR(inter.bubble_fraction(), double(p - 1) / double(m * v), 1e-12)
            << "interleaved P" << p << " V" << v << " M" << m;
      }
    }
}

TEST(PipelineSchedule, MeasuredCostsPerStageFeedTheSimulation) {
  // 1F1B, P = 2, M = 2; stage 0 costs forward 1, backward 2; stage 1 (say the output layer and
  // loss) 3 and 6; no communication cost. Worked by hand:
  //   rank 0: F0 [0,1], sends A0 (met at 1), F1 [1,2], sends A1 / waits for G0 until rank 1's B0
  //           ends at 10, B0 [10,12], waits for G1 until 19, B1 [19,21];
  //   rank 1: receives A0 at 1, F0 [1,4], B0 [4,10], sends G0 / receives A1 at 10, F1 [10,13],
  //           B1 [13,19], sends G1 at 19.
  // Makespan 21; the busiest rank (1) computes 18, so the bubble is 3/18. With both stages at
  // rank 1's costs the formula's (P-1)/M = 1/2 holds instead: the cheap stage hides its idle time.
  const ActionCosts measured{.forward_by_stage = {1, 3}, .backward_by_stage = {2, 6}};
  const SimulatedPipeline run = simulate({.pipeline_size = 2, .microbatches = 2}, measured);
  EXPECT_EQ(run.makespan(), 21);
  EXPECT_EQ(run.busy, (std::vector<double>{6, 18}));
  EXPECT_DOUBLE_EQ(run.bubble_fraction(), 3.0 / 18.0);
  const SimulatedPipeline even =
      simulate({.pipeline_size = 2, .microbatches = 2}, {.forward_by_stage = {3, 3}, .backward_by_stage = {6, 6}});
  EXPECT_DOUBLE_EQ(even.bubble_fraction(), 0.5);
  // Interleaved: virtual stage chunk·P + rank picks its own cost (P = 2, V = 2: four stages).
  const ScheduleShape inter{.pipeline_size = 2, .virtual_stages = 2, .microbatches = 4};
  const SimulatedPipeline four = simulate(inter, {.forward_by_stage = {1, 1, 1, 1}, .backward_by_stage = {2, 2, 2, 2}});
  EXPECT_NEAR(four.bubble_fraction(), 1.0 / 8.0, 1e-12);  // (P-1)/(M V) at equal costs
  EXPECT_THROW(simulate(inter, {.forward_by_stage = {1, 1}, .backward_by_stage = {2, 2}}), Error);
}

TEST(PipelineSchedule, ImpossibleShapesAreNamed) {
  auto message = [](const ScheduleShape& s) {
    const auto errors = validate(s);
    return errors.empty() ? std::string() : errors.front();
  };
  // Megatron's default group size is P: 6 micro-batches on 4 ranks leave a group of 2.
  EXPECT_NE(message({.pipeline_size = 4, .virtual_stages = 2, .microbatches = 6}).find("last group of 2"),
            std::string::npos);
  EXPECT_NE(message({.pipeline_size = 4, .virtual_stages = 2, .microbatches = 3}).find("group size <= micro-batches"),
            std::string::npos);
  EXPECT_NE(message({.pipeline_size = 1, .virtual_stages = 2, .microbatches = 4}).find("more than one pipeline rank"),
            std::string::npos);
  EXPECT_TRUE(
      validate({.pipeline_size = 4, .virtual_stages = 2, .microbatches = 8, .microbatch_group_size = 4}).empty());
  // Groups larger than the pipeline deadlock blocking batches (RanksFitTogetherWithoutDeadlock
  // found it before the rule).
  EXPECT_NE(message({.pipeline_size = 3, .virtual_stages = 2, .microbatches = 8, .microbatch_group_size = 4})
                .find("leave the group size at its default, 3"),
            std::string::npos);
  EXPECT_TRUE(
      validate(
          {.pipeline_size = 3, .virtual_stages = 2, .microbatches = 8, .microbatch_group_size = 4, .overlap_p2p = true})
          .empty());
  EXPECT_TRUE(validate({.pipeline_size = 4, .microbatches = 3}).empty());  // 1F1B takes any M
  EXPECT_THROW(build_schedule({.pipeline_size = 4, .virtual_stages = 2, .microbatches = 6}, 0), Error);
}
