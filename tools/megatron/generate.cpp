// megatron generate: load a checkpoint written by `megatron train --save` and sample text.
#include "megatron/inference/generate.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
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
};

const char* const kHelp =
    "usage: megatron generate --load DIR [--prompt TEXT] [--max-new-tokens 64] [--num-samples 1]\n"
    "                         [--temperature 0.8 (0 = greedy)] [--top-k 40 (0 = all)] [--seed 1234]\n"
    "                         [--device auto|cpu|cuda]\n";

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
    else
      MEGATRON_FAIL("unknown flag " << flag << "\n" << kHelp);
  }
  MEGATRON_CHECK(!g.load.empty(), "--load DIR is required: the --save directory of a training run\n" << kHelp);
  return g;
}
}  // namespace

int generate(const Args& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
  const GenerateArgs g = parse(args);
  const TrainingArgs train_args = read_checkpoint_args(g.load);
  const auto tokenizer = datasets::make_tokenizer(train_args.data.tokenizer_type, train_args.data.vocab_size,
                                                  train_args.data.tokenizer_model);
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(train_args.model, ctx, select_device(g.device, 0));
  load_model_weights(g.load, model);

  std::vector<int32_t> prompt = tokenizer->encode(g.prompt);
  if (prompt.empty()) prompt.push_back(tokenizer->eod());  // start a fresh document
  const size_t prompt_tokens = prompt.size();
  HostRng rng(uint64_t(g.seed));
  const SamplingParams params{g.temperature, g.top_k, tokenizer->vocab_size()};
  for (int64_t n = 0; n < g.num_samples; ++n) {
    std::vector<int32_t> out = generate_tokens(model, prompt, g.max_new_tokens, params, tokenizer->eod(), rng);
    if (!out.empty() && out.back() == tokenizer->eod()) out.pop_back();
    const std::vector<int32_t> generated(out.begin() + std::ptrdiff_t(prompt_tokens), out.end());
    std::cout << "----- sample " << n + 1 << " -----\n" << g.prompt << tokenizer->decode(generated) << "\n";
  }
  return 0;
}

}  // namespace megatron::tools
