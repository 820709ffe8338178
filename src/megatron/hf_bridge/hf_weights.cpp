#include "megatron/hf_bridge/hf_weights.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "megatron/checkpointing/atomic_file.h"
#include "megatron/core/error.h"

namespace megatron::hf_bridge {
namespace fs = std::filesystem;
using checkpointing::SafetensorsReader;

namespace {
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

nlohmann::json read_index(const std::string& path) {
  try {
    return nlohmann::json::parse(checkpointing::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL(path << " is not valid JSON (" << e.what() << "); restore the file");
  }
}
}  // namespace

HfWeights HfWeights::open(const std::string& dir) {
  HfWeights w;
  const fs::path index_path = fs::path(dir) / kIndexFile;
  if (!fs::exists(index_path)) {
    const fs::path single = fs::path(dir) / kSingleFile;
    MEGATRON_CHECK(fs::exists(single), dir << " holds neither " << kSingleFile << " nor " << kIndexFile
                                           << ": a Hugging Face model directory needs its safetensors weights "
                                           << "(pytorch_model.bin is not read: convert it with save_pretrained)");
    const SafetensorsReader reader = SafetensorsReader::open(single.string());
    for (const std::string& name : reader.names()) w.files_.emplace(name, reader);
    return w;
  }
  const nlohmann::json index = read_index(index_path.string());
  MEGATRON_CHECK(index.contains("weight_map") && index["weight_map"].is_object(),
                 index_path.string() << " has no \"weight_map\" object; restore the file");
  std::map<std::string, SafetensorsReader> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    MEGATRON_CHECK(file.is_string(), index_path.string()
                                         << ": the weight_map entry of " << name << " is not a file name");
    const std::string shard = file.get<std::string>();
    auto it = shards.find(shard);
    if (it == shards.end()) {
      const fs::path path = fs::path(dir) / shard;
      MEGATRON_CHECK(fs::exists(path), index_path.string()
                                           << " maps " << name << " to " << shard << ", which is missing from " << dir);
      it = shards.emplace(shard, SafetensorsReader::open(path.string())).first;
    }
    MEGATRON_CHECK(it->second.has(name), index_path.string()
                                             << " maps " << name << " to " << shard << ", which does not hold it");
    w.files_.emplace(name, it->second);
  }
  for (const auto& [shard, reader] : shards)
    for (const std::string& name : reader.names()) {
      const auto listed = w.files_.find(name);
      MEGATRON_CHECK(listed != w.files_.end() && listed->second.path() == reader.path(),
                     shard << " holds " << name << ", which " << kIndexFile << " "
                           << (listed == w.files_.end() ? "does not list" : "maps to " + listed->second.path())
                           << ": the index and the shards disagree; re-save the model");
    }
  return w;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, reader] : files_) out.push_back(name);
  return out;
}

const checkpointing::SafetensorsEntry& HfWeights::info(const std::string& name) const {
  return files_.at(name).info(name);
}

Tensor HfWeights::load(const std::string& name) const { return files_.at(name).load(name); }

std::string HfWeights::file_of(const std::string& name) const { return files_.at(name).path(); }

std::vector<std::string> write_hf_weights(const std::string& dir,
                                          const std::vector<checkpointing::NamedTensor>& tensors,
                                          uint64_t max_shard_bytes) {
  std::vector<std::vector<checkpointing::NamedTensor>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const checkpointing::NamedTensor& t : tensors) {
    const uint64_t bytes = t.tensor.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const checkpointing::SafetensorsMetadata metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    checkpointing::write_safetensors((fs::path(dir) / kSingleFile).string(), tensors, metadata);
    return {kSingleFile};
  }
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    checkpointing::write_safetensors((fs::path(dir) / name).string(), shards[i], metadata);
    for (const checkpointing::NamedTensor& t : shards[i]) weight_map[t.name] = name;
    files.emplace_back(name);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  checkpointing::write_file_atomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
  files.emplace_back(kIndexFile);
  return files;
}

uint64_t parse_shard_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1},     {"B", 1},    {"KB", 1e3},
                                                  {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  const auto* match = std::find_if(std::begin(units), std::end(units), [&](const auto& u) { return unit == u.first; });
  MEGATRON_CHECK(used > 0 && value > 0 && match != std::end(units),
                 "--max-shard-size " << text << " is not a size: give e.g. 5GB, 500MB or 200KB (decimal units)");
  return uint64_t(value * match->second);
}

}  // namespace megatron::hf_bridge
