// `megatron preprocess-data`: JSON lines -> Megatron .bin/.idx (src/megatron/datasets/preprocess.h).
#include <iostream>

#include "commands.h"
#include "megatron/datasets/preprocess.h"
#include "megatron/flags/flag_table.h"

namespace megatron::tools {

std::string preprocess_data_help() { return datasets::preprocess_flags().help(); }

int preprocess_data(const Args& args) {
  const datasets::PreprocessOptions options = datasets::preprocess_flags().parse(args);
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
