#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/training/arguments.h"
#include "test_util.h"

using namespace megatron;

namespace {

using Argv = std::vector<std::string>;

// The smallest valid command line: the rest is defaults and derivations.
Argv minimal_argv() { return megatron::testing::minimal_train_argv(); }

Argv with(Argv argv, const Argv& extra) {
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// minimal_argv() without `flag` and its value, if it takes one.
Argv without(const std::string& flag) {
  Argv argv = minimal_argv();
  const auto it = std::find(argv.begin(), argv.end(), flag);
  const bool has_value = it + 1 != argv.end() && (it + 1)->rfind("--", 0) != 0;
  argv.erase(it, it + (has_value ? 2 : 1));
  return argv;
}

// The error text parse_training_args throws, or "" when it does not throw.
std::string parse_error(const Argv& argv, int64_t world_size = 1) {
  try {
    parse_training_args(argv, world_size);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

// A YAML file that lives as long as the object.
class YamlFile {
 public:
  explicit YamlFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              (std::string("megatron_test_arguments_") +
               ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml")) {
    std::ofstream(path_) << text;
  }
  ~YamlFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace

TEST(ParseArgs, DefaultsAndDerivedFields) {
  const TrainingArgs args = parse_training_args(minimal_argv());
  EXPECT_EQ(args.model.num_layers, 2);
  EXPECT_EQ(args.model.ffn_hidden_size, 256);  // 4h
  EXPECT_EQ(args.model.kv_channels, 16);       // h / heads
  EXPECT_EQ(args.model.num_query_groups, 4);   // heads without --group-query-attention
  EXPECT_EQ(args.model.max_position_embeddings, 128);
  EXPECT_EQ(args.model.vocab_size, 100);
  EXPECT_EQ(args.model.padded_vocab_size, 128);
  EXPECT_EQ(args.model.params_dtype, DType::f32);
  EXPECT_EQ(args.global_batch_size, 2);  // mbs * DP
  EXPECT_EQ(args.optimizer.lr_decay_iters, 10);
  EXPECT_EQ(args.optimizer.lr, 1e-3);
  EXPECT_EQ(args.optimizer.lr_decay_style, LrDecayStyle::linear);
  EXPECT_EQ(args.seed, 1234);
  EXPECT_EQ(args.device, "auto");
  EXPECT_EQ(args.num_micro_batches(), 1);

  const TrainingArgs swiglu = parse_training_args(with(minimal_argv(), {"--swiglu", "--bf16"}));
  EXPECT_EQ(swiglu.model.ffn_hidden_size, 128);  // int((4*64*2/3)/64)*64
  EXPECT_EQ(swiglu.model.params_dtype, DType::bf16);

  // Megatron's loss-scaling defaults: dynamic, from 2^32, floor 1, window 1000, hysteresis 2.
  const TrainingArgs fp16 = parse_training_args(with(minimal_argv(), {"--fp16"}));
  EXPECT_EQ(fp16.model.params_dtype, DType::f16);
  EXPECT_FALSE(fp16.optimizer.loss_scale.has_value());
  EXPECT_EQ(fp16.optimizer.initial_loss_scale, 4294967296.0);
  EXPECT_EQ(fp16.optimizer.min_loss_scale, 1.0);
  EXPECT_EQ(fp16.optimizer.loss_scale_window, 1000.0);
  EXPECT_EQ(fp16.optimizer.hysteresis, 2);
  EXPECT_EQ(parse_training_args(with(minimal_argv(), {"--fp16", "--loss-scale", "128"})).optimizer.loss_scale, 128.0);
}

TEST(ParseArgs, DataParallelDerivations) {
  const TrainingArgs args = parse_training_args(minimal_argv(), 4);
  EXPECT_EQ(args.world_size, 4);
  EXPECT_EQ(args.data_parallel_size, 4);
  EXPECT_EQ(args.global_batch_size, 8);
  const TrainingArgs accumulate = parse_training_args(with(minimal_argv(), {"--global-batch-size", "32"}), 4);
  EXPECT_EQ(accumulate.num_micro_batches(), 4);
}

TEST(ParseArgs, Tokenizers) {
  Argv byte = without("--vocab-size");
  byte[std::find(byte.begin(), byte.end(), "NullTokenizer") - byte.begin()] = "ByteTokenizer";
  EXPECT_EQ(parse_training_args(byte).model.vocab_size, 257);
  EXPECT_EQ(parse_training_args(byte).model.padded_vocab_size, 384);

  DataArgs data;
  data.tokenizer_type = "NullTokenizer";
  data.vocab_size = 50257;
  EXPECT_EQ(tokenizer_vocab_size(data), 50257);
  data.vocab_size = 0;
  EXPECT_THROW(tokenizer_vocab_size(data), Error);
  data.tokenizer_type = "GPT2BPETokenizer";
  EXPECT_THROW(tokenizer_vocab_size(data), Error);
}

TEST(ParseArgs, EqualsFormAndLists) {
  const TrainingArgs args = parse_training_args(
      {"--num-layers=2", "--hidden-size=128", "--num-attention-heads", "4", "--seq-length=128", "--micro-batch-size",
       "2", "--train-iters", "10", "--lr=3e-4", "--lr-decay-style=cosine", "--tokenizer-type=ByteTokenizer",
       "--data-path", "0.3", "corpus-a", "0.7", "corpus-b", "--split", "98,2,0"});
  EXPECT_EQ(args.model.hidden_size, 128);
  EXPECT_EQ(args.optimizer.lr, 3e-4);
  EXPECT_EQ(args.optimizer.lr_decay_style, LrDecayStyle::cosine);
  EXPECT_EQ(args.data.data_path, (std::vector<std::string>{"0.3", "corpus-a", "0.7", "corpus-b"}));
  EXPECT_EQ(args.data.split, "98,2,0");
  // --data-path=VALUE starts the list; following words still belong to it.
  const TrainingArgs equals = parse_training_args(with(without("--mock-data"), {"--data-path=0.5", "a", "0.5", "b"}));
  EXPECT_EQ(equals.data.data_path, (std::vector<std::string>{"0.5", "a", "0.5", "b"}));
}

TEST(ParseArgs, Precedence) {
  // default < preset < YAML < flags, field by field.
  YamlFile yaml(
      "model_preset: llama-tiny\n"
      "hidden_size: 128\n"
      "num_layers: 3\n"
      "lr: 0.01\n");
  const TrainingArgs args =
      parse_training_args({"--config", yaml.path(), "--num-layers", "4", "--seq-length", "64", "--micro-batch-size",
                           "1", "--train-iters", "5", "--mock-data", "--tokenizer-type", "ByteTokenizer"});
  EXPECT_EQ(args.model.normalization, Normalization::RMSNorm);  // preset over default
  EXPECT_EQ(args.model.num_query_groups, 2);                    // preset
  EXPECT_EQ(args.model.hidden_size, 128);                       // YAML over preset
  EXPECT_EQ(args.optimizer.lr, 0.01);                           // YAML over default
  EXPECT_EQ(args.model.num_layers, 4);                          // flag over YAML
  EXPECT_EQ(args.model.seq_length, 64);                         // flag over preset
  EXPECT_EQ(args.model.kv_channels, 32);                        // derived from the merged values
  EXPECT_EQ(args.model_preset, "llama-tiny");

  // A preset named on the command line replaces the YAML's.
  const TrainingArgs flag_preset =
      parse_training_args({"--config", yaml.path(), "--model-preset", "tiny", "--micro-batch-size", "1",
                           "--train-iters", "5", "--mock-data", "--tokenizer-type", "ByteTokenizer"});
  EXPECT_EQ(flag_preset.model.normalization, Normalization::LayerNorm);
  EXPECT_EQ(flag_preset.model.hidden_size, 128);  // the YAML still overrides the preset
  EXPECT_EQ(flag_preset.model_preset, "tiny");
}

TEST(ParseArgs, YamlValues) {
  YamlFile yaml(
      "model_preset: llama-tiny\n"
      "swiglu: no\n"                // YAML booleans, overriding the preset's true
      "disable_bias_linear: off\n"  // store_false flag: biases back on
      "rotary-interleaved: yes\n"   // dashed keys work too
      "data_path: [0.5, a, 0.5, b]\n"
      "lr_warmup_fraction: 0.1\n"
      "save:\n");  // null: not given
  const TrainingArgs args = parse_training_args({"--config", yaml.path(), "--micro-batch-size", "1", "--train-iters",
                                                 "5", "--lr", "1e-3", "--tokenizer-type", "ByteTokenizer"});
  EXPECT_FALSE(args.model.swiglu);
  EXPECT_TRUE(args.model.add_bias_linear);
  EXPECT_TRUE(args.model.rotary_interleaved);
  EXPECT_EQ(args.data.data_path, (std::vector<std::string>{"0.5", "a", "0.5", "b"}));
  EXPECT_EQ(args.optimizer.lr_warmup_fraction, 0.1);
  EXPECT_EQ(args.save, "");
}

TEST(ParseArgs, YamlProblems) {
  YamlFile yaml(
      "num_layer: 2\n"
      "swiglu: 3\n"
      "hidden_size: [64]\n"
      "hidden-size: 64\n");
  const std::string error = parse_error(with(minimal_argv(), {"--config", yaml.path()}));
  EXPECT_TRUE(contains(error, ": num_layer: unknown key; did you mean num_layers?"));
  EXPECT_TRUE(contains(error, ": swiglu: expected true or false"));
  EXPECT_TRUE(contains(error, ": hidden_size: expected a single value"));
  EXPECT_TRUE(contains(parse_error({"--config", "/nonexistent/run.yaml"}), "cannot be read as YAML"));

  YamlFile twice("hidden_size: 64\nhidden-size: 64\n");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--config", twice.path()})), "is given twice"));
}

// --log-params-norm reads the weights each rank holds: not FP8 codes, not Megatron FSDP's shards.
TEST(ParseArgs, LogParamsNormRefusesWeightsItCannotRead) {
  EXPECT_TRUE(parse_training_args(with(minimal_argv(), {"--log-params-norm"})).log_params_norm);
  EXPECT_TRUE(contains(
      parse_error(with(minimal_argv(), {"--log-params-norm", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                        "optim_grads_params", "--use-distributed-optimizer"})),
      "--log-params-norm with --data-parallel-sharding-strategy optim_grads_params"));
}

TEST(ParseArgs, FlagProblems) {
  EXPECT_TRUE(contains(parse_error(with(without("--hidden-size"), {"--hiden-size", "64"})),
                       "--hiden-size: unknown flag; did you mean --hidden-size?"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--use-mcore-modles"})),
                       "--use-mcore-modles: unknown flag; did you mean --use-mcore-models?"));
  // Megatron's flags for what is not built say so, with what to do instead, values and all.
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--ckpt-format", "torch"})),
                       "--ckpt-format torch is not built here: checkpoints here reshard at load as torch_dist's do"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--grad-reduce-in-bf16"})),
                       "--grad-reduce-in-bf16: Megatron's flag, not built here: gradients reduce in fp32"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--softmax-type", "learnable"})),
                       "--softmax-type: Megatron's flag, not built here: gpt-oss's attention sinks"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--megatron-fsdp-main-grads-dtype", "bf16"})),
                       "--megatron-fsdp-main-grads-dtype: Megatron's flag, not built here: Megatron FSDP here keeps "
                       "fp32"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--multi-latent-attention", "--q-lora-rank", "1536"})),
                       "--multi-latent-attention: Megatron's flag, not built here: multi-latent attention"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--use-custom-fsdp"})),
                       "--use-custom-fsdp: Megatron's flag, not built here: Megatron FSDP is --use-megatron-fsdp"));
  YamlFile yaml("wandb_project: runs\n");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--config", yaml.path()})),
                       ": wandb_project: Megatron's flag, not built here: Weights & Biases logging: use "
                       "--tensorboard-dir"));
  EXPECT_TRUE(contains(parse_error(with(without("--hidden-size"), {"--hidden-size", "abc"})),
                       "--hidden-size 'abc': expected an integer"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--init-method-std", "x1"})),
                       "--init-method-std 'x1': expected a number"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--num-layers", "3"})), "--num-layers is given twice"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--swiglu=true"})), "--swiglu takes no value"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--seed"})), "--seed needs a value"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--normalization", "BatchNorm"})),
                       "--normalization 'BatchNorm': expected one of LayerNorm, RMSNorm"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--device", "tpu"})), "expected one of auto, cpu, cuda"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--model-preset", "gpt3"})),
                       "expected one of tiny, gpt2-124m, gpt2-350m"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"stray"})), "'stray' follows no flag"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--data-path"})), "--data-path needs at least one value"));
}

