// multirank-np: 2 4
// The model split over pipeline stages: every rank builds its stages' GPTModel chunks
// (StageLayers from stage_split.h), the pipeline schedule runs them (run_schedule over the pp and
// pp_grad communicators), and the last stage's loss and every parameter's gradient must equal the
// whole model's on one process. f64, GPT-2 style (tied embeddings, learned positions, dropout) and
// LLaMA style (untied, RoPE, RMSNorm, SwiGLU, GQA); even, interleaved, uneven and layout splits.
// With tied embeddings the two copies' gradients are summed over the embedding group first, as
// Megatron's finalize_model_grads does.
#include <cmath>
#include <map>

#include "megatron/core/rng.h"
#include "megatron/core/strings.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_executor.h"
#include "megatron/pipeline_parallel/stage_split.h"
#include "multirank/multirank_util.h"
#include "tiny_models.h"

namespace megatron::testing {
namespace {

using namespace pipeline_parallel;

constexpr int64_t kMicroBatches = 4, kBatch = 2, kSeq = 6;
constexpr uint64_t kSeed = 1234;

TransformerConfig config(bool llama) {
  TransformerConfig c = llama ? llama_style(DType::f64) : gpt2_style(DType::f64);
  c.num_layers = 8;
  c.max_position_embeddings = c.seq_length = kSeq;
  c.attention_dropout = c.hidden_dropout = 0.1f;
  return c;
}

std::vector<MicroBatch> batches(int64_t vocab) {
  HostRng rng(7);
  std::vector<MicroBatch> out;
  for (int64_t m = 0; m < kMicroBatches; ++m) {
    MicroBatch b{Tensor::empty({kBatch, kSeq}, DType::i32),
                 Tensor::empty({kBatch, kSeq}, DType::i32),
                 Tensor::empty({kBatch, kSeq}, DType::f32),
                 Tensor(),
                 Tensor()};
    for (int64_t i = 0; i < kBatch * kSeq; ++i) {
      b.tokens.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(vocab)));
      b.labels.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(vocab)));
      b.loss_mask.data<float>()[i] = i % 5 == 3 ? 0.0f : 1.0f;
    }
    out.push_back(b);
  }
  return out;
}

ForwardContext fwd_of(int64_t mb) { return {.training = true, .seed = 99, .step = uint64_t(mb)}; }

using Grads = std::map<std::string, std::vector<double>>;

Grads grads_of(GPTModel& model) {
  Grads g;
  for (const auto& p : model.parameters().params()) {
    const double* d = p->main_grad.data<double>();
    g[p->spec.name].assign(d, d + p->main_grad.numel());
  }
  return g;
}

// The whole model on this process: loss sum over the micro-batches and every gradient of the
// mean loss (each micro-batch scaled by 1/(M·tokens), as the training loop does).
std::pair<double, Grads> whole_model(const TransformerConfig& c, const std::vector<MicroBatch>& mbs) {
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(c, single);
  model.parameters().initialize(kSeed);
  model.parameters().zero_grads();
  double loss = 0;
  for (int64_t m = 0; m < kMicroBatches; ++m)
    loss += model
                .forward_backward(mbs[size_t(m)].tokens, mbs[size_t(m)].labels, mbs[size_t(m)].loss_mask,
                                  1.0f / float(kMicroBatches), fwd_of(m))
                .loss_sum;
  return {loss, grads_of(model)};
}

