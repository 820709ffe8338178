// `megatron preprocess-data`: JSON lines -> Megatron .bin/.idx (src/megatron/datasets/preprocess.h).
#include <iostream>

#include "commands.h"
#include "megatron/datasets/preprocess.h"

namespace megatron::tools {

int preprocess_data(const Args& args) {
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::cout << datasets::preprocess_help();
      return 0;
    }
  }
  const datasets::PreprocessOptions options = datasets::parse_preprocess_args(args);
  const datasets::PreprocessReport report = datasets::preprocess_data(options, std::cerr);
  std::cerr << "preprocess-data: " << report.documents << " documents, " << report.tokens << " tokens from "
            << report.lines << " lines (" << report.bad_lines << " malformed, " << report.blank_lines
            << " blank skipped)\n";
  for (const std::string& prefix : report.output_prefixes) {
    std::cerr << "preprocess-data: wrote " << prefix << ".bin and " << prefix << ".idx (train with --data-path "
              << prefix << ")\n";
  }
  return 0;
}

}  // namespace megatron::tools