TEST(ParseArgs, UnknownFlagValuesDoNotPileUp) {
  const std::string error = parse_error(with(minimal_argv(), {"--hiden-size", "64", "128"}));
  EXPECT_TRUE(contains(error, "1 problem with the arguments"));
}

// Each rule: extra flags (or a replaced command line) and a recognisable part of its message.
TEST(ValidateArgs, EachRule) {
  struct Case {
    Argv argv;
    std::string message;
  };
  const std::vector<Case> cases = {
      {without("--lr"), "--lr is required"},
      {without("--micro-batch-size"), "--micro-batch-size is required"},
      {without("--train-iters"), "--train-iters is required"},
      {without("--num-layers"), "--num-layers is required"},
      {without("--vocab-size"), "NullTokenizer needs --vocab-size"},
      {without("--tokenizer-type"), "--tokenizer-type is required"},
      {with(without("--tokenizer-type"), {"--tokenizer-type", "GPT2BPETokenizer"}),
       "GPT2BPETokenizer needs --vocab-file"},
      {with(minimal_argv(), {"--tokenizer-model", "t.model"}), "NullTokenizer takes no --tokenizer-model"},
      {with(without("--num-attention-heads"), {"--num-attention-heads", "5"}),
       "--num-attention-heads 5 does not divide --hidden-size 64"},
      {with(minimal_argv(), {"--group-query-attention", "--num-query-groups", "3"}),
       "--num-query-groups 3 does not divide --num-attention-heads 4"},
      {with(minimal_argv(), {"--max-position-embeddings", "64"}), "--seq-length 128 exceeds"},
      {with(minimal_argv(), {"--position-embedding-type", "rope", "--rotary-percent", "2"}),
       "--rotary-percent 2 must lie in (0, 1]"},
      {with(minimal_argv(), {"--hidden-dropout", "1"}), "--hidden-dropout 1 must lie in [0, 1)"},
      {with(minimal_argv(), {"--fp16", "--bf16"}), "--fp16 and --bf16 are both given: choose one precision"},
      {with(minimal_argv(), {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16"}),
       "--exp-avg-dtype bf16: only fp32 optimizer state is built here"},
      {with(minimal_argv(), {"--main-grads-dtype", "bf16"}), "--main-grads-dtype bf16: only fp32"},
      {with(minimal_argv(), {"--fp16", "--loss-scale", "0"}), "--loss-scale 0 must be positive and at most 3.4e38"},
      {with(minimal_argv(), {"--initial-loss-scale", "1e39"}), "--initial-loss-scale 1e+39 must be positive"},
      {with(minimal_argv(), {"--min-loss-scale", "-1"}), "--min-loss-scale -1 must be positive"},
      {with(minimal_argv(), {"--min-loss-scale", "8", "--initial-loss-scale", "4"}),
       "--min-loss-scale 8 exceeds --initial-loss-scale 4"},
      {with(minimal_argv(), {"--loss-scale-window", "0.5"}), "--loss-scale-window 0.5 must be a whole number"},
      {with(minimal_argv(), {"--hysteresis", "0"}), "--hysteresis 0 must be >= 1"},
      {with(minimal_argv(), {"--pipeline-model-parallel-size", "2"}), "world size 1 is not a multiple of TP*CP*PP = 2"},
      {with(minimal_argv(), {"--global-batch-size", "5"}),
       "--global-batch-size 5 is not a multiple of --micro-batch-size 2 x data-parallel size 1 = 2: each step runs "
       "whole micro-batches on every replica; use e.g. 6"},
      {with(minimal_argv(), {"--save", "/tmp/ckpt"}), "--save /tmp/ckpt needs --save-interval"},
      {with(minimal_argv(), {"--finetune"}), "--finetune needs --load"},
      {with(minimal_argv(), {"--ckpt-step", "5"}), "--ckpt-step 5 chooses the iteration of --load DIR"},
      {with(minimal_argv(), {"--ckpt-step", "-1", "--load", "ckpt"}), "--ckpt-step -1 chooses the iteration"},
      {with(minimal_argv(), {"--data-path", "corpus"}), "--mock-data and data paths are mutually exclusive"},
      {without("--mock-data"), "no training data"},
      {with(with(without("--mock-data"), {"--data-path", "corpus", "--split", "100,0,0"}), {"--eval-interval", "5"}),
       "needs a validation split"},
      {with(with(without("--mock-data"), {"--data-path", "corpus"}), {"--split", "a,b"}), "--split 'a,b' must hold"},
      {with(minimal_argv(), {"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}),
       "--lr-warmup-fraction 0.1 and --lr-warmup-iters 2 are mutually exclusive"},
      {with(minimal_argv(), {"--lr-warmup-iters", "10"}), "--lr-warmup-iters 10 is not below --lr-decay-iters 10"},
      {with(minimal_argv(), {"--min-lr", "0.1"}), "--min-lr 0.1 exceeds --lr 0.001"},
      {with(minimal_argv(), {"--lr-decay-style", "WSD"}), "--lr-decay-style WSD needs --lr-wsd-decay-iters"},
      {with(minimal_argv(), {"--adam-beta2", "1"}), "--adam-beta2 1 must lie in [0, 1)"},
      {with(minimal_argv(), {"--log-interval", "0"}), "--log-interval 0 must be positive"},
      {with(minimal_argv(), {"--exit-interval", "-5"}), "--exit-interval -5 must be >= 0 iterations"},
      {with(minimal_argv(), {"--exit-duration-in-mins", "-1"}), "--exit-duration-in-mins -1 must be >= 0 minutes"},
      {with(minimal_argv(), {"--keep-last-checkpoints", "-2"}), "--keep-last-checkpoints -2 must be >= 0"},
      {with(minimal_argv(), {"--non-persistent-save-interval", "5"}),
       "--non-persistent-save-interval 5 needs --non-persistent-ckpt-type local"},
      {with(minimal_argv(), {"--non-persistent-ckpt-type", "global"}),
       "--non-persistent-ckpt-type global is not built here: use --non-persistent-ckpt-type local"},
      {with(minimal_argv(), {"--non-persistent-ckpt-type", "local"}),
       "--non-persistent-ckpt-type local needs --non-persistent-local-ckpt-dir DIR"},
      {with(minimal_argv(), {"--timing-log-level", "3"}), "--timing-log-level 3 must be 0, 1 or 2"},
      {with(minimal_argv(), {"--timing-log-option", "median"}),
       "--timing-log-option 'median': expected one of minmax, max, all"},
      {with(minimal_argv(), {"--straggler-minmax-count", "0"}), "--straggler-minmax-count 0 must be >= 1"},
      {with(minimal_argv(), {"--tensorboard-log-interval", "0"}), "--tensorboard-log-interval 0 must be positive"},
      {with(minimal_argv(), {"--tensorboard-queue-size", "-1"}), "--tensorboard-queue-size -1 must be positive"},
      {with(minimal_argv(), {"--non-persistent-local-ckpt-dir", "/tmp/x"}),
       "--non-persistent-local-ckpt-dir /tmp/x is used only with --non-persistent-ckpt-type local"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(contains(parse_error(c.argv), c.message));
  }
}

// Megatron's tensor-parallel rules, each naming the values and the fix (world of 4 ranks).
TEST(ValidateArgs, TensorParallelRules) {
  const auto tp = [](const std::string& size, const Argv& base, const Argv& extra) {
    return parse_error(with(with(base, {"--tensor-model-parallel-size", size}), extra), 4);
  };
  const Argv minimal = minimal_argv();
  EXPECT_EQ(tp("2", minimal, {}), "");
  EXPECT_EQ(tp("4", minimal, {"--sequence-parallel"}), "");
  EXPECT_TRUE(contains(tp("0", minimal, {}), "--tensor-model-parallel-size 0 must be positive"));
  EXPECT_TRUE(contains(tp("4", without("--num-attention-heads"), {"--num-attention-heads", "2"}),
                       "--num-attention-heads 2 is not divisible by --tensor-model-parallel-size 4: each TP rank "
                       "computes whole attention heads; use TP 2"));
  EXPECT_TRUE(contains(tp("4", minimal, {"--group-query-attention", "--num-query-groups", "2"}),
                       "--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4: each TP rank holds "
                       "whole query groups (key/value heads), so TP may not exceed them; use TP 2, or more query "
                       "groups"));
  EXPECT_TRUE(contains(tp("4", minimal, {"--ffn-hidden-size", "90"}),
                       "--ffn-hidden-size 90 is not divisible by --tensor-model-parallel-size 4"));
  const Argv seq_126 = with(without("--seq-length"), {"--seq-length", "126", "--max-position-embeddings", "128"});
  EXPECT_TRUE(contains(tp("4", seq_126, {"--sequence-parallel"}),
                       "--seq-length 126 is not divisible by --tensor-model-parallel-size 4 under "
                       "--sequence-parallel"));
  EXPECT_EQ(tp("4", seq_126, {}), "");  // without SP any length works
}

// The vocabulary pads to a multiple of --make-vocab-size-divisible-by x TP (reference §10.4).
TEST(ParseArgs, VocabPaddingScalesWithTp) {
  EXPECT_EQ(parse_training_args(minimal_argv(), 4).model.padded_vocab_size, 128);
  const Argv tp4 = with(minimal_argv(), {"--tensor-model-parallel-size", "4"});
  EXPECT_EQ(parse_training_args(tp4, 4).model.padded_vocab_size, 512);
  EXPECT_EQ(parse_training_args(with(tp4, {"--make-vocab-size-divisible-by", "32"}), 4).model.padded_vocab_size, 128);
}

// Megatron's sequence parallelism has no effect without TP (with a warning) instead of failing.
// The arguments keep what the user gave (a config never rewrites it); the context the layers read
// applies the rule.
TEST(ParseArgs, SequenceParallelTakesNoEffectWithoutTp) {
  const TrainingArgs tp1 = parse_training_args(with(minimal_argv(), {"--sequence-parallel", "--tp-comm-overlap"}));
  EXPECT_TRUE(tp1.parallel.sequence_parallel);
  EXPECT_TRUE(tp1.parallel.tp_comm_overlap);
  const ParallelContext ctx = model_context(ParallelContext::single_process(), tp1.parallel);
  EXPECT_TRUE(ctx.sequence_parallel_given);
  EXPECT_FALSE(ctx.sequence_parallel());
  EXPECT_FALSE(ctx.tp_comm_overlap());
  const Argv tp2 = with(minimal_argv(), {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  EXPECT_TRUE(parse_training_args(tp2, 2).parallel.sequence_parallel);
  // The context is built for the arguments' TP.
  EXPECT_TRUE(contains(megatron::testing::error_of([&] {
                         model_context(ParallelContext::single_process(), parse_training_args(tp2, 2).parallel);
                       }),
                       "the context's TP group has 1 ranks but the arguments ask for TP 2"));
}

// Megatron's rules for --tp-comm-overlap: nothing to overlap at TP = 1 (no effect), and the
// overlapped collectives are SP's, so without --sequence-parallel it is an error naming the fix.
TEST(ParseArgs, TpCommOverlapNeedsTpAndSequenceParallel) {
  EXPECT_EQ(parse_error(with(minimal_argv(), {"--tp-comm-overlap"})), "");
  const Argv tp2 = with(minimal_argv(), {"--tensor-model-parallel-size", "2", "--tp-comm-overlap"});
  EXPECT_TRUE(contains(parse_error(tp2, 2), "--tp-comm-overlap needs --sequence-parallel"));
  EXPECT_TRUE(parse_training_args(with(tp2, {"--sequence-parallel"}), 2).parallel.tp_comm_overlap);
}

namespace {

// --context-parallel-size 2 with dropout off (not built under CP), plus `extra`.
Argv cp2_argv(const Argv& extra = {}) {
  return with(minimal_argv(),
              with({"--context-parallel-size", "2", "--attention-dropout", "0", "--hidden-dropout", "0"}, extra));
}

// minimal_argv() with the value of --seq-length replaced (a flag given twice is an error).
Argv with_seq_length(Argv argv, int64_t S) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--seq-length") argv[i + 1] = std::to_string(S);
  return argv;
}

}  // namespace

TEST(ContextParallelArgs, ValidLayoutParses) {
  const TrainingArgs args = parse_training_args(cp2_argv(), 4);
  EXPECT_EQ(args.parallel.context_parallel_size, 2);
  EXPECT_EQ(args.parallel.cp_comm_type, "p2p");
  EXPECT_EQ(args.data_parallel_size, 2);
}

TEST(ContextParallelArgs, SequenceMustSplitIntoTwoChunksPerRank) {
  EXPECT_TRUE(contains(parse_error(with_seq_length(cp2_argv(), 126), 2),
                       "--seq-length 126 is not divisible by 2 x --context-parallel-size = 4"));
  // Under sequence parallelism each rank's S/CP positions split over TP as well.
  EXPECT_TRUE(contains(
      parse_error(with_seq_length(cp2_argv({"--tensor-model-parallel-size", "2", "--sequence-parallel"}), 12), 4),
      "--seq-length 12 is not divisible by 2 x --context-parallel-size x "
      "--tensor-model-parallel-size = 8 under --sequence-parallel"));
}

TEST(ContextParallelArgs, CombinationsNotBuiltAreRefusedWithTheFix) {
  const Argv with_dropout = with(minimal_argv(), {"--context-parallel-size", "2"});
  EXPECT_TRUE(contains(parse_error(with_dropout, 2), "add --attention-dropout 0 --hidden-dropout 0"));
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--pipeline-model-parallel-size", "2"}), 4),
                       "context and pipeline parallelism together are not built yet"));
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--window-size", "8,0"}), 2), "drop --window-size or use CP 1"));
  EXPECT_EQ(parse_error(cp2_argv({"--cp-comm-type", "allgather"}), 2), "");
  // a2a splits heads over CP: 4 heads at CP 2 do, 4 heads at CP 8 (with 4 query groups) do not.
  EXPECT_EQ(parse_error(cp2_argv({"--cp-comm-type", "a2a"}), 2), "");
  Argv cp8 = cp2_argv({"--cp-comm-type", "a2a"});
  *(std::find(cp8.begin(), cp8.end(), "--context-parallel-size") + 1) = "8";
  EXPECT_TRUE(contains(parse_error(cp8, 8), "each TP rank's 4 attention heads and 4 query groups must divide by CP"));
  // a2a+p2p: two hierarchical sizes whose product is CP, the first (the all-to-all) dividing heads.
  EXPECT_TRUE(contains(parse_error(cp2_argv({"--cp-comm-type", "a2a+p2p"}), 2),
                       "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P"));
  const auto hierarchical = [&](const std::string& a2a, const std::string& p2p) {
    return cp2_argv({"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", a2a, p2p});
  };
  EXPECT_EQ(parse_error(hierarchical("2", "1"), 2), "");
  EXPECT_TRUE(contains(parse_error(hierarchical("2", "2"), 2),
                       "--hierarchical-context-parallel-sizes 2 2 with --context-parallel-size 2: two positive "
                       "sizes whose product is CP"));
  EXPECT_TRUE(contains(parse_error(hierarchical("x", "2"), 2), "'x' is not an integer"));
  Argv a2a8 = hierarchical("8", "1");
  *(std::find(a2a8.begin(), a2a8.end(), "--context-parallel-size") + 1) = "8";
  EXPECT_TRUE(contains(parse_error(a2a8, 8), "query groups must divide by the all-to-all size 8"));
  EXPECT_TRUE(contains(parse_error(cp2_argv(), 3), "world size 3 is not a multiple of TP*CP*PP = 2"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--context-parallel-size", "0"}), 1),
                       "--context-parallel-size 0 must be positive"));
}

// Megatron FSDP: the strategy acts only with --use-megatron-fsdp; sharded strategies run on the
// distributed optimizer; sharded gradients and parameters are built for TP x DP of dense models.
TEST(MegatronFsdpArgs, StrategiesAndTheirCombinationsAreCheckedBeforeAnyWork) {
  const Argv fsdp = with(minimal_argv(), {"--use-megatron-fsdp"});
  const auto strategy = [&](const char* name) {
    return with(fsdp, {"--data-parallel-sharding-strategy", name, "--use-distributed-optimizer"});
  };
  EXPECT_EQ(parse_error(fsdp, 2), "");  // no_shard: plain DDP
  const TrainingArgs zero3 = parse_training_args(strategy("optim_grads_params"), 2);
  EXPECT_TRUE(zero3.use_megatron_fsdp);
  EXPECT_EQ(zero3.data_parallel_sharding_strategy, "optim_grads_params");
  for (const char* s : {"optim", "optim_grads"}) EXPECT_EQ(parse_error(strategy(s), 2), "") << s;
  EXPECT_EQ(parse_error(with(strategy("optim_grads_params"), {"--tensor-model-parallel-size", "2"}), 4), "");

  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--data-parallel-sharding-strategy", "optim_grads"}), 2),
                       "--data-parallel-sharding-strategy optim_grads takes effect only with --use-megatron-fsdp"));
  EXPECT_TRUE(contains(parse_error(with(fsdp, {"--data-parallel-sharding-strategy", "optim"}), 2),
                       "add --use-distributed-optimizer"));
  EXPECT_TRUE(
      contains(parse_error(with(fsdp, {"--use-distributed-optimizer"}), 2), "no_shard replicates the optimizer state"));
  EXPECT_TRUE(contains(parse_error(with(fsdp, {"--data-parallel-sharding-strategy", "zero3"}), 2),
                       "--data-parallel-sharding-strategy"));
  EXPECT_TRUE(contains(parse_error(with(strategy("optim_grads_params"), {"--pipeline-model-parallel-size", "2"}), 4),
                       "--data-parallel-sharding-strategy optim_grads_params with --pipeline-model-parallel-size 2"));
  EXPECT_TRUE(contains(parse_error(with(strategy("optim_grads"), {"--context-parallel-size", "2", "--attention-dropout",
                                                                  "0", "--hidden-dropout", "0"}),
                                   4),
                       "optim_grads with --context-parallel-size 2"));
  EXPECT_TRUE(
      contains(parse_error(with(strategy("optim_grads_params"), {"--disable-bias-linear", "--num-experts", "4"}), 2),
               "train the MoE model with --data-parallel-sharding-strategy optim"));
  // Sharding the optimizer state alone composes with every layout.
  EXPECT_EQ(parse_error(with(strategy("optim"), {"--pipeline-model-parallel-size", "2"}), 4), "");
}

// Expert parallelism: EP must divide DP = world / (TP x PP), with whole experts per EP rank.
TEST(ValidateArgs, ExpertParallelismDividesDp) {
  EXPECT_EQ(parse_error(with(minimal_argv(), {"--expert-model-parallel-size", "1"})), "");
  const Argv moe = with(minimal_argv(), {"--disable-bias-linear", "--num-experts", "4"});
  EXPECT_EQ(parse_error(with(moe, {"--expert-model-parallel-size", "4"}), 8), "");
  EXPECT_TRUE(contains(parse_error(with(moe, {"--expert-model-parallel-size", "4"}), 6),
                       "--expert-model-parallel-size 4 does not divide the data-parallel size 6"));
  EXPECT_TRUE(contains(parse_error(with(moe, {"--expert-model-parallel-size", "0"}), 2),
                       "--expert-model-parallel-size 0 must be positive"));
}

// Megatron's MoE flags fill TransformerConfig::moe and survive the round trip through flag text
// (what a checkpoint stores); --expert-tensor-parallel-size other than TP needs world size a
// multiple of expert TP x EP x PP (Megatron's expert layout).
TEST(ParseArgs, MoEFlags) {
  const TrainingArgs args = parse_training_args(with(minimal_argv(), {"--disable-bias-linear",
                                                                      "--num-experts",
                                                                      "8",
                                                                      "--moe-router-topk",
                                                                      "4",
                                                                      "--moe-layer-freq",
                                                                      "([1]+[0])*1",
                                                                      "--moe-router-score-function",
                                                                      "sigmoid",
                                                                      "--moe-router-enable-expert-bias",
                                                                      "--moe-router-num-groups",
                                                                      "4",
                                                                      "--moe-router-group-topk",
                                                                      "2",
                                                                      "--moe-expert-capacity-factor",
                                                                      "1.25",
                                                                      "--moe-token-drop-policy",
                                                                      "position",
                                                                      "--moe-router-load-balancing-type",
                                                                      "seq_aux_loss",
                                                                      "--moe-z-loss-coeff",
                                                                      "1e-3",
                                                                      "--moe-grouped-gemm",
                                                                      "--moe-token-dispatcher-type",
                                                                      "alltoall",
                                                                      "--expert-tensor-parallel-size",
                                                                      "1"}));
  const MoEConfig& m = args.model.moe;
  EXPECT_EQ(m.num_moe_experts, 8);
  EXPECT_EQ(m.moe_router_topk, 4);
  EXPECT_EQ(m.moe_layer_freq, "([1]+[0])*1");  // as given: Megatron's list expression
  EXPECT_EQ(m.moe_router_score_function, RouterScoreFunction::sigmoid);
  EXPECT_TRUE(m.moe_router_enable_expert_bias);
  EXPECT_EQ(m.moe_expert_capacity_factor, 1.25);
  EXPECT_EQ(m.moe_token_drop_policy, TokenDropPolicy::position);
  EXPECT_EQ(m.moe_router_load_balancing_type, LoadBalancingType::seq_aux_loss);
  EXPECT_EQ(m.moe_z_loss_coeff, 1e-3);
  EXPECT_EQ(m.moe_ffn_hidden_size, args.model.ffn_hidden_size);  // derived, as Megatron
  EXPECT_FALSE(m.moe_router_topk_scaling_factor.has_value());
  const auto flags = training_args_to_flags(args);
  EXPECT_EQ(training_args_to_flags(parse_training_args_from_flags(flags)), flags);
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--expert-tensor-parallel-size", "2"})),
                       "world size 1 is not a multiple of expert TP x EP x PP = 2 x 1 x 1 = 2"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--expert-tensor-parallel-size", "-1"})),
                       "--expert-tensor-parallel-size -1 must be positive"));
}

