// `megatron export-hf`: a checkpoint -> a Hugging Face model directory (hf_bridge/convert.h).
#include "commands.h"
#include "megatron/flags/flag_table.h"
#include "megatron/hf_bridge/convert.h"

namespace megatron::tools {

std::string export_hf_help() { return hf_bridge::export_flags().help(); }

int export_hf(const Args& args) {
  hf_bridge::export_hf(hf_bridge::export_flags().parse(args));
  return 0;
}

}  // namespace megatron::tools
