#pragma once
// The weights of a Hugging Face model directory (reference/interop-formats.md section 1.5):
// model.safetensors, or the shards that model.safetensors.index.json maps every tensor to.
// Reading checks the index against the shards (every listed file present, each tensor in exactly
// the shard the index names, nothing unlisted); writing shards greedily in the given order as
// huggingface_hub does, with the index when there is more than one shard.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "megatron/checkpointing/safetensors.h"

namespace megatron::hf_bridge {

class HfWeights {
 public:
  static HfWeights open(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return files_.count(name) != 0; }
  const checkpointing::SafetensorsEntry& info(const std::string& name) const;
  Tensor load(const std::string& name) const;
  std::string file_of(const std::string& name) const;  // the shard that holds it

 private:
  std::map<std::string, checkpointing::SafetensorsReader> files_;
};

// Writes `tensors` into `dir` (which exists) as model.safetensors, or, when they exceed
// max_shard_bytes, as model-0000i-of-0000n.safetensors shards of at most that size (a larger
// tensor alone in its shard) with model.safetensors.index.json. Each shard carries the metadata
// {"format": "pt"} that transformers expects. Returns the names of the files written.
std::vector<std::string> write_hf_weights(const std::string& dir,
                                          const std::vector<checkpointing::NamedTensor>& tensors,
                                          uint64_t max_shard_bytes);

// "5GB", "200KB", "1000" (bytes): huggingface_hub's max_shard_size, decimal units.
uint64_t parse_shard_size(const std::string& text);

}  // namespace megatron::hf_bridge
