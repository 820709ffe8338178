// multirank-np: 2 4
// Pipeline communication and gradient reduction overlapped with compute, in `megatron train`'s
// loop (f64, the models of test_pp_training.cpp, 10 iterations and a validation):
//   - every interleaved run overlaps its sends and receives on the pipeline channels (Megatron's
//     default); 2 ranks: PP=2 x V=2 in groups of 4 micro-batches (larger than the pipeline: only
//     the overlapped p2p runs them; both styles) and blocking (--no-overlap-p2p-communication);
//     4 ranks: GPT (tied) with the distributed optimizer and --overlap-grad-reduce, PP=2 x DP=2
//     in buckets of 2000 elements with the parameter gather overlapped too, and PP=2 x V=2 x DP=2
//     in Megatron's default buckets (each chunk's own, the tied embedding alone): each on the
//     single-rank curve within 200 u (test_pp_training.cpp derives it);
//   - the overlap moves when tensors travel and reductions start, never what is summed in which
//     order, so overlapped and blocking runs agree bit for bit: 2 ranks, overlapped p2p (also in
//     groups of 4) against blocking; 4 ranks, the overlapped reduction against none (GPT, tied,
//     distributed optimizer; PP=2 x DP=2 and PP=2 x V=2 x DP=2). Interleaved, the collective
//     ledger of one iteration shows the overlapped reduction's first reduce-scatter issued between
//     the first and the last gradient transfer (chunk 1's buckets, while chunk 0's backwards still
//     run), and the blocking one's after; without interleaving the one chunk's last backward is
//     the rank's last action, so there is nothing to see.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/parallel/watchdog.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kIterations = 10;
const std::vector<std::string> interleaved = pp2_interleaved_flags();
// All 4 micro-batches of a step (2 ranks) in one group, larger than the pipeline.
const std::vector<std::string> groups_of_4 = {"--microbatch-group-size-per-virtual-pipeline-stage", "4"};
const std::vector<std::string> blocking_p2p = {"--no-overlap-p2p-communication"};
const std::vector<std::string> dist_opt_overlapped = {"--use-distributed-optimizer", "--overlap-grad-reduce"};

TEST(PpOverlap, EveryLayoutFollowsTheSingleRank) {
  using enum ModelStyle;
  std::vector<PpLayout> layouts;
  if (make_state({}).ctx.world->size() == 2)
    layouts = {{"PP=2 x V=2 groups of 4", gpt, {.pp = 2}, with(interleaved, groups_of_4)},
               {"PP=2 x V=2 groups of 4", llama, {.pp = 2}, with(interleaved, groups_of_4)},
               {"PP=2 x V=2 blocking p2p", gpt, {.pp = 2}, with(interleaved, blocking_p2p)}};
  else
    layouts = {{"PP=2 x DP=2 distributed optimizer, overlapped reduce and gather, small buckets",
                gpt,
                {.pp = 2},
                with({"--pipeline-model-parallel-size", "2", "--overlap-param-gather", "--ddp-bucket-size", "2000"},
                     dist_opt_overlapped)},
               {"PP=2 x V=2 x DP=2 distributed optimizer, overlapped reduce",
                gpt,
                {.pp = 2},
                with(interleaved, dist_opt_overlapped)}};
  expect_pp_layouts_follow_the_single_rank(layouts, kIterations, 200 * 0x1p-53);
}

// The same run twice, one blocking and one overlapped.
struct OverlapPair {
  std::string name;
  ModelStyle style;
  ParallelSizes sizes;
  std::vector<std::string> blocking, overlapped;
  std::string reduction_group;  // the DP reductions the ledger should see start early; "": none
};

// Whether this rank's ledger shows a reduce-scatter or all-reduce on `group` issued between its
// first and its last pipeline gradient transfer, i.e. during the backwards (a one-iteration run:
// set-up comes before, logging and validation after).
bool reduction_starts_before_the_last_gradient(const CollectiveLog& log, const std::string& group) {
  const std::vector<CollectiveRecord> records = log.recent(SIZE_MAX);
  uint64_t first_gradient = UINT64_MAX, last_gradient = 0;
  for (const CollectiveRecord& r : records)
    if (r.group == "pp_grads" || r.group == "pp_grad") {
      first_gradient = std::min(first_gradient, r.id);
      last_gradient = std::max(last_gradient, r.id);
    }
  for (const CollectiveRecord& r : records)
    if (r.id > first_gradient && r.id < last_gradient && r.group.find(group) != std::string::npos &&
        (r.op.starts_with("reduce_scatter") || r.op.starts_with("all_reduce")))
      return true;
  return false;
}

TEST(PpOverlap, OverlapIsBitIdentical) {
  using enum ModelStyle;
  std::vector<OverlapPair> pairs;
  const std::vector<std::string> blocking = with(interleaved, blocking_p2p);
  if (make_state({}).ctx.world->size() == 2)
    pairs = {{"PP=2 x V=2 p2p", gpt, {.pp = 2}, blocking, interleaved, ""},
             {"PP=2 x V=2 p2p", llama, {.pp = 2}, blocking, interleaved, ""},
             {"PP=2 x V=2 p2p in groups of 4", gpt, {.pp = 2}, blocking, with(interleaved, groups_of_4), ""}};
  else
    pairs = {{"PP=2 x DP=2 distributed optimizer reduction",
              gpt,
              {.pp = 2},
              {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"},
              with({"--pipeline-model-parallel-size", "2"}, dist_opt_overlapped),
              ""},
             {"PP=2 x V=2 x DP=2 distributed optimizer reduction",
              gpt,
              {.pp = 2},
              with(interleaved, {"--use-distributed-optimizer"}),
              with(interleaved, dist_opt_overlapped),
              "dp"}};
  for (const OverlapPair& pair : pairs) {
    const std::string what = std::string(style_name(pair.style)) + " " + pair.name;
    TrainingSummary runs[2];
    bool early[2] = {false, false};
    for (int overlapped = 0; overlapped < 2; ++overlapped) {
      ParallelOptions options;
      options.timeout_seconds = 60;
      options.pipeline_channels = true;
      options.log_capacity = 1 << 16;  // every record of the runs below
      options.mpi = mpi_runtime();
      const std::vector<std::string>& flags = overlapped ? pair.overlapped : pair.blocking;
      {
        const ParallelState st = initialize_parallel(pair.sizes, options);
        runs[overlapped] = run_f64(st.ctx, with(tiny_pp_run(pair.style, kIterations), flags));
      }
      if (pair.reduction_group.empty()) continue;
      const ParallelState one = initialize_parallel(pair.sizes, options);
      run_f64(one.ctx, with(tiny_pp_run(pair.style, 1), flags));
      early[overlapped] = reduction_starts_before_the_last_gradient(one.watchdog->log(), pair.reduction_group);
    }
    EXPECT_EQ(runs[0].train_losses, runs[1].train_losses) << what;
    EXPECT_EQ(runs[0].grad_norms, runs[1].grad_norms) << what;
    EXPECT_EQ(runs[0].valid_losses, runs[1].valid_losses) << what;
    if (!pair.reduction_group.empty()) {
      EXPECT_FALSE(early[0]) << what << ": a reduction started during backward without --overlap-grad-reduce";
      EXPECT_TRUE(early[1]) << what << ": no bucket started reducing before the last gradient arrived";
    }
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