TEST(ValidateArgs, PipelineSplitAndScheduleRules) {
  // The split of layers and the schedule's shape are checked with the rest of the arguments.
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--num-virtual-stages-per-pipeline-rank", "2"})),
                       "the interleaved schedule needs more than one pipeline rank"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--decoder-first-pipeline-num-layers", "1",
                                                         "--account-for-loss-in-pipeline-split"})),
                       "Megatron does not combine"));
  // What training cannot run is named (world of 2: PP=2).
  const Argv pp2 = with(minimal_argv(), {"--pipeline-model-parallel-size", "2"});
  EXPECT_EQ(parse_error(pp2, 2), "");
  EXPECT_TRUE(
      contains(parse_error(with(pp2, {"--pipeline-model-parallel-layout", "E|tt|L"}), 2), "3 stages, not a multiple"));
  const Argv four_layers = with(without("--num-layers"), {"--num-layers", "4", "--pipeline-model-parallel-size", "2"});
  // Interleaving: the micro-batches in whole groups of P (--micro-batch-size 2: 4 samples are 2).
  const Argv interleaved = with(four_layers, {"--num-virtual-stages-per-pipeline-rank", "2"});
  EXPECT_EQ(parse_error(with(interleaved, {"--global-batch-size", "4"}), 2), "");
  EXPECT_TRUE(contains(parse_error(with(interleaved, {"--global-batch-size", "6"}), 2),
                       "leave a last group of 1, below the pipeline size 2"));
  // ... at every batch size of a ramp: START 2 is one micro-batch.
  Argv ramp =
      with(without("--train-iters"), {"--train-samples", "1000", "--pipeline-model-parallel-size", "2",
                                      "--num-virtual-stages-per-pipeline-rank", "2", "--global-batch-size", "8"});
  *(std::find(ramp.begin(), ramp.end(), "--num-layers") + 1) = "4";
  EXPECT_EQ(parse_error(with(ramp, {"--rampup-batch-size", "4", "4", "100"}), 2), "");
  EXPECT_TRUE(contains(parse_error(with(ramp, {"--rampup-batch-size", "2", "2", "100"}), 2),
                       "make START and INCREMENT multiples of 4"));
  // Groups larger than the pipeline need the overlapped p2p (Megatron's default, interleaved only).
  const Argv groups_of_4 =
      with(interleaved, {"--global-batch-size", "8", "--microbatch-group-size-per-virtual-pipeline-stage", "4"});
  EXPECT_EQ(parse_error(groups_of_4, 2), "");
  EXPECT_TRUE(parse_training_args(groups_of_4, 2).pipeline_overlaps_p2p());
  EXPECT_FALSE(parse_training_args(with(pp2, {"--global-batch-size", "4"}), 2).pipeline_overlaps_p2p());
  EXPECT_TRUE(contains(parse_error(with(groups_of_4, {"--no-overlap-p2p-communication"}), 2),
                       "fix: drop --no-overlap-p2p-communication, or leave the group size at its default, 2"));
  // Tied embeddings with the distributed optimizer and the overlapped reduction (Megatron's own
  // bucket for the shared embedding).
  EXPECT_EQ(
      parse_error(with(pp2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--global-batch-size", "4"}), 2),
      "");
}

TEST(ValidateArgs, WorldSizeMustHoldTheModelLayout) {
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--tensor-model-parallel-size", "2"}), 3),
                       "world size 3 is not a multiple of TP*CP*PP = 2"));
}

