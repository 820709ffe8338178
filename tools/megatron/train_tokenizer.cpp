// `megatron train-tokenizer`: corpus -> byte-level BPE tokenizer.json
// (src/megatron/datasets/tokenizers/train_tokenizer.h).
#include "megatron/datasets/tokenizers/train_tokenizer.h"

#include <iostream>

#include "commands.h"

namespace megatron::tools {

int train_tokenizer(const Args& args) {
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::cout << datasets::train_tokenizer_help();
      return 0;
    }
  }
  datasets::train_tokenizer(datasets::parse_train_tokenizer_args(args), std::cerr);
  return 0;
}

}  // namespace megatron::tools
