// multirank-np: 2 4
// Tensor and sequence parallelism on GPUs (NCCL) train the single-GPU model: for the GPT-2-style
// and the LLaMA-style model of the TP tests on CPU ranks (multirank/dp_training_util.h: dropout
// on, fp32 parameters), `pretrain` in every layout of the world (2 ranks: TP=2, TP=2 with SP, and
// with SP and --tp-comm-overlap; 4 ranks: TP=4, TP=4 with SP, and with SP and --tp-comm-overlap,
// TP=2 x DP=2 with SP and the distributed optimizer, that again with overlapped gradient
// reduction and parameter gather, as bench/bench_tp.sh runs it, and with --tp-comm-overlap) gives the
// loss and gradient-norm curve of 20 iterations, and the validation losses, of a single-GPU run
// of the same global batches computed by every rank on its own GPU, in fp32 and in bf16 (against
// the single GPU in the same precision). Under SP, the activation memory per GPU of the metrics
// file is the single GPU's divided by TP (all but the loss's per-token lse, which every rank keeps
// whole), as on CPU ranks.
//
// Tolerance in bf16: the loss within 1e-3 (derived in gpu_training_util.h).
// Tolerance in fp32: 200 u (u = 2^-24 ~ 6e-8, so ~1.2e-5) relative, on the loss and the gradient
// norm: the bound of the TP tests on CPU ranks (test_tp_training.cpp derives it; measured there:
// loss 2 u, norm 11 u in fp32). The layouts differ from the single GPU only in the order of fp32
// sums: a row-parallel GEMM adds TP partial products through NCCL (ring or tree, in an order of
// its choosing), the vocab-parallel loss regroups the softmax sums, DP adds micro-batch gradients
// in another order. The GPU adds orderings of the same kind and size: cuBLASLt picks its kernel,
// and so its split of each dot product, per shape, and a TP shard is another shape (GEMMs run in
// full fp32, never TF32); the embedding backward adds with atomics in arrival order. Each
// regrouping moves a sum by a few u relative to its terms, as on CPU ranks (the DP tests on GPUs
// measured 2-4 u; this test's layouts on CPU ranks, with MPI, at most 3.4 u). A defect (a missing
// reduction, a mask drawn per rank, a misplaced shard, a stream race between the TP and DP
// communicators) moves the loss or the norm by 1e-3 or more. The largest deviation seen is
// printed, so the margin can be read off each run.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "multigpu/gpu_training_util.h"

namespace megatron::testing {
namespace {

constexpr double kTolerance = 200 * 0x1p-24;  // fp32: derivation in the header comment
const Precision kFp32{"fp32", {}, kTolerance, true};
constexpr int kIterations = 20;
constexpr int64_t kLseBytes = 1 * 16 * 4;  // the loss's lse: one f32 per token of a micro-batch (1 x 16)

struct Layout {
  int tp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap = false;  // overlapped gradient reduction (small buckets) and parameter gather
  bool tp_comm_overlap = false;
};

// The layout's flags beyond tp_flags.
std::vector<std::string> overlap_flags(const Layout& l) {
  std::vector<std::string> f;
  if (l.overlap) f = {"--overlap-grad-reduce", "--ddp-bucket-size", "1000", "--overlap-param-gather"};
  if (l.tp_comm_overlap) f.push_back("--tp-comm-overlap");
  return f;
}

std::vector<Layout> layouts_of_world(int world) {
  if (world == 2)
    return {
        {.tp = 2}, {.tp = 2, .sequence_parallel = true}, {.tp = 2, .sequence_parallel = true, .tp_comm_overlap = true}};
  return {
      {.tp = 4},
      {.tp = 4, .sequence_parallel = true},
      {.tp = 4, .sequence_parallel = true, .tp_comm_overlap = true},
      {.tp = 2, .sequence_parallel = true, .distributed_optimizer = true},
      {.tp = 2, .sequence_parallel = true, .distributed_optimizer = true, .overlap = true},
      {.tp = 2, .sequence_parallel = true, .distributed_optimizer = true, .overlap = true, .tp_comm_overlap = true}};
}

std::string layout_name(ModelStyle style, const Layout& l, int world, const Precision& precision) {
  std::string name = std::string(style_name(style)) + " TP=" + std::to_string(l.tp) +
                     " DP=" + std::to_string(world / l.tp) + " on GPUs " + precision.name;
  if (l.sequence_parallel) name += " SP";
  if (l.distributed_optimizer) name += " dist-opt";
  for (const std::string& f : overlap_flags(l)) name += " " + f;
  return name;
}

// The activation memory of one micro-batch in bytes, from the first line of a metrics file.
int64_t activation_bytes_of(const std::string& metrics_file) {
  std::ifstream in(metrics_file);
  std::string line;
  EXPECT_TRUE(std::getline(in, line)) << metrics_file << " is empty";
  const double mib = nlohmann::json::parse(line).at("activation_memory_mib").get<double>();
  return std::llround(mib * 1024.0 * 1024.0);  // exact: bytes / 2^20 loses no bits in a double
}

class GpuTpTraining : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    if (const std::string why = multigpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
    cuda::init_device(local_gpu().index);  // the single-GPU run comes before any make_gpu_state
  }