TEST(ValidateArgs, AllProblemsListedAtOnce) {
  const std::string error =
      parse_error(with(without("--num-attention-heads"), {"--num-attention-heads", "5", "--attention-dropout", "1.5",
                                                          "--save", "ckpt", "--fp16", "--bf16"}));
  EXPECT_TRUE(contains(error, "4 problems with the arguments"));
  EXPECT_TRUE(contains(error, "--num-attention-heads 5 does not divide"));
  EXPECT_TRUE(contains(error, "--attention-dropout 1.5"));
  EXPECT_TRUE(contains(error, "--save ckpt needs --save-interval"));
  EXPECT_TRUE(contains(error, "--fp16"));
}

TEST(ValidateArgs, ValidArgsHaveNoProblems) {
  TrainingArgs args = parse_training_args(minimal_argv());
  EXPECT_TRUE(validate(args).empty());
  args.device = "tpu";  // set by code, not by the parser
  ASSERT_EQ(validate(args).size(), 1u);
  EXPECT_TRUE(contains(validate(args).front(), "--device tpu: expected one of auto, cpu, cuda"));
}

TEST(ArgsToFlags, RoundTrip) {
  YamlFile yaml("model_preset: llama-tiny\nuntie_embeddings_and_output_weights: false\n");
  const TrainingArgs args = parse_training_args({"--config",
                                                 yaml.path(),
                                                 "--micro-batch-size",
                                                 "2",
                                                 "--global-batch-size",
                                                 "8",
                                                 "--train-iters",
                                                 "100",
                                                 "--lr",
                                                 "3e-4",
                                                 "--min-lr",
                                                 "3e-5",
                                                 "--lr-decay-style",
                                                 "inverse-square-root",
                                                 "--lr-warmup-fraction",
                                                 "0.05",
                                                 "--norm-epsilon",
                                                 "1e-6",
                                                 "--rotary-percent",
                                                 "0.5",
                                                 "--bf16",
                                                 "--data-path",
                                                 "0.25",
                                                 "a",
                                                 "0.75",
                                                 "b",
                                                 "--split",
                                                 "90,10,0",
                                                 "--eval-interval",
                                                 "10",
                                                 "--tokenizer-type",
                                                 "ByteTokenizer",
                                                 "--save",
                                                 "/tmp/run",
                                                 "--save-interval",
                                                 "50",
                                                 "--no-save-optim",
                                                 "--metrics-file",
                                                 "m.jsonl",
                                                 "--device",
                                                 "cpu"},
                                                2);
  const auto flags = training_args_to_flags(args);
  const TrainingArgs back = parse_training_args_from_flags(flags, 2);
  EXPECT_EQ(training_args_to_flags(back), flags);
  // Fields that are not flags come back by derivation.
  EXPECT_EQ(back.model.padded_vocab_size, args.model.padded_vocab_size);
  EXPECT_EQ(back.model.params_dtype, DType::bf16);
  EXPECT_EQ(back.data_parallel_size, 2);
  EXPECT_FALSE(back.model.untie_embeddings_and_output_weights);  // YAML beat the preset, and still does
  EXPECT_EQ(back.model.layernorm_epsilon, 1e-6f);
  EXPECT_EQ(back.optimizer.min_lr, 3e-5);
  EXPECT_EQ(back.optimizer.lr_warmup_fraction, 0.05);
  EXPECT_EQ(back.data.data_path, args.data.data_path);

  // One pair per flag, --config excepted; unset values are "".
  EXPECT_EQ(std::count_if(flags.begin(), flags.end(), [](const auto& f) { return f.first == "--config"; }), 0);
  const auto find = [&](const std::string& name) {
    return std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == name; })->second;
  };
  EXPECT_EQ(find("--disable-bias-linear"), "true");
  EXPECT_EQ(find("--swiglu"), "true");
  EXPECT_EQ(find("--lr-decay-style"), "inverse-square-root");
  EXPECT_EQ(find("--load"), "");
  EXPECT_EQ(find("--data-path"), "0.25 a 0.75 b");

  // Defaults and unset values ("") survive too.
  const auto minimal = training_args_to_flags(parse_training_args(minimal_argv()));
  EXPECT_EQ(training_args_to_flags(parse_training_args_from_flags(minimal)), minimal);
}

