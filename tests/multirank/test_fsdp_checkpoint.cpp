// multirank-np: 2 4
// Megatron FSDP's checkpoints reshard (GPT-2 style, 10 iterations, saved at 5): saved with
// optim_grads_params at DP = the world (each rank writes its weight and optimizer shards as boxes
// of the global tensors; the saving run itself on the single-rank curve) and resumed on one process
// without FSDP, in bf16 and fp32; in fp32 also resumed at DP = the world with optim_grads and
// (4 ranks) at TP=2 x DP=2 with optim_grads_params, and saved on one process without FSDP and
// resumed with optim_grads_params. Each
// on the uninterrupted single-rank curve within 200 fp32 u (the PP tests' checkpoint tolerance:
// the layouts sum in other orders) or, in bf16, 1e-3 (test_dp_training's: masters a few ulp apart
// may round to neighbouring bf16 values).
#include <memory>
#include <string>
#include <vector>

#include "multirank/fsdp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr int64_t kSavedAt = 5;

TEST(FsdpCheckpoint, ReshardsToAndFromOtherLayouts) {
  const ParallelState st = make_state({}, 60);
  Communicator& world = *st.ctx.world;
  const int rank = world.rank();
  const std::unique_ptr<TempDir> owner = rank == 0 ? std::make_unique<TempDir>() : nullptr;
  const std::string dir = shared_directory(owner.get());
  const std::vector<std::string> save = {"--save-interval", std::to_string(kSavedAt), "--save"};
  for (const bool bf16 : {true, false}) {
    const std::vector<std::string> precision = bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{};
    const std::vector<std::string> run = with(fsdp_run(ModelStyle::gpt, kFsdpIterations), precision);
    const std::vector<std::string> first_part = with(fsdp_run(ModelStyle::gpt, kSavedAt), precision);
    const double tolerance = bf16 ? 1e-3 : 200 * 0x1p-24;
    const std::string kind = bf16 ? " (bf16)" : " (fp32)";
    const TrainingSummary straight = train_single_rank(run);

    const std::string zero3 = dir + (bf16 ? "/zero3_bf16" : "/zero3");
    const std::string from = "optim_grads_params DP " + std::to_string(world.size());
    // bf16 adds the saved fp32 masters beside the bf16 weight shards: one resume shows both load.
    const TrainingSummary saving =
        train_on(st.ctx, with(first_part, with(fsdp_flags("optim_grads_params"), with(save, {zero3}))));
    const std::vector<double> straight_part(straight.train_losses.begin(), straight.train_losses.begin() + kSavedAt);
    expect_close(straight_part, saving.train_losses, 0, tolerance, from + kind + " loss");
    world.barrier();
    expect_same_curve(straight, train_single_rank(with(run, {"--load", zero3})), kSavedAt, tolerance, !bf16,
                      from + " -> one rank without FSDP" + kind);
    if (bf16) continue;
    expect_same_curve(straight, train_on(st.ctx, with(run, with(fsdp_flags("optim_grads"), {"--load", zero3}))),
                      kSavedAt, tolerance, !bf16, from + " -> optim_grads" + kind);
    if (world.size() == 4) {
      const ParallelState tp = make_state({.tp = 2}, 60);
      const std::vector<std::string> flags =
          with(fsdp_flags("optim_grads_params"), {"--tensor-model-parallel-size", "2", "--load", zero3});
      expect_same_curve(straight, train_on(tp.ctx, with(run, flags)), kSavedAt, tolerance, !bf16,
                        from + " -> TP 2 x DP 2 optim_grads_params" + kind);
    }

    const std::string plain = dir + (bf16 ? "/plain_bf16" : "/plain");
    if (rank == 0) train_single_rank(with(first_part, with(save, {plain})));
    world.barrier();
    expect_same_curve(straight, train_on(st.ctx, with(run, with(fsdp_flags("optim_grads_params"), {"--load", plain}))),
                      kSavedAt, tolerance, !bf16, "one rank without FSDP -> optim_grads_params" + kind);
  }
  world.barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
