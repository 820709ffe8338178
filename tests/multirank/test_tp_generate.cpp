// multirank-np: 2 4
// Generation under tensor parallelism (inference/generate.h): a checkpoint loaded at TP = 2 and
// TP = 4 (as many as the ranks allow) generates the same tokens as at TP = 1, for a GPT-2-style
// and a LLaMA-style (GQA) model, from checkpoints saved at TP = 1 and at TP = 2 with sequence
// parallelism and --tp-comm-overlap (generation itself runs without either), whose arguments
// read_checkpoint_args returns as stored.
//
// Why the tokens must agree, not just probably: the models run in f64 (the f32 checkpoint
// converts on load), and the layouts differ only in the order of f64 sums (the row-parallel
// reductions over hidden 32 / FFN <= 128 terms, 2 layers), so at every step the gathered logits
// of TP = N lie within kLogitTolerance of TP = 1's (as test_tp_training.cpp's f64 runs: 4000 u,
// here relative to the row's largest logit; measured: under 6e-16, a few u), also for a batch of
// two sequences (B > 1 puts the gathered shards in order by a transpose). The test checks that,
// and that TP = 1's best logit beats the second by more than twice the tolerance, so no greedy
// choice can flip; then the greedy sequences must be identical. A sampled sequence (temperature
// 0.8, top-k 20) must also be identical: every rank draws from the same seeded rng and rank 0's
// token is broadcast, and a flip would need a uniform draw within ~1e-13 of a boundary of the
// sampling distribution.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "megatron/inference/generate.h"
#include "megatron/training/checkpoint_io.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

constexpr double kLogitTolerance = 4000 * 0x1p-53;  // relative to the row's largest |logit|
// The mock data are counting sequences (1, 2, 3, ..., EOD), which 200 iterations teach the tiny
// models, so greedy generation counts on from the prompt: 60, 61, ..., across the boundary at 64
// between the vocabulary shards of TP = 2 and TP = 4 (the test requires it), and past seq_length
// 16, so the window slides too.
const std::vector<int32_t> kPrompt = {57, 58, 59};
constexpr int64_t kNewTokens = 20;
constexpr int64_t kTrainIters = 200;
constexpr int32_t kShardBoundary = 64;
constexpr int64_t kVocab = 100;  // tiny_tp_run's vocabulary; the padded ids 100..127 are never sampled

// tiny_tp_run for `iters` iterations with the learning rate decaying over all of them.
std::vector<std::string> long_run(ModelStyle style, int64_t iters) {
  std::vector<std::string> argv = tiny_tp_run(style, iters);
  *(std::find(argv.begin(), argv.end(), "--lr-decay-iters") + 1) = std::to_string(iters);
  return argv;
}

std::unique_ptr<GPTModel> load_in_f64(const std::string& dir, const ParallelContext& ctx) {
  TrainingArgs args = read_checkpoint_args(dir);
  args.model.params_dtype = DType::f64;
  auto model = std::make_unique<GPTModel>(args.model, ctx, Device::cpu());
  load_model_weights(dir, *model);
  return model;
}

std::vector<int32_t> generate(GPTModel& model, float temperature) {
  HostRng rng(7);
  return generate_tokens(model, kPrompt, kNewTokens, {.temperature = temperature, .top_k = 20, .vocab_size = kVocab},
                         -1, rng);
}

// The logits TP = 1 saw before each greedy choice.
std::vector<std::vector<double>> logits_along(GPTModel& model, const std::vector<int32_t>& sequence) {
  std::vector<std::vector<double>> rows;
  for (size_t n = kPrompt.size(); n < sequence.size(); ++n)
    rows.push_back(next_token_logits(model, std::vector<int32_t>(sequence.begin(), sequence.begin() + long(n))));
  return rows;
}

