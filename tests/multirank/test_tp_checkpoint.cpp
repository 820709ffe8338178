// multirank-np: 2 4
// The training loop under tensor parallelism, and checkpoints that change the TP size. For a
// GPT-2-style and a LLaMA-style model (dropout on), with `megatron train`'s own loop (data sliced
// by DP rank, finalize_model_grads, the TP-aware gradient norm, validation):
//   - a run at TP=2 with sequence parallelism (4 ranks: TP=2 x DP=2 with SP and the distributed
//     optimizer) follows the single-rank loss and gradient-norm curve, saves at iteration 10, and
//     the single rank resumes that checkpoint on the same curve (TP=2 -> TP=1);
//   - a single-rank checkpoint of iteration 10 resumes at TP=2 with the distributed optimizer
//     (4 ranks: TP=4 with SP) on the same curve (TP=1 -> TP=N).
// Every TP rank saves its shards with their global offsets and the replicated parameters once, so
// weights and Adam state reshard by reading global slices; the padded vocabulary (128 rows) is
// the same at every TP here (--make-vocab-size-divisible-by 32).
//
// Tolerance 200 u (u = 2^-24), relative, as in test_tp_training.cpp: the layouts differ from the
// single rank only in the order of fp32 sums (measured there: a few u on the loss, ~10 u on the
// norm).
#include <memory>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr double kTolerance = 200 * 0x1p-24;

// The first n iterations of a run (validation every 10 iterations).
TrainingSummary first_iterations(const TrainingSummary& s, size_t n) {
  TrainingSummary out = s;
  out.train_losses.resize(n);
  out.grad_norms.resize(n);
  out.valid_losses.resize(n / 10);
  return out;
}

void expect_same_curve(const TrainingSummary& single, const TrainingSummary& s, size_t first, const std::string& what) {
  expect_close(single.train_losses, s.train_losses, first, kTolerance, what + " loss");
  expect_close(single.grad_norms, s.grad_norms, first, kTolerance, what + " grad norm");
}

void save_at_one_tp_size_resume_at_another(ModelStyle style) {
  const int world = int(make_state({}).ctx.world->size());
  const std::string kind = std::string(style_name(style)) + " ";
  const TrainingSummary straight = train_single_rank(tiny_tp_run(style, 20));
  ASSERT_EQ(straight.valid_losses.size(), 2u);

  std::unique_ptr<TempDir> owner;
  std::string dir;
  {
    // TP=2 (x DP=2 on 4 ranks) with SP saves; the single rank resumes.
    const ParallelState st = make_state({.tp = 2}, 60);
    if (st.ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
    dir = shared_directory(owner.get());
    const std::vector<std::string> layout = tp_flags(2, true, world == 4);
    const std::string name = kind + "TP=2 DP=" + std::to_string(world / 2) + " SP";
    const TrainingSummary first =
        train_on(st.ctx, with(tiny_tp_run(style, 10), with(layout, {"--save", dir + "/tp2", "--save-interval", "10"})));
    const TrainingSummary straight_10 = first_iterations(straight, 10);
    expect_same_curve(straight_10, first, 0, name);
    // Validation at iteration 10 of the sharded model.
    expect_close(straight_10.valid_losses, first.valid_losses, 0, kTolerance, name + " validation loss");
    st.ctx.world->barrier();
  }
  const TrainingSummary resumed = train_single_rank(with(tiny_tp_run(style, 20), {"--load", dir + "/tp2"}));
  expect_same_curve(straight, resumed, 10, kind + "TP=2 -> TP=1");

  {
    // The single rank saves; TP=2 with the distributed optimizer (TP=4 with SP on 4 ranks) resumes.
    const int tp = world;
    const ParallelState st = make_state({.tp = tp}, 60);
    if (st.ctx.world->rank() == 0)
      train_single_rank(with(tiny_tp_run(style, 10), {"--save", dir + "/tp1", "--save-interval", "10"}));
    st.ctx.world->barrier();
    const TrainingSummary wide =
        train_on(st.ctx, with(tiny_tp_run(style, 20), with(tp_flags(tp, tp == 4, tp == 2), {"--load", dir + "/tp1"})));
    expect_same_curve(straight, wide, 10, kind + "TP=1 -> TP=" + std::to_string(tp));
    st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
  }
}

TEST(TpCheckpoint, GptStyleResumesAtAnotherTpSize) { save_at_one_tp_size_resume_at_another(ModelStyle::gpt); }

TEST(TpCheckpoint, LlamaStyleResumesAtAnotherTpSize) { save_at_one_tp_size_resume_at_another(ModelStyle::llama); }

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