void check_split(const ParallelState& st, const TransformerConfig& c, const ParallelArgs& args,
                 const std::string& what) {
  const std::vector<MicroBatch> mbs = batches(c.vocab_size);
  const auto [want_loss, want_grads] = whole_model(c, mbs);
  const PipelineSplit split = pipeline_split(args, c.num_layers);
  const int64_t rank = st.ctx.pp->rank(), p = split.pipeline_size, v = split.virtual_stages;
  std::vector<std::unique_ptr<GPTModel>> chunks;
  for (int64_t chunk = 0; chunk < v; ++chunk) {
    chunks.push_back(std::make_unique<GPTModel>(c, st.ctx, Device::cpu(), split.stage(rank, chunk)));
    chunks.back()->parameters().initialize(kSeed);
    chunks.back()->parameters().zero_grads();
  }
  std::map<std::pair<int64_t, int64_t>, GPTModel::Saved> saved;
  double loss = 0;
  StageFunctions stage;
  stage.forward = [&](int64_t mb, int64_t chunk, const Tensor& input) {
    LossSums sums;
    const Tensor out =
        chunks[size_t(chunk)]->stage_forward(mbs[size_t(mb)], input, fwd_of(mb), saved[{mb, chunk}], &sums);
    loss += sums.loss_sum;
    return out;
  };
  stage.backward = [&](int64_t mb, int64_t chunk, const Tensor& output_grad) {
    const Tensor d =
        chunks[size_t(chunk)]->stage_backward(output_grad, 1.0f / float(kMicroBatches), saved[{mb, chunk}]);
    saved.erase({mb, chunk});
    return d;
  };
  const ScheduleShape shape{.pipeline_size = p, .virtual_stages = v, .microbatches = kMicroBatches};
  run_schedule(build_schedule(shape, rank), *st.ctx.pp, *st.ctx.pp_grad,
               {.shape = {kSeq, kBatch, c.hidden_size}, .dtype = DType::f64}, stage);
  // Megatron's embedding-group all-reduce of the word embedding's gradient (tied models).
  for (auto& chunk : chunks)
    for (const auto& param : chunk->parameters().params())
      if (param->spec.name == "embedding.word_embeddings.weight" && !c.untie_embeddings_and_output_weights)
        st.ctx.embedding->all_reduce(param->main_grad, ReduceOp::sum);

  // The same operations in the same order, except the residual additions done at stage
  // boundaries before the norm instead of fused into it (the same sum, rounded once) and the
  // gradient sums over the embedding group: 1e-12 relative (~ 4500 f64 unit roundoffs) covers
  // reordered sums over these few hundred terms.
  const double rtol = 1e-12;
  if (split.stage(rank, v - 1).loss) {
    EXPECT_NEAR(loss, want_loss, rtol * std::abs(want_loss)) << what;
  }
  int64_t compared = 0;
  for (auto& chunk : chunks)
    for (const auto& [name, got] : grads_of(*chunk)) {
      const std::vector<double>& want = want_grads.at(name);
      ASSERT_EQ(got.size(), want.size()) << what << " " << name;
      double scale = 0, worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(got[i] - want[i]));
      }
      EXPECT_LE(worst, rtol * scale) << what << " rank " << rank << " " << name;
      EXPECT_GT(scale, 0.0) << what << " " << name << " carries no gradient";
      ++compared;
    }
  EXPECT_GT(compared, 0) << what;
}

class PipelineModel : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    sizes_.pp = process_info_from_env().world_size;
    st_ = make_state(sizes_);
  }
  ParallelArgs args() const {
    ParallelArgs a;
    a.pipeline_model_parallel_size = sizes_.pp;
    return a;
  }
  ParallelSizes sizes_;
  ParallelState st_;
};

TEST_P(PipelineModel, EvenSplitEqualsTheWholeModel) { check_split(st_, config(GetParam()), args(), "even"); }

TEST_P(PipelineModel, InterleavedEqualsTheWholeModel) {
  ParallelArgs a = args();
  a.num_virtual_stages_per_pipeline_rank = 2;
  check_split(st_, config(GetParam()), a, "two virtual stages");
}

TEST_P(PipelineModel, UnevenSplitEqualsTheWholeModel) {
  ParallelArgs a = args();
  a.decoder_first_pipeline_num_layers = 1;
  a.decoder_last_pipeline_num_layers = sizes_.pp == 2 ? 7 : 3;
  check_split(st_, config(GetParam()), a, "uneven");
}

TEST_P(PipelineModel, LayoutWithLayerlessEndsEqualsTheWholeModel) {
  // The embedding and the loss in stages of their own (no layers), the rest spread.
  ParallelArgs a = args();
  a.pipeline_model_parallel_layout = sizes_.pp == 2 ? "E|tttt|tttt|L" : "E|tt|ttt|ttt||||L";
  check_split(st_, config(GetParam()), a, "layout " + a.pipeline_model_parallel_layout);
}

std::string style_of(const ::testing::TestParamInfo<bool>& style) { return style.param ? "Llama" : "Gpt2"; }

INSTANTIATE_TEST_SUITE_P(Styles, PipelineModel, ::testing::Values(false, true), style_of);

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
