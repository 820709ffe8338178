#pragma once
// `megatron import-hf` and `megatron export-hf`: a Hugging Face model directory to our checkpoint
// and back (the mappings: hf_config.h, tensor_mapping.h; the files: hf_weights.h).
//
// import: reads config.json (every field accounted for), the safetensors weights (single or
//   sharded with their index) and the tokenizer (tokenizer.json, else tokenizer.model, else
//   vocab.json + merges.txt); checks that every parameter's tensors are present with their shapes
//   and one floating dtype, and that no other tensor is left over, before anything is written; then
//   writes a release checkpoint (Megatron's convention for converted weights: `train --load` starts
//   it at iteration 0 without optimizer state) at the requested TP layout, one writer per TP rank,
//   the requested PP layout checked and stored (the files do not depend on it: every tensor is
//   saved under its global name, layers by their global number, so any PP loads them),
//   with the model arguments and tokenizer stored, so `train --load CKPT --finetune` and `generate
//   --load CKPT` need no model flags. The checkpoint appears atomically or not at all. HF's
//   vocab_size is stored as --true-vocab-size, from which the vocabulary pads to a multiple of the
//   run's TP only, so the checkpoint loads at every TP that divides it.
// export: reads the arguments and weights of --load's checkpoint (any layout), picks the family
//   whose architecture the model has, and writes config.json, generation_config.json, the weights
//   (sharded above --max-shard-size, with the index) and the tokenizer files into a new directory,
//   published by one rename.
#include <cstdint>
#include <string>

namespace megatron::flags {
template <class Options>
class FlagTable;
}

namespace megatron::hf_bridge {

struct ImportOptions {
  std::string hf_dir;                        // --hf-dir
  std::string save;                          // --save
  int64_t tensor_model_parallel_size = 1;    // --tensor-model-parallel-size
  int64_t pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
};

struct ExportOptions {
  std::string load;                    // --load
  int64_t ckpt_step = 0;               // --ckpt-step
  std::string hf_dir;                  // --hf-dir: created; must not exist or be empty
  std::string max_shard_size = "5GB";  // --max-shard-size (huggingface_hub's default)
};

const flags::FlagTable<ImportOptions>& import_flags();
const flags::FlagTable<ExportOptions>& export_flags();

void import_hf(const ImportOptions& options);
void export_hf(const ExportOptions& options);

}  // namespace megatron::hf_bridge