// Two sequences of the greedy run as one (2,8) batch: GPTModel::last_position_logits for B > 1.
Tensor batch_of_two(const std::vector<int32_t>& sequence) {
  Tensor tokens = Tensor::empty({2, 8}, DType::i32);
  std::copy(sequence.begin(), sequence.begin() + 8, tokens.data<int32_t>());
  std::copy(sequence.end() - 8, sequence.end(), tokens.data<int32_t>() + 8);
  return tokens;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Largest |a - b| over the largest |b|.
double relative_deviation(const std::vector<double>& a, const std::vector<double>& b) {
  double deviation = 0;
  for (size_t v = 0; v < b.size(); ++v) deviation = std::max(deviation, std::abs(a[v] - b[v]));
  return deviation / max_abs(b);
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.to(DType::f64);
  return std::vector<double>(h.data<double>(), h.data<double>() + h.numel());
}

// The checkpoint in `dir` generates at TP = 2 and TP = world as at TP = 1 (one model per rank).
void expect_same_generation_at_every_tp(const std::string& dir, const std::string& what) {
  const ParallelContext single = ParallelContext::single_process();
  const auto reference_model = load_in_f64(dir, single);
  const std::vector<int32_t> greedy = generate(*reference_model, 0.0f);
  const std::vector<int32_t> sampled = generate(*reference_model, 0.8f);
  ASSERT_EQ(greedy.size(), kPrompt.size() + size_t(kNewTokens));
  const auto below = [](int32_t t) { return t < kShardBoundary; };
  EXPECT_TRUE(std::any_of(greedy.begin() + long(kPrompt.size()), greedy.end(), below) &&
              !std::all_of(greedy.begin() + long(kPrompt.size()), greedy.end(), below))
      << what << ": the greedy tokens should come from more than one vocabulary shard; got "
      << ::testing::PrintToString(greedy);
  const std::vector<std::vector<double>> reference = logits_along(*reference_model, greedy);
  const std::vector<double> reference_batch = host_values(reference_model->last_position_logits(batch_of_two(greedy)));
  double smallest_margin = INFINITY;
  for (const std::vector<double>& row : reference) {
    std::vector<double> real(row.begin(), row.begin() + kVocab);
    std::partial_sort(real.begin(), real.begin() + 2, real.end(), std::greater<>());
    const double largest = max_abs(row);
    EXPECT_GT(real[0] - real[1], 2 * kLogitTolerance * largest) << what << ": a near tie could flip a greedy choice";
    smallest_margin = std::min(smallest_margin, (real[0] - real[1]) / largest);
  }

  const int world = int(make_state({}).ctx.world->size());
  std::vector<int> tp_sizes = {2};
  if (world > 2) tp_sizes.push_back(world);
  for (int tp : tp_sizes) {
    const ParallelState st = make_state({.tp = tp}, 60);
    const auto model = load_in_f64(dir, st.ctx);
    const std::string name = what + " at TP=" + std::to_string(tp);
    const std::vector<std::vector<double>> rows = logits_along(*model, greedy);
    ASSERT_EQ(rows.size(), reference.size());
    double worst = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_EQ(rows[i].size(), reference[i].size()) << name << ": the gathered row is the whole padded vocabulary";
      const double deviation = relative_deviation(rows[i], reference[i]);
      EXPECT_LE(deviation, kLogitTolerance) << name << ", step " << i;
      worst = std::max(worst, deviation);
    }
    const Tensor batch = model->last_position_logits(batch_of_two(greedy));
    ASSERT_EQ(batch.numel(), int64_t(reference_batch.size())) << name;
    EXPECT_LE(relative_deviation(host_values(batch), reference_batch), kLogitTolerance) << name << ", batch of two";
    EXPECT_EQ(generate(*model, 0.0f), greedy) << name << " greedy";
    EXPECT_EQ(generate(*model, 0.8f), sampled) << name << " sampled";
    if (st.ctx.world->rank() == 0)
      std::printf("%s: logits within %.3g of TP=1, relative (tolerance %.3g); smallest greedy margin %.3g\n",
                  name.c_str(), worst, kLogitTolerance, smallest_margin);
  }
}

void generate_across_tp_sizes(ModelStyle style) {
  const std::string kind = style_name(style);
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  {
    // Saved by one process at TP = 1.
    const ParallelState st = make_state({}, 60);
    if (st.ctx.world->rank() == 0)
      train_single_rank(
          with(long_run(style, kTrainIters), {"--save", dir + "/tp1", "--save-interval", std::to_string(kTrainIters)}));
    st.ctx.world->barrier();
  }
  expect_same_generation_at_every_tp(dir + "/tp1", kind + " TP=1 checkpoint");
  {
    // Saved at TP = 2 with sequence parallelism and its overlap (x DP = 2 on 4 ranks).
    const ParallelState st = make_state({.tp = 2}, 60);
    train_on(st.ctx, with(long_run(style, kTrainIters),
                          with(tp_flags(2, true, false), {"--tp-comm-overlap", "--save", dir + "/tp2",
                                                          "--save-interval", std::to_string(kTrainIters)})));
    st.ctx.world->barrier();
  }
  {
    // The arguments come back as stored, the layout included: generation decides its own.
    const TrainingArgs stored = read_checkpoint_args(dir + "/tp2");
    EXPECT_EQ(stored.parallel.tensor_model_parallel_size, 2);
    EXPECT_TRUE(stored.parallel.sequence_parallel);
    EXPECT_TRUE(stored.parallel.tp_comm_overlap);
    const nlohmann::json saved = checkpointing::CheckpointReader::open(dir + "/tp2", kTrainIters).common().at("args");
    for (const auto& [flag, value] : training_args_to_flags(stored))
      EXPECT_EQ(saved.at(flag).get<std::string>(), value) << flag;
  }
  expect_same_generation_at_every_tp(dir + "/tp2", kind + " TP=2 SP checkpoint");
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

TEST(TpGenerate, GptStyleGeneratesTheSameAtEveryTpSize) { generate_across_tp_sizes(ModelStyle::gpt); }

TEST(TpGenerate, LlamaStyleGeneratesTheSameAtEveryTpSize) { generate_across_tp_sizes(ModelStyle::llama); }

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
