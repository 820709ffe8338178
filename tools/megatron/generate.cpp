// megatron generate: load a checkpoint written by `megatron train --save` and sample text.
// Under mpirun or srun the ranks split the model by tensor parallelism (TP = the world size),
// whatever TP the checkpoint was trained with; rank 0 prints.
#include "megatron/inference/generate.h"

#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/parallel/launch.h"
#include "megatron/parallel/parallel_state.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/device.h"

namespace megatron::tools {

namespace {
struct GenerateArgs {
  std::string load;
  std::string prompt;
  int64_t max_new_tokens = 64;
  int64_t num_samples = 1;
  float temperature = 0.8f;
  int64_t top_k = 40;
  int64_t seed = 1234;
  std::string device = "auto";
  std::optional<int64_t> tensor_model_parallel_size;  // unset: the launched world size
  datasets::TokenizerOptions tokenizer;               // flags given: override the checkpoint's tokenizer
};

const char* const kHelp =
    "usage: megatron generate --load DIR [--prompt TEXT] [--max-new-tokens 64] [--num-samples 1]\n"
    "                         [--temperature 0.8 (0 = greedy)] [--top-k 40 (0 = all)] [--seed 1234]\n"
    "                         [--device auto|cpu|cuda] [--tensor-model-parallel-size N (default: the number\n"
    "                         of ranks)]\n"
    "                         [--tokenizer-type T] [--vocab-file F] [--merge-file F] [--tokenizer-model F]\n"
    "                         [--vocab-size N]\n"
    "Under `mpirun -np N` (or srun) the N ranks split the model by tensor parallelism, TP = N; the\n"
    "checkpoint may have been trained at any TP.\n"
    "The tokenizer is the one the checkpoint was trained with: each checkpoint holds its own copy of the\n"
    "tokenizer's files, so no tokenizer flag is needed. Tokenizer flags given here override it, as\n"
    "Megatron's command line overrides a checkpoint's arguments: with the checkpoint's --tokenizer-type\n"
    "(or none) the flags given replace those files, another type replaces the whole tokenizer; its\n"
    "vocabulary must have the size the model was trained with.\n";

GenerateArgs parse(const Args& args) {
  GenerateArgs g;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      MEGATRON_CHECK(i + 1 < args.size(), flag << " needs a value");
      return args[++i];
    };
    auto number = [&](auto& field) {
      const std::string& v = value();
      try {
        size_t used = 0;
        field = static_cast<std::remove_reference_t<decltype(field)>>(std::stod(v, &used));
        MEGATRON_CHECK(used == v.size(), "");
      } catch (const std::exception&) {
        MEGATRON_FAIL(flag << " " << v << " is not a number");
      }
    };
    if (flag == "--load")
      g.load = value();
    else if (flag == "--prompt")
      g.prompt = value();
    else if (flag == "--max-new-tokens")
      number(g.max_new_tokens);
    else if (flag == "--num-samples")
      number(g.num_samples);
    else if (flag == "--temperature")
      number(g.temperature);
    else if (flag == "--top-k")
      number(g.top_k);
    else if (flag == "--seed")
      number(g.seed);
    else if (flag == "--device")
      g.device = value();
    else if (flag == "--tensor-model-parallel-size")
      number(g.tensor_model_parallel_size.emplace());
    else if (flag == "--tokenizer-type")
      g.tokenizer.type = value();
    else if (flag == "--vocab-file")
      g.tokenizer.vocab_file = value();
    else if (flag == "--merge-file")
      g.tokenizer.merge_file = value();
    else if (flag == "--tokenizer-model")
      g.tokenizer.model = value();
    else if (flag == "--vocab-size")
      number(g.tokenizer.vocab_size);
    else
      MEGATRON_FAIL("unknown flag " << flag << "\n" << kHelp);
  }
  MEGATRON_CHECK(!g.load.empty(), "--load DIR is required: the --save directory of a training run\n" << kHelp);
  MEGATRON_CHECK(g.tensor_model_parallel_size.value_or(1) > 0,
                 "--tensor-model-parallel-size " << *g.tensor_model_parallel_size << " must be positive");
  return g;
}

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

  const TrainingArgs train_args = read_checkpoint_args(g.load, tp);
  const auto tokenizer =
      datasets::make_tokenizer(datasets::complete_tokenizer_options(g.tokenizer, train_args.tokenizer));
  MEGATRON_CHECK(tokenizer->vocab_size() == train_args.model.vocab_size,
                 "the tokenizer flags given make a " << tokenizer->name() << " of " << tokenizer->vocab_size()
                                                     << " tokens, but the model of " << g.load << " was trained with "
                                                     << train_args.model.vocab_size << " (" << train_args.tokenizer.type
                                                     << "); drop the tokenizer flags to use the checkpoint's own");
  const Device device = select_device(g.device, mpi ? mpi->process().local_rank : 0);
  ParallelSizes sizes;
  sizes.tp = tp;
  const ParallelState state =
      initialize_parallel(sizes, {.device = device,
                                  .timeout_seconds = 60.0 * train_args.distributed_timeout_minutes,
                                  .tied_embeddings = !train_args.model.untie_embeddings_and_output_weights,
                                  .mpi = mpi});
  GPTModel model(train_args.model, state.ctx, device);
  load_model_weights(g.load, model);

  std::vector<int32_t> prompt = tokenizer->encode(g.prompt);
  if (prompt.empty()) prompt.push_back(tokenizer->eod());  // start a fresh document
  const size_t prompt_tokens = prompt.size();
  // The same seed on every rank: the ranks draw the same numbers (generate.h).
  HostRng rng(uint64_t(g.seed));
  const SamplingParams params{g.temperature, g.top_k, tokenizer->vocab_size()};
  for (int64_t n = 0; n < g.num_samples; ++n) {
    std::vector<int32_t> out = generate_tokens(model, prompt, g.max_new_tokens, params, tokenizer->eod(), rng);
    if (rank != 0) continue;
    if (!out.empty() && out.back() == tokenizer->eod()) out.pop_back();
    const std::vector<int32_t> generated(out.begin() + std::ptrdiff_t(prompt_tokens), out.end());
    std::cout << "----- sample " << n + 1 << " -----\n" << g.prompt << tokenizer->decode(generated) << "\n";
  }
}
}  // namespace

int generate(const Args& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
  const ProcessInfo process = process_info_from_env();
  if (!process.launched()) {
    run(parse(args), nullptr);
    return 0;
  }
  const auto mpi = std::make_shared<MpiRuntime>(process);
  try {
    run(parse(args), mpi);
  } catch (const std::exception& e) {
    // Other ranks may wait for this one in a collective: report, then end the whole job.
    std::fprintf(stderr, "megatron generate: error on rank %d: %s\n", mpi->process().rank, e.what());
    mpi->abort(1);
  }
  return 0;
}

}  // namespace megatron::tools