TEST(Help, ListsEveryFlag) {
  const std::string help = training_args_help();
  for (const auto& [flag, value] : training_args_to_flags(TrainingArgs{})) {
    // Followed by its value's kind or help, or by a line break where the name is too long for the column.
    EXPECT_TRUE(contains(help, "  " + flag + " ") || contains(help, "  " + flag + "\n")) << flag;
  }
  EXPECT_TRUE(contains(help, "--config FILE.yaml"));
  EXPECT_TRUE(contains(help, "--normalization {LayerNorm,RMSNorm}"));
  EXPECT_TRUE(contains(help, "[default: 1234]"));
  EXPECT_TRUE(contains(help, "one of tiny, gpt2-124m"));
}

TEST(ParseArgs, SlidingWindowAndRopeScaling) {
  const TrainingArgs args =
      parse_training_args(with(minimal_argv(), {"--window-size", "(7, 0)", "--position-embedding-type", "rope",
                                                "--use-rope-scaling", "--rope-scaling-factor", "32"}));
  EXPECT_EQ(args.model.window_size_left, 7);
  EXPECT_EQ(args.model.window_size_right, 0);
  EXPECT_TRUE(args.model.use_rope_scaling);
  EXPECT_EQ(args.model.rope_scaling_factor, 32.0f);
  const TrainingArgs plain = parse_training_args(minimal_argv());
  EXPECT_EQ(plain.model.window_size_left, -1);
  EXPECT_FALSE(plain.model.use_rope_scaling);

  EXPECT_NE(parse_error(with(minimal_argv(), {"--window-size", "7"})).find("--window-size '7' is not two integers"),
            std::string::npos);
  EXPECT_NE(parse_error(with(minimal_argv(), {"--window-size", "7,3"})).find("the right size must be 0"),
            std::string::npos);
  EXPECT_NE(parse_error(with(minimal_argv(), {"--use-rope-scaling"})).find("--position-embedding-type is not rope"),
            std::string::npos);
}

// --rotary-seq-len-interpolation-factor: Megatron's integer, read with RoPE only.
TEST(ParseArgs, RotarySeqLenInterpolationFactor) {
  const Argv rope = with(minimal_argv(), {"--position-embedding-type", "rope"});
  EXPECT_FALSE(parse_training_args(rope).model.rotary_seq_len_interpolation_factor.has_value());
  EXPECT_EQ(parse_training_args(with(rope, {"--rotary-seq-len-interpolation-factor", "4"}))
                .model.rotary_seq_len_interpolation_factor,
            4);
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--rotary-seq-len-interpolation-factor", "4"})),
                       "--rotary-seq-len-interpolation-factor 4 interpolates RoPE positions, but "
                       "--position-embedding-type is not rope"));
  EXPECT_TRUE(contains(parse_error(with(rope, {"--rotary-seq-len-interpolation-factor", "0"})),
                       "--rotary-seq-len-interpolation-factor 0 must be >= 1"));
}

