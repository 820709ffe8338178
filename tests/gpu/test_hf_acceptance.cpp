// The GPU half of tests/hf/gpu_acceptance.sh (skipped unless MEGATRON_HF_ACCEPTANCE_DIR names its
// work directory and MEGATRON_HF_ACCEPTANCE_FAMILY the family whose files it holds now; the script
// runs one family at a time): ImportedLogits, our logits of the imported checkpoint on the 8
// prompts against transformers' fp32 logits, in fp32 and in bf16; FinetunedLoss, the loss of the
// fine-tuned checkpoint on the fixed batch, which the script compares with transformers' on the
// exported fine-tuned model.
//
// Tolerances. fp32: 1e-3 absolute (the bound): both sides run fp32 GEMMs (TF32 off) over
// up to 24 layers of width <= 4096 in different summation orders, which moves logits of size ~1-10
// by ~1e-5. bf16: weights and activations rounded to 8 bits (u = 2^-8) at every layer boundary
// make the logits differ from fp32 by a few u relative to their scale; we hold bf16 to 0.1 x the
// largest |reference logit|, and print the measured error so the bound can be tightened.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <vector>

#include "hf/hf_test_util.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/training/checkpoint_io.h"

using namespace megatron;
using namespace megatron::testing;

namespace {

// WORK/FAMILY, or empty when the script did not set the variables.
std::string family_dir() {
  const char* work = std::getenv("MEGATRON_HF_ACCEPTANCE_DIR");
  const char* family = std::getenv("MEGATRON_HF_ACCEPTANCE_FAMILY");
  return work && family ? std::string(work) + "/" + family : std::string();
}

std::unique_ptr<GPTModel> load(const std::string& ckpt, DType dtype, const ParallelContext& ctx) {
  TrainingArgs args = read_checkpoint_args(ckpt);
  args.model.params_dtype = dtype;
  args.model.attention_dropout = args.model.hidden_dropout = 0.0f;
  static const cuda::DeviceInfo gpu = cuda::init_device(0);  // the context and allocator, once
  auto model = std::make_unique<GPTModel>(args.model, ctx, Device::cuda(gpu.index));
  load_model_weights(ckpt, *model);
  return model;
}

}  // namespace

TEST(HfAcceptance, ImportedLogits) {
  const std::string dir = family_dir();
  if (dir.empty()) GTEST_SKIP() << "MEGATRON_HF_ACCEPTANCE_DIR/_FAMILY are unset: run tests/hf/gpu_acceptance.sh";
  const ParallelContext single = ParallelContext::single_process();
  const auto reader = checkpointing::SafetensorsReader::open(dir + "/reference.safetensors");
  const HfReference ref{reader.load("input_ids"), reader.load("logits")};
  double largest = 0.0;
  for (int64_t i = 0; i < ref.logits.numel(); ++i) largest = std::max(largest, std::fabs(ref.logits.item(i)));
  const double fp32 = max_logit_error(*load(dir + "/ckpt", DType::f32, single), ref);
  const double bf16 = max_logit_error(*load(dir + "/ckpt", DType::bf16, single), ref);
  std::printf("%s: max |logit - transformers| fp32 %.3g (bound 1e-3), bf16 %.3g (bound %.3g)\n", dir.c_str(), fp32,
              bf16, 0.1 * largest);
  EXPECT_LE(fp32, 1e-3);
  EXPECT_LE(bf16, 0.1 * largest);
}

// The fine-tuned model's loss on the batch (P x 65 ids: tokens are the first 64, labels the last
// 64), every position counted: transformers' mean loss with labels = ids.
TEST(HfAcceptance, FinetunedLoss) {
  const std::string dir = family_dir();
  if (dir.empty()) GTEST_SKIP() << "MEGATRON_HF_ACCEPTANCE_DIR/_FAMILY are unset: run tests/hf/gpu_acceptance.sh";
  const ParallelContext single = ParallelContext::single_process();
  const Tensor ids = checkpointing::SafetensorsReader::open(dir + "/reference.safetensors").load("batch_ids");
  const int64_t B = ids.dim(0), T = ids.dim(1) - 1;
  Tensor tokens = Tensor::empty({B, T}, DType::i32), labels = Tensor::empty({B, T}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      tokens.data<int32_t>()[b * T + t] = int32_t(ids.data<int64_t>()[b * (T + 1) + t]);
      labels.data<int32_t>()[b * T + t] = int32_t(ids.data<int64_t>()[b * (T + 1) + t + 1]);
    }
  const Tensor mask = Tensor::from_vector(std::vector<float>(size_t(B * T), 1.0f), {B, T});
  const LossSums loss = load(dir + "/finetuned", DType::f32, single)->evaluate(tokens, labels, mask);
  ASSERT_GT(loss.num_tokens, 0.0);
  std::ofstream(dir + "/our_finetuned_loss.txt") << std::setprecision(10) << loss.loss_sum / loss.num_tokens;
}
