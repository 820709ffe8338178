// megatron train: parse Megatron's flags (and --config YAML), then run the training loop.
#include <cstdio>

#include "commands.h"
#include "megatron/training/arguments.h"
#include "megatron/training/training.h"

namespace megatron::tools {

int train(const Args& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(training_args_help().c_str(), stdout);
      return 0;
    }
  pretrain(parse_training_args(args));
  return 0;
}

}  // namespace megatron::tools