// Megatron's optimizer flags: --optimizer adam is the optimizer built; the others, and the
// flags only they read, are refused naming what to do. --apply-wd-to-qk-layernorm and its
// deprecated spelling say the same.
TEST(ParseArgs, OptimizerChoiceAndQkLayernormDecay) {
  EXPECT_EQ(parse_training_args(minimal_argv()).optimizer.optimizer, "adam");
  EXPECT_EQ(parse_error(with(minimal_argv(), {"--optimizer", "adam"})), "");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--optimizer", "sgd"})),
                       "--optimizer sgd is not built here: the optimizer is Adam with decoupled weight decay"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--optimizer", "adamw"})),
                       "--optimizer 'adamw': expected one of adam, sgd, muon, dist_muon, lion, soap, adaptive_muon"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--sgd-momentum", "0.9"})),
                       "--sgd-momentum: Megatron's flag, not built here: the optimizer here is Adam"));

  EXPECT_FALSE(parse_training_args(minimal_argv()).optimizer.decays_qk_layernorm());
  EXPECT_TRUE(
      parse_training_args(with(minimal_argv(), {"--apply-wd-to-qk-layernorm"})).optimizer.decays_qk_layernorm());
  EXPECT_TRUE(parse_training_args(with(minimal_argv(), {"--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"}))
                  .optimizer.decays_qk_layernorm());
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--no-weight-decay-cond-type", "biases"})),
                       "expected one of apply_wd_to_qk_layernorm"));
}

// --dist-ckpt-strictness: Megatron's values and default (what each does: CheckpointIo tests).
TEST(ParseArgs, DistCkptStrictnessTakesMegatronsValues) {
  EXPECT_EQ(parse_training_args(minimal_argv()).dist_ckpt_strictness, "assume_ok_unexpected");
  EXPECT_EQ(parse_training_args(with(minimal_argv(), {"--dist-ckpt-strictness", "log_all"})).dist_ckpt_strictness,
            "log_all");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--dist-ckpt-strictness", "strict"})),
                       "expected one of assume_ok_unexpected, log_unexpected, log_all, raise_unexpected, raise_all, "
                       "return_unexpected, return_all, ignore_all"));
}

TEST(ParseArgs, OverrideCkptIterationNeedsLoadWithoutFinetune) {
  EXPECT_FALSE(parse_training_args(minimal_argv()).override_ckpt_iteration.has_value());
  for (const Argv& wrong :
       {Argv{"--override-ckpt-iteration", "3"}, Argv{"--override-ckpt-iteration", "-1", "--load", "/nonexistent-dir"},
        Argv{"--override-ckpt-iteration", "3", "--load", "/nonexistent-dir", "--finetune"}})
    EXPECT_TRUE(contains(parse_error(with(minimal_argv(), wrong)), "--override-ckpt-iteration "))
        << parse_error(with(minimal_argv(), wrong));
}

// Megatron's old flags that Megatron itself refuses are refused naming their successors.
TEST(ParseArgs, MegatronsRetiredFlagsNameTheirSuccessors) {
  const std::pair<Argv, std::string> cases[] = {
      {{"--batch-size", "8"}, "use --micro-batch-size"},
      {{"--warmup", "100"}, "use --lr-warmup-fraction or --lr-warmup-iters"},
      {{"--model-parallel-size", "2"}, "use --tensor-model-parallel-size"},
      {{"--checkpoint-activations"}, "use --recompute-activations"},
  };
  for (const auto& [given, successor] : cases)
    EXPECT_TRUE(contains(
        parse_error(with(minimal_argv(), given)),
        given[0] + ": Megatron's flag, not built here: Megatron's old flag, refused by Megatron too: " + successor))
        << given[0] << ": " << parse_error(with(minimal_argv(), given));
}

// Every flag of Megatron-LM's GPT, LLaMA, Mixtral and DeepSeek example scripts (examples/gpt3,
// llama, mixtral, megatron_fsdp and post_training/modelopt/conf's Qwen, Llama, DeepSeek and
// Nemotron-Mini configs, at commit d98e8a6 of 2026-08-22) is known: a row of the table or one named
// as not built, never an unknown flag.
TEST(ParseArgs, EveryFlagOfMegatronsExampleScriptsIsKnown) {
  const char* const flags[] = {
      "--adam-beta1",
      "--adam-beta2",
      "--add-qkv-bias",
      "--apply-layernorm-1p",
      "--attention-backend",
      "--attention-dropout",
      "--attention-softmax-in-fp32",
      "--auto-detect-ckpt-format",
      "--bf16",
      "--calculate-per-token-loss",
      "--ckpt-format",
      "--clip-grad",
      "--context-parallel-size",
      "--cross-entropy-loss-fusion",
      "--cuda-graph-impl",
      "--data-cache-path",
      "--data-parallel-sharding-strategy",
      "--data-path",
      "--decoder-first-pipeline-num-layers",
      "--decoder-last-pipeline-num-layers",
      "--decoupled-lr",
      "--decoupled-min-lr",
      "--disable-bias-linear",
      "--dist-ckpt-strictness",
      "--distributed-timeout-minutes",
      "--empty-unused-memory-level",
      "--enable-experimental",
      "--eval-interval",
      "--eval-iters",
      "--exit-duration-in-mins",
      "--expert-model-parallel-size",
      "--expert-tensor-parallel-size",
      "--ffn-hidden-size",
      "--fp16",
      "--fp8-amax-compute-algo",
      "--fp8-amax-history-len",
      "--fp8-format",
      "--fp8-param-gather",
      "--fsdp-db-use-persist-buf-on-alloc-fail",
      "--fsdp-double-buffer",
      "--fsdp-manual-registration",
      "--global-batch-size",
      "--grad-reduce-in-bf16",
      "--group-query-attention",
      "--hidden-dropout",
      "--hidden-size",
      "--init-method-std",
      "--init-model-with-meta-device",
      "--kv-channels",
      "--kv-lora-rank",
      "--load",
      "--log-interval",
      "--log-memory-to-tensorboard",
      "--log-num-zeros-in-grad",
      "--log-params-norm",
      "--log-throughput",
      "--log-timers-to-tensorboard",
      "--log-validation-ppl-to-tensorboard",
      "--logging-level",
      "--lr",
      "--lr-decay-iters",
      "--lr-decay-samples",
      "--lr-decay-style",
      "--lr-warmup-fraction",
      "--lr-warmup-init",
      "--lr-warmup-iters",
      "--lr-warmup-samples",
      "--make-vocab-size-divisible-by",
      "--manual-gc",
      "--manual-gc-interval",
      "--max-position-embeddings",
      "--megatron-fsdp-grad-comm-dtype",
      "--megatron-fsdp-main-grads-dtype",
      "--megatron-fsdp-main-params-dtype",
      "--megatron-fsdp-max-pool-double-buffer",
      "--memory-snapshot-path",
      "--merge-file",
      "--micro-batch-size",
      "--min-lr",
      "--mock-data",
      "--moe-aux-loss-coeff",
      "--moe-ffn-hidden-size",
      "--moe-flex-dispatcher-backend",
      "--moe-grouped-gemm",
      "--moe-layer-freq",
      "--moe-layer-recompute",
      "--moe-permute-fusion",
      "--moe-router-bias-update-rate",
      "--moe-router-dtype",
      "--moe-router-enable-expert-bias",
      "--moe-router-force-load-balancing",
      "--moe-router-group-topk",
      "--moe-router-load-balancing-type",
      "--moe-router-num-groups",
      "--moe-router-pre-softmax",
      "--moe-router-score-function",
      "--moe-router-topk",
      "--moe-router-topk-scaling-factor",
      "--moe-shared-expert-intermediate-size",
      "--moe-shared-expert-overlap",
      "--moe-token-dispatcher-type",
      "--moe-token-drop-policy",
      "--mscale",
      "--mscale-all-dim",
      "--mtp-loss-scaling-factor",
      "--mtp-num-layers",
      "--multi-latent-attention",
      "--no-bias-swiglu-fusion",
      "--no-check-for-nan-in-loss-and-grad",
      "--no-create-attention-mask-in-dataloader",
      "--no-gradient-accumulation-fusion",
      "--no-load-optim",
      "--no-load-rng",
      "--no-masked-softmax-fusion",
      "--no-mmap-bin-files",
      "--no-position-embedding",
      "--no-rope-freq",
      "--no-rope-fusion",
      "--norm-epsilon",
      "--normalization",
      "--num-attention-heads",
      "--num-distributed-optimizer-instances",
      "--num-experts",
      "--num-layers",
      "--num-query-groups",
      "--num-workers",
      "--outer-dp-sharding-strategy",
      "--overlap-grad-reduce",
      "--overlap-param-gather",
      "--pipeline-model-parallel-size",
      "--position-embedding-type",
      "--profile",
      "--profile-ranks",
      "--profile-step-end",
      "--profile-step-start",
      "--q-lora-rank",
      "--qk-head-dim",
      "--qk-layernorm",
      "--qk-pos-emb-head-dim",
      "--recompute-activations",
      "--recompute-granularity",
      "--recompute-modules",
      "--record-memory-history",
      "--rope-scaling-factor",
      "--rotary-base",
      "--rotary-interleaved",
      "--rotary-percent",
      "--rotary-scaling-factor",
      "--rotary-seq-len-interpolation-factor",
      "--save",
      "--save-interval",
      "--seq-length",
      "--sequence-parallel",
      "--split",
      "--squared-relu",
      "--step-batch-size-schedule",
      "--swiglu",
      "--tensor-model-parallel-size",
      "--tensorboard-dir",
      "--tiktoken-pattern",
      "--tokenizer-model",
      "--tokenizer-type",
      "--train-iters",
      "--train-samples",
      "--transformer-impl",
      "--untie-embeddings-and-output-weights",
      "--use-distributed-optimizer",
      "--use-flash-attn",
      "--use-mcore-models",
      "--use-megatron-fsdp",
      "--use-nccl-ub",
      "--use-precision-aware-optimizer",
      "--use-rope-scaling",
      "--use-rotary-position-embeddings",
      "--v-head-dim",
      "--vocab-file",
      "--vocab-size",
      "--wandb-exp-name",
      "--wandb-project",
      "--weight-decay",
  };
  for (const char* flag : flags) {
    const std::string error = parse_error(with(minimal_argv(), {flag}));
    EXPECT_FALSE(contains(error, std::string(flag) + ": unknown flag")) << error;
  }
}

