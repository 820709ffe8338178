#pragma once
// Sharded checkpoints. Every rank writes the shards it owns; one metadata file maps each tensor's
// global shape to the shards that hold it, so a later run under any parallel layout assembles the
// slices it needs from whichever shards overlap them (DESIGN.md section 10). Megatron's directory
// and tracker conventions are kept (reference/megatron-compat.md section 6.1); the files inside
// are ours.
//
// <save>/
//   latest_checkpointed_iteration.txt  last complete save: ASCII decimal without newline, or
//                                      "release"; rewritten atomically after the directory
//   iter_0000100/                      one directory per iteration ("release/" for a release)
//     model_rank_00000.safetensors     model shards written by rank 0; one file per writing rank
//     optim_rank_00000.safetensors     its optimizer-state shards; absent when it has none
//     common.json                      {"iteration": 100, "state": <caller's JSON: config, RNG,
//                                      scheduler, data position>}
//     metadata.json                    written last, described below
//   iter_0000100.tmp.<pid>/            a save in progress, or one that crashed: never read, and
//                                      removed by the next successful save
//
// metadata.json (keys sorted; no floating-point values):
//   {"checksum": "<CRC-32C, 8 hex digits, of the compact dump of this object without 'checksum'>",
//    "files": {"<file>": {"bytes": 123, "crc32c": "e3069283"}, ...},  every other file written
//    "format": "megatron-cpp-sharded", "format_version": 1, "iteration": 100, "world_size": 1,
//    "tensors": {"<global name>": {"dtype": "BF16", "global_shape": [6, 4],
//                 "shards": [{"file": "model_rank_00000.safetensors", "key": "<name in file>",
//                             "global_offset": [0, 0], "local_shape": [3, 4]}, ...]}, ...}}
// The shards of a tensor tile its global shape exactly: no gaps, no element written twice (checked
// on save and on load). A shard's key in its file is the global name, or "<name>@<o0>,<o1>,..."
// (its global offset) when one rank holds several shards of the tensor.
//
// Save protocol, laid out for many ranks (today one process plays every part):
//   1. rank 0 creates the staging directory <save>/iter_XXXXXXX.tmp.<pid>/ (its pid, broadcast);
//   2. each rank writes its model and optimizer files there and reports their digests and shards;
//   3. rank 0 writes common.json, then metadata.json from the gathered reports;
//   4. rank 0 fsyncs and renames the directory to iter_XXXXXXX (an existing directory of that
//      iteration is swapped out atomically), then rewrites the tracker.
// A crash anywhere before the tracker is rewritten leaves the tracker and the checkpoint it names
// untouched. On load, CheckpointReader::open verifies metadata.json's own checksum and the size
// and CRC-32C of every file it lists before any tensor is read.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>  // callers build and read the common state
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"

namespace megatron::checkpointing {

inline constexpr const char* kTrackerFileName = "latest_checkpointed_iteration.txt";
// The iteration number of a "release" checkpoint (directory release/, tracker "release"). Megatron
// resumes from a release checkpoint at iteration 0 without optimizer state; callers decide that.
inline constexpr int64_t kReleaseIteration = -1;

// <root>/iter_0000100, or <root>/release for kReleaseIteration.
std::string checkpoint_directory(const std::string& root, int64_t iteration);

// The iteration the tracker names; nullopt when there is no tracker. Surrounding whitespace is
// tolerated (Megatron strips it); any other content is an Error naming the file and the content.
std::optional<int64_t> read_tracker(const std::string& load_dir);

// Iterations with a published iter_XXXXXXX directory under load_dir, ascending. Staging
// directories are not listed; the directories are not verified.
std::vector<int64_t> list_checkpoints(const std::string& load_dir);

// One piece of a tensor: `local` holds global[offset[d] : offset[d] + local.dim(d)] in every
// dimension d. Pass only the shards this rank is responsible for writing (one replica of each).
struct ShardedTensor {
  std::string name;  // global name, e.g. "decoder.layers.3.mlp.linear_fc1.weight"
  Shape global_shape;
  Shape global_offset;
  Tensor local;  // CPU
};

// Stages of save_checkpoint, in the order they are reached (after_optim_file also when there is
// no optimizer state).
inline constexpr const char* kSaveStages[] = {"after_model_file", "after_optim_file", "after_common_file",
                                              "before_publish",   "before_tracker",   "after_tracker"};

struct SaveOptions {
  // Called with each stage of kSaveStages as it is reached. Fault injection for tests: throwing
  // or exiting here simulates a crash at that point of the save.
  std::function<void(const std::string& stage)> on_stage;
};

// Saves `model` and `optimizer` shards and the caller's JSON `common` state as iteration
// `iteration` (or kReleaseIteration) under save_dir, creating save_dir if needed, then points the
// tracker at it. Replaces an existing checkpoint of the same iteration atomically.
void save_checkpoint(const std::string& save_dir, int64_t iteration, const std::vector<ShardedTensor>& model,
                     const std::vector<ShardedTensor>& optimizer, const nlohmann::json& common,
                     const SaveOptions& options = {});

struct TensorInfo {
  Shape global_shape;
  DType dtype = DType::f32;  // as stored
};

// A verified checkpoint directory. Cheap to copy (copies share the open files).
class CheckpointReader {
 public:
  // Verifies metadata.json and every file it lists (size and CRC-32C) and the consistency of the
  // shards with the files. Any mismatch is an Error naming the file and the check that failed.
  static CheckpointReader open(const std::string& load_dir, int64_t iteration);

  const std::string& directory() const;
  int64_t iteration() const;
  const nlohmann::json& common() const;    // the `common` state given to save_checkpoint
  std::vector<std::string> names() const;  // model and optimizer tensors, sorted
  bool has(const std::string& name) const;
  TensorInfo info(const std::string& name) const;

  // Fills `dest` (CPU, any shape within the global one) with the slice of tensor `name` starting
  // at `global_offset`, assembled from every shard it overlaps, so a run with another sharding
  // can load it. Converts to dest's dtype if it differs from the stored one.
  void load(const std::string& name, const Shape& global_offset, Tensor& dest) const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

}  // namespace megatron::checkpointing
