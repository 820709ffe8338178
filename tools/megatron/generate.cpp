// megatron generate: load a checkpoint written by `megatron train --save` and sample text.
// Under mpirun or srun the ranks split the model by tensor parallelism (TP = the world size, no
// sequence parallelism), whatever layout the checkpoint was trained with; rank 0 prints.
#include "megatron/inference/generate.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/strings.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/flags/flag_table.h"
#include "megatron/parallel/cpu_threads.h"
#include "megatron/parallel/launch.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/parallel/parallel_state.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/device.h"

namespace megatron::tools {

namespace {
struct GenerateArgs {
  std::string load;
  int64_t ckpt_step = 0;  // Megatron's --ckpt-step: the iteration to load; 0: the tracker's
  std::string prompt;
  int64_t max_new_tokens = 64;
  int64_t num_samples = 1;
  float temperature = 0.8f;
  int64_t top_k = 40;
  int64_t seed = 1234;
  bool no_eod_termination = false;  // Megatron's use_eod_token_for_early_termination=False
  std::string device = "auto";
  std::optional<int64_t> tensor_model_parallel_size;  // unset: the launched world size
  datasets::TokenizerOptions tokenizer;               // flags given: override the checkpoint's tokenizer
};

std::vector<std::string> validate(const GenerateArgs& g) {
  std::vector<std::string> errors;
  if (g.load.empty()) errors.push_back("--load DIR is required: the --save directory of a training run");
  if (g.ckpt_step < 0)
    errors.push_back(concat("--ckpt-step ", g.ckpt_step, " must be a saved iteration (> 0), or 0 for the latest"));
  if (g.max_new_tokens < 0)
    errors.push_back(concat("--max-new-tokens ", g.max_new_tokens, " must be >= 0: how many tokens to add, e.g. 64"));
  if (g.num_samples < 1)
    errors.push_back(concat("--num-samples ", g.num_samples, " must be >= 1: how many continuations to print"));
  if (!(g.temperature >= 0.0f))
    errors.push_back(concat("--temperature ", g.temperature,
                            " must be >= 0: 0 takes the most likely token (greedy), larger values sample more "
                            "freely; e.g. 0.8"));
  if (g.top_k < 0)
    errors.push_back(
        concat("--top-k ", g.top_k, " must be >= 0: k samples among the k most likely tokens, 0 among all; e.g. 40"));
  if (g.seed < 0) errors.push_back(concat("--seed ", g.seed, " must be >= 0: e.g. 1234"));
  if (g.tensor_model_parallel_size && *g.tensor_model_parallel_size <= 0)
    errors.push_back(concat("--tensor-model-parallel-size ", *g.tensor_model_parallel_size,
                            " must be positive; leave it out to use the number of launched ranks"));
  return errors;
}

#define FIELD(member) MEGATRON_FLAG_FIELD(GenerateArgs, member)

const flags::FlagTable<GenerateArgs>& generate_flags() {
  const char* sampling = "sampling";
  const char* run = "checkpoint and run";
  const char* tokenizer_section = "tokenizer (default: the checkpoint's own)";
  static const flags::FlagTable<GenerateArgs> table(
      "megatron generate",
      "usage: megatron generate --load DIR [--prompt TEXT] [flags]\n\n"
      "Samples continuations of the prompt from the latest checkpoint under DIR. Under `mpirun -np N` (or\n"
      "srun) the N ranks split the model by tensor parallelism, TP = N; the checkpoint may have been trained\n"
      "at any TP.\n\n"
      "The tokenizer is the one the checkpoint was trained with: each checkpoint holds its own copy of the\n"
      "tokenizer's files, so no tokenizer flag is needed. Tokenizer flags given here override it, as\n"
      "Megatron's command line overrides a checkpoint's arguments: with the checkpoint's --tokenizer-type\n"
      "(or none) the flags given replace those files, another type replaces the whole tokenizer; its\n"
      "vocabulary must have the size the model was trained with.\n",
      {
          {"--config", flags::ConfigFile{}, "configuration",
           "YAML file of flag values (keys: flag names without the leading dashes, e.g. top_k: 40); command-line "
           "flags override it"},
          {"--load", FIELD(load), run, "The --save directory of a training run; required"},
          {"--ckpt-step", FIELD(ckpt_step), run, "Iteration to load (Megatron's flag); 0: the latest"},
          {"--device", FIELD(device), run, "Where to run", {"auto", "cpu", "cuda"}},
          {"--tensor-model-parallel-size", FIELD(tensor_model_parallel_size), run,
           "TP; must equal the number of launched ranks (the default)"},
          {"--prompt", FIELD(prompt), sampling, "Text to continue; empty: start a new document"},
          {"--max-new-tokens", FIELD(max_new_tokens), sampling, "Tokens to add to the prompt"},
          {"--num-samples", FIELD(num_samples), sampling, "Continuations to print"},
          {"--temperature", FIELD(temperature), sampling, "Softmax temperature; 0: greedy"},
          {"--top-k", FIELD(top_k), sampling, "Sample among the k most likely tokens; 0: all"},
          {"--seed", FIELD(seed), sampling, "Seed of the sampling"},
          {"--no-eod-termination", flags::Switch<GenerateArgs>{FIELD(no_eod_termination), true}, sampling,
           "Generate all --max-new-tokens even past the end-of-document token (timing a fixed length)"},
          {"--tokenizer-type", FIELD(tokenizer.type), tokenizer_section,
           "Override the checkpoint's tokenizer (see above)"},
          {"--vocab-file", FIELD(tokenizer.vocab_file), tokenizer_section, "GPT-2 vocab.json (GPT2BPETokenizer)"},
          {"--merge-file", FIELD(tokenizer.merge_file), tokenizer_section, "GPT-2 merges.txt (GPT2BPETokenizer)"},
          {"--tokenizer-model", FIELD(tokenizer.model), tokenizer_section, "Model file of tokenizers that need one"},
          {"--vocab-size", FIELD(tokenizer.vocab_size), tokenizer_section,
           "Vocabulary size of NullTokenizer and TikTokenizer"},
          {"--tiktoken-pattern", FIELD(tokenizer.tiktoken_pattern), tokenizer_section,
           "TikTokenizer's split regex: v1 or v2 (Megatron's; unset: v2)"},
          {"--tiktoken-num-special-tokens", FIELD(tokenizer.tiktoken_num_special_tokens), tokenizer_section,
           "TikTokenizer's number of special-token ids before the vocabulary (unset: 1000)"},
          {"--special-tokens", FIELD(tokenizer.special_tokens), tokenizer_section,
           "TikTokenizer's special tokens, which must include <unk> <s> </s> <mask> <pad> <cls> <sep> (unset: those "
           "seven)"},
      },
      validate);
  return table;
}

#undef FIELD

void run(const GenerateArgs& g, const std::shared_ptr<MpiRuntime>& mpi) {
  const int64_t world = mpi ? mpi->process().world_size : 1;
  const int rank = mpi ? mpi->process().rank : 0;
  const int64_t tp = g.tensor_model_parallel_size.value_or(world);
  // One prompt has nothing to share out between data-parallel replicas: every rank is a TP rank.
  MEGATRON_CHECK(tp == world, "--tensor-model-parallel-size "
                                  << tp << " differs from the " << world
                                  << " launched rank(s): generation splits one model over every rank (TP = world "
                                     "size, no data parallelism); launch "
                                  << (tp == 1 ? std::string("one process") : "mpirun -np " + std::to_string(tp))
                                  << " or leave the flag out");
  const ScopedLogRank log_rank(rank);
  configure_cpu_threads(mpi.get());

  TrainingArgs train_args = read_checkpoint_args(g.load, g.ckpt_step);
  // An imported vocabulary (--true-vocab-size) pads to a multiple of this run's TP; loading adds or
  // drops the padding rows.
  if (train_args.model.true_vocab_size > 0)
    train_args.model.padded_vocab_size =
        padded_vocab_size(train_args.model.true_vocab_size, train_args.model.make_vocab_size_divisible_by, tp);
  // Generation's own layout, whatever the checkpoint was trained with: TP = the world, without
  // sequence parallelism (the weights are the same, and SP would need every step's growing
  // sequence to divide by TP). Loading reads global slices, so any TP that splits the model works.
  ParallelArgs layout;
  layout.tensor_model_parallel_size = tp;
  const std::vector<std::string> problems = validate_tensor_parallel_split(train_args.model, layout);
  MEGATRON_CHECK(problems.empty(), "the model of checkpoint "
                                       << g.load << " cannot be built at --tensor-model-parallel-size " << tp << ": "
                                       << flags::join(problems, "; "));
  const auto tokenizer =
      datasets::make_tokenizer(datasets::complete_tokenizer_options(g.tokenizer, train_args.tokenizer));
  MEGATRON_CHECK(tokenizer->vocab_size() == train_args.model.vocab_size,
                 "the tokenizer flags given make a " << tokenizer->name() << " of " << tokenizer->vocab_size()
                                                     << " tokens, but the model of " << g.load << " was trained with "
                                                     << train_args.model.vocab_size << " (" << train_args.tokenizer.type
                                                     << "); drop the tokenizer flags to use the checkpoint's own");
  const Device device = select_device(g.device, mpi ? mpi->process().local_rank : 0);
  const ParallelState state =
      initialize_parallel(layout.sizes(), {.device = device,
                                           .timeout_seconds = 60.0 * train_args.distributed_timeout_minutes,
                                           .tied_embeddings = !train_args.model.untie_embeddings_and_output_weights,
                                           .mpi = mpi});
  const ParallelContext ctx = model_context(state.ctx, layout);
  GPTModel model(train_args.model, ctx, device);
  load_model_weights(g.load, model, g.ckpt_step);

  std::vector<int32_t> prompt = tokenizer->encode(g.prompt);
  const bool new_document = prompt.empty();
  if (new_document) prompt.push_back(tokenizer->eod());  // start a fresh document
  const size_t prompt_tokens = prompt.size();
  // The same seed on every rank: the ranks draw the same numbers (generate.h).
  HostRng rng(uint64_t(g.seed));
  const SamplingParams params{g.temperature, g.top_k, tokenizer->vocab_size()};
  for (int64_t n = 0; n < g.num_samples; ++n) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<int32_t> out = generate_tokens(model, prompt, g.max_new_tokens, params,
                                                 g.no_eod_termination ? -1 : tokenizer->eod(), rng);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank != 0) continue;
    const size_t generated = out.size() - prompt_tokens;
    std::fprintf(stderr, "generated %zu tokens in %.3f s: %.1f tokens/s (the %zu-token prompt's forward included)\n",
                 generated, seconds, double(generated) / seconds, prompt_tokens);
    if (out.size() > prompt_tokens && out.back() == tokenizer->eod()) out.pop_back();
    // Prompt and continuation decoded as one sequence (as Megatron's text generation returns
    // them), so the tokenizer joins them as it joins any two tokens: the null tokenizer with a
    // space between ids, byte-level BPE byte for byte.
    const std::vector<int32_t> text(out.begin() + (new_document ? 1 : 0), out.end());
    std::cout << "----- sample " << n + 1 << " -----\n" << tokenizer->decode(text) << "\n";
  }
}
}  // namespace

std::string generate_help() { return generate_flags().help(); }

int generate(const Args& args) {
  const GenerateArgs g = generate_flags().parse(args);
  const ProcessInfo process = process_info_from_env();
  if (!process.launched()) {
    run(g, nullptr);
    return 0;
  }
  const auto mpi = std::make_shared<MpiRuntime>(process);
  try {
    run(g, mpi);
  } catch (const std::exception& e) {
    // Other ranks may wait for this one in a collective: report, then end the whole job.
    std::fprintf(stderr, "megatron generate: error on rank %d: %s\n", mpi->process().rank, e.what());
    mpi->abort(1);
  }
  return 0;
}

}  // namespace megatron::tools