// Megatron features not built here are named so, with what the run does instead.
TEST(ParseArgs, UnbuiltMegatronFeaturesAreNamed) {
  const std::pair<Argv, std::string> cases[] = {
      {{"--fim-data"}, "fill-in-the-middle data (Megatron's GPTFIMDataset) is not built"},
      {{"--fim-rate", "0.9"}, "fill-in-the-middle data (Megatron's GPTFIMDataset) is not built"},
      {{"--muon-momentum", "0.95"}, "the optimizer here is Adam with decoupled weight decay"},
      {{"--yaml-cfg", "run.yaml"}, "Megatron's nested YAML configuration is not read: --config takes"},
      {{"--hybrid-layer-pattern", "M*M*"}, "Mamba and other hybrid or heterogeneous layer stacks are not built"},
      {{"--decoder-num-layers", "4"}, "a GPT model's depth is --num-layers"},
  };
  for (const auto& [given, instead] : cases)
    EXPECT_TRUE(
        contains(parse_error(with(minimal_argv(), given)), given[0] + ": Megatron's flag, not built here: " + instead))
        << parse_error(with(minimal_argv(), given));
}

TEST(ParseArgs, MoeLayerRecomputeIsSelectiveWithMoe) {
  const TrainingArgs args = parse_training_args(
      with(minimal_argv(), {"--num-experts", "4", "--disable-bias-linear", "--moe-layer-recompute"}));
  EXPECT_TRUE(args.model.recompute.recomputes("moe"));
  EXPECT_TRUE(
      contains(parse_error(with(minimal_argv(), {"--moe-layer-recompute", "--recompute-granularity", "full",
                                                 "--recompute-method", "uniform", "--recompute-num-layers", "1"})),
               "--moe-layer-recompute is Megatron's deprecated spelling"));
}

TEST(ParseArgs, RecomputeFlags) {
  const TrainingArgs a = parse_training_args(
      with(minimal_argv(), {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}));
  EXPECT_TRUE(a.model.recompute.recomputes("mlp"));
  EXPECT_TRUE(a.model.recompute.recomputes("core_attn"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--recompute-granularity", "partial"})),
                       "--recompute-granularity 'partial': expected one of full, selective"));
  // Megatron's bound is the layers per pipeline rank: 4 layers over PP = 2 allow at most 2.
  const Argv four_layers = with(without("--num-layers"), {"--num-layers", "4", "--pipeline-model-parallel-size", "2"});
  const Argv full = {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers"};
  EXPECT_EQ(parse_error(with(with(four_layers, full), {"2"}), 2), "");
  EXPECT_TRUE(contains(parse_error(with(with(four_layers, full), {"3"}), 2),
                       "--recompute-num-layers 3 must lie between 1 and the layers per pipeline rank (2"));
}

TEST(ParseArgs, Fp8Flags) {
  // Megatron's defaults: off, delayed, margin 0, history 1, most_recent, first/last 1 layer each.
  const TrainingArgs off = parse_training_args(minimal_argv());
  EXPECT_FALSE(off.model.fp8.enabled());
  EXPECT_EQ(off.model.fp8.fp8_recipe, "delayed");
  EXPECT_EQ(off.model.fp8.fp8_margin, 0);
  EXPECT_EQ(off.model.fp8.fp8_amax_history_len, 1);
  EXPECT_EQ(off.model.fp8.fp8_amax_compute_algo, "most_recent");
  EXPECT_EQ(off.model.fp8.num_layers_at_start_in_bf16, 1);
  EXPECT_EQ(off.model.fp8.num_layers_at_end_in_bf16, 1);

  const Argv hybrid = {"--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo",
                       "max",    "--fp8-margin", "1"};
  const TrainingArgs a = parse_training_args(with(minimal_argv(), hybrid));
  const ops::Fp8Recipe recipe = a.model.fp8.recipe();
  EXPECT_EQ(recipe.forward_dtype, DType::e4m3);
  EXPECT_EQ(recipe.backward_dtype, DType::e5m2);
  EXPECT_EQ(recipe.scaling, ops::Fp8Scaling::delayed);
  EXPECT_EQ(recipe.amax_history_len, 16);
  EXPECT_EQ(recipe.amax_compute_algo, ops::AmaxComputeAlgo::max);
  EXPECT_EQ(recipe.margin, 1);
  const ops::Fp8Recipe tensorwise =
      parse_training_args(with(minimal_argv(), {"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}))
          .model.fp8.recipe();
  EXPECT_EQ(tensorwise.backward_dtype, DType::e4m3);
  EXPECT_EQ(tensorwise.scaling, ops::Fp8Scaling::current);
  const ops::Fp8Recipe blockwise =
      parse_training_args(with(minimal_argv(), {"--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}))
          .model.fp8.recipe();
  EXPECT_EQ(blockwise.scaling, ops::Fp8Scaling::blockwise);
  EXPECT_EQ(blockwise.forward_dtype, DType::e4m3);
  EXPECT_EQ(blockwise.backward_dtype, DType::e5m2);  // hybrid, as Transformer Engine's Float8BlockScaling takes it
  EXPECT_EQ(blockwise.amax_history_len, 1);

  const auto error = [&](const Argv& extra) { return parse_error(with(minimal_argv(), extra)); };
  EXPECT_TRUE(contains(error({"--fp8-format", "e4m3"}), "add --bf16"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--device", "cpu"}), "but --device is cpu"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e5m2"}), "--fp8-format 'e5m2': expected one of e4m3, hybrid"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"}),
                       "--fp8-recipe mxfp8: Megatron's recipe, not built here"));
  EXPECT_TRUE(
      contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--fp8-amax-history-len", "16"}),
               "apply to --fp8-recipe delayed only: blockwise scales each 1x128 tile"));
  // --fp8-param-gather: on the distributed optimizer's f32 masters, per-tensor recipes, FP8 runs only.
  EXPECT_TRUE(parse_training_args(with(minimal_argv(), {"--bf16", "--fp8-format", "e4m3", "--fp8-param-gather",
                                                        "--use-distributed-optimizer"}))
                  .model.fp8.fp8_param_gather);
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-param-gather"}),
                       "--fp8-param-gather needs --use-distributed-optimizer"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--fp8-param-gather",
                              "--use-distributed-optimizer"}),
                       "--fp8-param-gather with --fp8-recipe blockwise: FP8 parameters are built for the per-tensor"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-param-gather", "--use-distributed-optimizer",
                              "--use-precision-aware-optimizer"}),
                       "--fp8-param-gather with --use-precision-aware-optimizer: FP8 parameters keep f32 masters"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-param-gather"}), "--fp8-param-gather applies to FP8 training only"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-amax-history-len", "0"}),
                       "--fp8-amax-history-len 0 must be >= 1"));
  EXPECT_TRUE(contains(error({"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--fp8-margin", "2"}),
                       "apply to --fp8-recipe delayed only"));
  EXPECT_TRUE(contains(error({"--bf16", "--first-last-layers-bf16"}), "applies to FP8 training only"));
  EXPECT_TRUE(contains(
      error({"--bf16", "--fp8-format", "e4m3", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2"}),
      "exceed --num-layers 2"));
}

TEST(Fp8Config, FirstLastLayersBf16) {
  Fp8Config f;
  EXPECT_FALSE(f.layer_in_fp8(0, 4));  // FP8 off
  f.fp8_format = "hybrid";
  for (int64_t layer = 0; layer < 4; ++layer) EXPECT_TRUE(f.layer_in_fp8(layer, 4));
  f.first_last_layers_bf16 = true;
  f.num_layers_at_end_in_bf16 = 2;
  EXPECT_FALSE(f.layer_in_fp8(0, 4));
  EXPECT_TRUE(f.layer_in_fp8(1, 4));
  EXPECT_FALSE(f.layer_in_fp8(2, 4));
  EXPECT_FALSE(f.layer_in_fp8(3, 4));
}

// The implementation choices of a Megatron llama launch script (Megatron's examples and the
// scripts users bring): accepted, recorded, and nothing else about the run differs.
TEST(MegatronImplementationChoices, ALaunchScriptsChoicesParseAndChangeNothingElse) {
  const Argv llama =
      with(minimal_argv(), {"--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm",
                            "--disable-bias-linear", "--untie-embeddings-and-output-weights"});
  const Argv choices = {"--use-mcore-models",
                        "--transformer-impl",
                        "local",
                        "--use-flash-attn",
                        "--attention-backend",
                        "flash",
                        "--no-masked-softmax-fusion",
                        "--no-bias-gelu-fusion",
                        "--no-bias-swiglu-fusion",
                        "--no-bias-dropout-fusion",
                        "--no-rope-fusion",
                        "--no-persist-layer-norm",
                        "--no-gradient-accumulation-fusion",
                        "--attention-softmax-in-fp32",
                        "--cross-entropy-loss-fusion",
                        "--cross-entropy-fusion-impl",
                        "te",
                        "--moe-permute-fusion",
                        "--accumulate-allreduce-grads-in-fp32",
                        "--no-mmap-bin-files",
                        "--no-create-attention-mask-in-dataloader",
                        "--auto-detect-ckpt-format",
                        "--ckpt-format",
                        "torch_dist",
                        "--distributed-backend",
                        "gloo",
                        "--manual-gc",
                        "--manual-gc-interval",
                        "100",
                        "--empty-unused-memory-level",
                        "1",
                        "--use-cpu-initialization",
                        "--use-checkpoint-args",
                        "--init-model-with-meta-device",
                        "--use-nccl-ub",
                        "--fsdp-double-buffer",
                        "--fsdp-manual-registration",
                        "--megatron-fsdp-max-pool-double-buffer",
                        "--fsdp-db-use-persist-buf-on-alloc-fail",
                        "--disable-gloo-process-groups",
                        "--enable-experimental",
                        "--disable-bf16-reduced-precision-matmul",
                        "--cuda-graph-impl",
                        "local",
                        "--no-save-rng",
                        "--no-load-rng",
                        "--moe-router-dtype",
                        "fp32",
                        "--rope-type",
                        "rope",
                        "--use-rotary-position-embeddings",
                        "--no-position-embedding",
                        "--use-dist-ckpt",
                        "--dist-ckpt-format",
                        "zarr",
                        "--ckpt-fully-parallel-save",
                        "--num-dataset-builder-threads",
                        "8",
                        "--dist-ckpt-workers",
                        "2",
                        "--ddp-pad-buckets-for-high-nccl-busbw",
                        "--no-gradient-reduce-div-fusion",
                        "--ddp-reduce-scatter-with-fp32-accumulation",
                        "--moe-shared-expert-overlap",
                        "--openai-gelu"};
  const TrainingArgs plain = parse_training_args(llama);
  TrainingArgs given = parse_training_args(with(llama, choices));
  EXPECT_EQ(given.implementation.transformer_impl, "local");
  EXPECT_FALSE(given.implementation.gradient_accumulation_fusion);
  EXPECT_EQ(given.implementation.empty_unused_memory_level, 1);

  // One log line for each choice given, in the table's order, each naming its flag (and value).
  const std::vector<std::string> lines = flags_without_effect(given);
  std::vector<std::string> named;  // the flags of `choices`, values left out
  for (const std::string& word : choices)
    if (word.rfind("--", 0) == 0) named.push_back(word);
  ASSERT_EQ(lines.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_EQ(lines[i].rfind(named[i], 0), 0u) << lines[i] << " should name " << named[i];
  EXPECT_TRUE(contains(lines[0], "--use-mcore-models: Megatron's implementation choice, no effect: "));
  EXPECT_TRUE(contains(lines[1], "--transformer-impl local: "));
  EXPECT_TRUE(flags_without_effect(plain).empty());
  // A choice given at Megatron's default is not named.
  EXPECT_TRUE(
      flags_without_effect(parse_training_args(with(llama, {"--transformer-impl", "transformer_engine"}))).empty());

  // Apart from the choices themselves, every flag's value is the plain run's.
  given.implementation = plain.implementation;
  EXPECT_EQ(training_args_to_flags(given), training_args_to_flags(plain));
}

TEST(ParseArgs, DataloaderTypeSingleOnly) {
  EXPECT_EQ(parse_training_args(with(minimal_argv(), {"--dataloader-type", "single"})).data.dataloader_type, "single");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--dataloader-type", "cyclic"})),
                       "--dataloader-type cyclic is not built here: the loader is Megatron's single sampler"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--dataloader-type", "random"})),
                       "--dataloader-type 'random': expected one of single, cyclic, external"));
}

