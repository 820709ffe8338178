#pragma once
// Subcommands of the `megatron` executable. Each takes the arguments after its name and
// returns the process exit code; errors are thrown as megatron::Error and reported by main.
#include <string>
#include <vector>

namespace megatron::tools {

using Args = std::vector<std::string>;

int train(const Args& args);
int preprocess_data(const Args& args);
int generate(const Args& args);
int train_tokenizer(const Args& args);

}  // namespace megatron::tools
