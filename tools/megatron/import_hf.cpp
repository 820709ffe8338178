// `megatron import-hf`: a Hugging Face model directory -> a checkpoint (hf_bridge/convert.h).
#include "commands.h"
#include "megatron/flags/flag_table.h"
#include "megatron/hf_bridge/convert.h"

namespace megatron::tools {

std::string import_hf_help() { return hf_bridge::import_flags().help(); }

int import_hf(const Args& args) {
  hf_bridge::import_hf(hf_bridge::import_flags().parse(args));
  return 0;
}

}  // namespace megatron::tools