// Megatron's --profile: the capture range's defaults and rules; the PyTorch profiler's flags are
// named as not built, with what to use instead.
TEST(ParseArgs, ProfileFlags) {
  const TrainingArgs plain = parse_training_args(minimal_argv());
  EXPECT_FALSE(plain.profile);
  EXPECT_EQ(plain.profile_step_start, 10);  // Megatron's defaults
  EXPECT_EQ(plain.profile_step_end, 12);
  EXPECT_TRUE(plain.profiles_rank(0));
  const TrainingArgs two =
      parse_training_args(with(minimal_argv(), {"--profile", "--profile-step-start", "3", "--profile-step-end", "5",
                                                "--profile-ranks", "1", "3", "--tensor-model-parallel-size", "1"}),
                          4);
  EXPECT_TRUE(two.profile);
  EXPECT_EQ(two.profile_step_start, 3);
  EXPECT_EQ(two.profile_step_end, 5);
  EXPECT_FALSE(two.profiles_rank(0));
  EXPECT_TRUE(two.profiles_rank(1));
  EXPECT_FALSE(two.profiles_rank(2));
  EXPECT_TRUE(two.profiles_rank(3));
  EXPECT_TRUE(
      contains(parse_error(with(minimal_argv(), {"--profile", "--profile-step-start", "5", "--profile-step-end", "5"})),
               "--profile-step-start 5 and --profile-step-end 5: --profile captures the iterations after"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--profile", "--profile-ranks", "0", "2"}), 2),
                       "--profile-ranks 2: each must be a global rank, 0 to 1 in this run of 2 rank(s)"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--profile", "--profile-ranks", "x"})),
                       "--profile-ranks x: each must be a global rank"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--profile-ranks", "0"})),
                       "--profile-ranks is read only with --profile"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--profile", "--use-pytorch-profiler"})),
                       "--use-pytorch-profiler: Megatron's flag, not built here: there is no PyTorch profiler: use "
                       "--profile under nsys"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--record-memory-history"})),
                       "--record-memory-history: Megatron's flag, not built here"));
}

TEST(MegatronImplementationChoices, ValuesFollowMegatronsRules) {
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--transformer-impl", "inference_optimized"})),
                       "--transformer-impl 'inference_optimized': expected one of transformer_engine, local"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--attention-backend", "cudnn"})),
                       "expected one of auto, flash, fused, unfused, local"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--empty-unused-memory-level", "3"})),
                       "--empty-unused-memory-level 3 must be 0, 1 or 2"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--manual-gc-interval", "-1"})),
                       "--manual-gc-interval -1 must be >= 0"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--num-dataset-builder-threads", "0"})),
                       "--num-dataset-builder-threads 0 must be >= 1"));
  EXPECT_TRUE(
      contains(parse_error(with(minimal_argv(), {"--dist-ckpt-workers", "0"})), "--dist-ckpt-workers 0 must be >= 1"));
  const Argv shared_expert =
      with(minimal_argv(), {"--num-experts", "4", "--disable-bias-linear", "--moe-shared-expert-intermediate-size",
                            "64", "--moe-shared-expert-overlap"});
  EXPECT_TRUE(contains(parse_error(shared_expert),
                       "--moe-shared-expert-overlap overlaps the shared expert with the "
                       "alltoall token exchange, and Megatron refuses it beside "
                       "--moe-token-dispatcher-type allgather"));
  EXPECT_EQ(parse_error(with(shared_expert, {"--moe-token-dispatcher-type", "alltoall"})), "");
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--moe-router-dtype", "fp64"})),
                       "--moe-router-dtype fp64 is not built here: the router runs in fp32"));
  EXPECT_TRUE(
      contains(parse_error(with(minimal_argv(), {"--rope-type", "yarn"})), "--rope-type yarn is not built here"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--fsdp-manual-registration"})),
                       "--fsdp-manual-registration registers NCCL user buffers, so Megatron requires --use-nccl-ub"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--cuda-graph-impl", "graphs"})),
                       "--cuda-graph-impl 'graphs': expected one of none, local, transformer_engine, full_iteration"));
  EXPECT_TRUE(contains(
      parse_error(with(minimal_argv(), {"--no-create-attention-mask-in-dataloader", "--reset-attention-mask"})),
      "--no-create-attention-mask-in-dataloader with --reset-attention-mask: Megatron then builds no document masks"));
  // The deprecated position-embedding spellings hold only beside rope, which they do not set.
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--use-rotary-position-embeddings"})),
                       "--use-rotary-position-embeddings is Megatron's deprecated spelling of "
                       "--position-embedding-type rope: add --position-embedding-type rope"));
  EXPECT_TRUE(contains(parse_error(with(minimal_argv(), {"--no-position-embedding"})),
                       "--no-position-embedding needs --position-embedding-type rope"));
  EXPECT_TRUE(
      contains(parse_error(with(minimal_argv(), {"--no-position-embedding", "--position-embedding-type", "none"})),
               "--no-position-embedding needs --position-embedding-type rope"));
  EXPECT_EQ(parse_error(with(minimal_argv(), {"--use-rotary-position-embeddings", "--no-position-embedding",
                                              "--position-embedding-type", "rope"})),
            "");
}
