// multirank-np: 2 4
// Context parallelism on GPUs (NCCL: the ring's K/V transfers overlapped with the block attention,
// the all-to-all of a2a, the gather of allgather) trains the single-GPU model: the GPT-2-style and
// LLaMA-style models of the CP tests on CPU ranks (multirank/test_cp_training.cpp: 2 layers,
// dropout off), `pretrain` in every layout of the world (2 ranks: CP=2 in both styles, CP=2 with
// document masks (packed documents: our kernels' cu_seqlens path) with p2p and a2a; 4 ranks: CP=4
// p2p and a2a, CP=4 a2a+p2p as 2 x 2, CP=2 x DP=2 with the distributed optimizer and overlapped
// gradient reduction, CP=2 x TP=2 with sequence parallelism) gives the loss and gradient-norm curve
// of 20 iterations, and the validation losses, of a single-GPU run of the same global batches
// computed by every rank on its own GPU, in fp32 and in bf16.
//
// Tolerances as the TP and PP tests on GPUs (test_multigpu_tp_training.cpp derives them): fp32
// 200 u (u = 2^-24) relative on the loss and the norm; bf16 the loss within 1e-3. CP computes the
// single GPU's attention block by block, merged through the log-sum-exp, and sums the gradients
// over the CP ranks' tokens: reorderings of a few u (the same layouts on CPU ranks in f64 deviate by
// a few u). A chunk at the wrong RoPE position or a block under the wrong mask moves the curve by
// 1e-3 or more.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "multigpu/gpu_training_util.h"

namespace megatron::testing {
namespace {

constexpr int kIterations = 20;

struct Layout {
  std::string name;
  ModelStyle style;
  bool documents;
  ParallelSizes sizes;
  std::vector<std::string> flags;
};

// Set field by field: GCC 12 sees the designated initializer's empty hierarchical_cp as maybe
// uninitialized inside the layouts' initializer list.
ParallelSizes sizes(int64_t cp, int64_t tp = 1, std::vector<int64_t> hierarchical_cp = {}) {
  ParallelSizes s;
  s.cp = cp;
  s.tp = tp;
  s.hierarchical_cp = std::move(hierarchical_cp);
  return s;
}

std::vector<Layout> layouts_of_world(int world) {
  using enum ModelStyle;
  const std::vector<std::string> cp2 = {"--context-parallel-size", "2"};
  const std::vector<std::string> cp4 = {"--context-parallel-size", "4"};
  if (world == 2)
    return {{"CP=2", gpt, false, sizes(2), cp2},
            {"CP=2", llama, false, sizes(2), cp2},
            {"CP=2 document masks", llama, true, sizes(2), cp2},
            {"CP=2 a2a document masks", llama, true, sizes(2), with(cp2, {"--cp-comm-type", "a2a"})}};
  return {{"CP=4", llama, false, sizes(4), cp4},
          {"CP=4 a2a", gpt, false, sizes(4), with(cp4, {"--cp-comm-type", "a2a"})},
          {"CP=4 a2a+p2p (2 x 2)",
           llama,
           false,
           sizes(4, 1, {2, 2}),
           with(cp4, {"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"})},
          {"CP=2 x DP=2 dist-opt overlapped grad reduce",
           gpt,
           false,
           sizes(2),
           with(cp2, {"--use-distributed-optimizer", "--overlap-grad-reduce"})},
          {"CP=2 x TP=2 SP", llama, false, sizes(2, 2), with(cp2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"})}};
}

class GpuCpTraining : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    if (const std::string why = multigpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
    cuda::init_device(local_gpu().index);  // the single-GPU runs come before any make_gpu_state
  }
};

TEST_P(GpuCpTraining, EveryLayoutMatchesTheSingleGpuCurve) {
  const Precision& precision = GetParam();
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (const Layout& l : layouts_of_world(world)) {
    const std::vector<std::string> run =
        with(tiny_cp_run(l.style, kIterations, l.documents, "cuda"), precision.flags);
    const TrainingSummary single = train_single_gpu(run);
    ASSERT_EQ(single.train_losses.size(), size_t(kIterations));
    const std::string name = std::string(style_name(l.style)) + " " + l.name + " on GPUs " + precision.name;
    const ParallelState st = make_gpu_state(l.sizes, 120);
    ASSERT_EQ(st.ctx.cp->size(), l.sizes.cp);
    const TrainingSummary s = train_on_gpus(st.ctx, with(run, l.flags));
    double worst = expect_same_curve(single, s, 0, precision.tolerance, precision.compare_grad_norm, name);
    worst = std::max(worst,
                     expect_close(single.valid_losses, s.valid_losses, 0, precision.tolerance, name + " validation loss"));
    report_deviation(worst, name, precision.tolerance);
    st.ctx.world->barrier();  // every rank done with this layout's communicators before they go
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuCpTraining, ::testing::Values(fp32_precision(), bf16_precision()), precision_name);

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
