// `megatron train-tokenizer`: corpus -> byte-level BPE tokenizer.json
// (src/megatron/datasets/tokenizers/train_tokenizer.h).
#include "megatron/datasets/tokenizers/train_tokenizer.h"

#include <iostream>

#include "commands.h"
#include "megatron/flags/flag_table.h"

namespace megatron::tools {

std::string train_tokenizer_help() { return datasets::train_tokenizer_flags().help(); }

int train_tokenizer(const Args& args) {
  datasets::train_tokenizer(datasets::train_tokenizer_flags().parse(args), std::cerr);
  return 0;
}

}  // namespace megatron::tools