  void every_layout_matches_the_single_gpu(ModelStyle style) {
    const Precision& precision = GetParam();
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const TempDir dir;  // this rank's metrics files (the single-GPU run writes on every rank)
    const std::vector<std::string> run = with(tiny_tp_run(style, kIterations, "cuda"), precision.flags);
    const TrainingSummary single = train_single_gpu(with(run, {"--metrics-file", dir / "single.jsonl"}));
    ASSERT_EQ(single.train_losses.size(), size_t(kIterations));
    ASSERT_EQ(single.valid_losses.size(), 2u);
    const int64_t single_activation = activation_bytes_of(dir / "single.jsonl");
    const std::vector<Layout> layouts = layouts_of_world(world);
    for (size_t i = 0; i < layouts.size(); ++i) {
      const Layout& l = layouts[i];
      const std::string name = layout_name(style, l, world, precision);
      const std::string metrics = dir / ("layout" + std::to_string(i) + ".jsonl");  // the last rank writes it
      const ParallelState st = make_gpu_state({.tp = l.tp}, 120);
      const TrainingSummary s =
          train_on_gpus(st.ctx, with(with(run, tp_flags(l.tp, l.sequence_parallel, l.distributed_optimizer)),
                                     with(overlap_flags(l), {"--metrics-file", metrics})));
      double worst = expect_same_curve(single, s, 0, precision.tolerance, precision.compare_grad_norm, name);
      worst = std::max(
          worst, expect_close(single.valid_losses, s.valid_losses, 0, precision.tolerance, name + " validation loss"));
      report_deviation(worst, name, precision.tolerance);
      if (rank == world - 1) {
        const int64_t divided = (single_activation - kLseBytes) / l.tp + kLseBytes;
        if (l.sequence_parallel)
          EXPECT_EQ(activation_bytes_of(metrics), divided) << name << ": single GPU " << single_activation;
        else
          EXPECT_GT(activation_bytes_of(metrics), divided) << name << ": single GPU " << single_activation;
      }
      st.ctx.world->barrier();  // every rank done with this layout's communicators before they go
    }
  }
};

TEST_P(GpuTpTraining, GptStyleLayoutsMatchTheSingleGpuCurve) { every_layout_matches_the_single_gpu(ModelStyle::gpt); }

TEST_P(GpuTpTraining, LlamaStyleLayoutsMatchTheSingleGpuCurve) {
  every_layout_matches_the_single_gpu(ModelStyle::llama);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuTpTraining, ::testing::Values(kFp32, bf16_precision()), precision_name);

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
