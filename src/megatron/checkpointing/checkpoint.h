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
//     vocab.json, ...                  the caller's own files (CheckpointStaging::add_file), e.g.
//                                      the tokenizer's, so that the directory is self-contained
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
// on save and on load), except in a partial checkpoint (SaveOptions::partial, "partial": true), which
// may have gaps: loading a slice checks that it is held. A shard's key in its file is the global name, or
// "<name>@<o0>,<o1>,..." (its global offset) when one rank holds several shards of the tensor.
//
// Save protocol (many writers; save_checkpoint is the single-process case):
//   1. one process (rank 0) creates the staging directory <save>/iter_XXXXXXX.tmp.<pid>/
//      (CheckpointStaging) and tells the writers its path;
//   2. each writer writes its model and optimizer files there (write_checkpoint_shards, files
//      named by its rank) and sends back the report it returns: file names, sizes, CRC-32C, and
//      the global slice every shard holds;
//   3. the staging process adds the caller's own files (CheckpointStaging::add_file); once every
//      report is in, it checks them (each file present with its reported size, the shards of every
//      tensor tiling it), writes common.json, then metadata.json (CheckpointStaging::finish);
//   4. it fsyncs and renames the directory to iter_XXXXXXX (an existing directory of that
//      iteration is swapped out atomically), then rewrites the tracker.
// A crash of any writer anywhere before the tracker is rewritten leaves the tracker and the
// checkpoint it names untouched. On load, CheckpointReader::open verifies metadata.json's own
// checksum and the size and CRC-32C of every file it lists before any tensor is read;
// read_checkpoint_header verifies only what it returns (common state and added files).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>  // callers build and read the common state
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/checkpointing/atomic_file.h"
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

// Whether the checkpoint of `iteration` is complete: its metadata.json exists and passes its
// checksum, and every file it lists exists with the recorded size. Cheap (no file is read in
// full); CheckpointReader::open checks the contents too.
bool checkpoint_is_complete(const std::string& load_dir, int64_t iteration);
// The iterations of list_checkpoints whose checkpoints are complete, ascending.
std::vector<int64_t> complete_checkpoints(const std::string& load_dir);

// One piece of a tensor: `local` holds global[offset[d] : offset[d] + local.dim(d)] in every
// dimension d. Pass only the shards this rank is responsible for writing (one replica of each).
struct ShardedTensor {
  std::string name;  // global name, e.g. "decoder.layers.3.mlp.linear_fc1.weight"
  Shape global_shape;
  Shape global_offset;
  Tensor local;  // any device: written from a host copy
};

// Stages of a save, in the order they are reached: the first two by every writer
// (write_checkpoint_shards; after_optim_file also when it has no optimizer state), the others by
// the staging process (CheckpointStaging::finish).
inline constexpr const char* kWriterSaveStages[] = {"after_model_file", "after_optim_file"};
inline constexpr const char* kSaveStages[] = {"after_model_file", "after_optim_file", "after_common_file",
                                              "before_publish",   "before_tracker",   "after_tracker"};

struct SaveOptions {
  // Called with each stage of kSaveStages as it is reached. Fault injection for tests: throwing
  // or exiting here simulates a crash at that point of the save.
  std::function<void(const std::string& stage)> on_stage;
  // The shards need not cover every tensor (metadata.json says "partial": true): a checkpoint of
  // what one rank holds (a local non-persistent checkpoint, whose distributed-optimizer state is a
  // shard). CheckpointReader::load then checks that every element it is asked for is held.
  bool partial = false;
};

// Saves `model` and `optimizer` shards and the caller's JSON `common` state as iteration
// `iteration` (or kReleaseIteration) under save_dir, creating save_dir if needed, then points the
// tracker at it. Replaces an existing checkpoint of the same iteration atomically. One process
// plays every part of the protocol above.
void save_checkpoint(const std::string& save_dir, int64_t iteration, const std::vector<ShardedTensor>& model,
                     const std::vector<ShardedTensor>& optimizer, const nlohmann::json& common,
                     const SaveOptions& options = {});

// Protocol step 2, on any writer: writes its shards into the staging directory as
// model_rank_<writer>.safetensors and optim_rank_<writer>.safetensors (each only when it has
// shards; writer = its rank, unique among the writers) and returns its report for finish().
nlohmann::json write_checkpoint_shards(const std::string& staging, int writer, const std::vector<ShardedTensor>& model,
                                       const std::vector<ShardedTensor>& optimizer, const SaveOptions& options = {});

class StagedDirectory;

// Protocol steps 1, 3 and 4, on the staging process. Destroyed unpublished (a writer or finish()
// failed), it removes the staging directory.
class CheckpointStaging {
 public:
  // Creates save_dir if needed and the staging directory of `iteration` in it.
  CheckpointStaging(const std::string& save_dir, int64_t iteration);
  ~CheckpointStaging();
  CheckpointStaging(const CheckpointStaging&) = delete;
  CheckpointStaging& operator=(const CheckpointStaging&) = delete;

  const std::string& path() const;  // where the writers write
  // Adds a file of the caller's own (e.g. the tokenizer's vocabulary) to the checkpoint: written
  // into the staging directory now, listed with its size and CRC-32C in metadata.json by finish().
  // `name` is a plain file name that the format's own files do not use (common.json,
  // metadata.json, model_rank_*, optim_rank_*), each name once.
  void add_file(const std::string& name, std::string_view content);
  // reports: every writer's write_checkpoint_shards() result, in writer order. Checks them,
  // writes common.json and metadata.json, publishes the directory and rewrites the tracker.
  void finish(const std::vector<nlohmann::json>& reports, const nlohmann::json& common,
              const SaveOptions& options = {});

 private:
  std::string save_dir_;
  int64_t iteration_;
  std::unique_ptr<StagedDirectory> directory_;
  std::map<std::string, FileDigest> added_;
};

// What a run reads of a checkpoint before it builds its model: the caller's common state and the
// files added with CheckpointStaging::add_file, verified without reading the tensor shards
// (metadata.json's checksum, then the size and CRC-32C of common.json and of each added file).
// A mismatch is an Error naming the file, as CheckpointReader::open's.
struct CheckpointHeader {
  std::string directory;                     // <load_dir>/iter_XXXXXXX
  nlohmann::json common;                     // the `common` state given to save_checkpoint
  std::map<std::string, std::string> files;  // added file name -> its path in `directory`
};
CheckpointHeader read_checkpoint_header(const std::string& load_dir, int64_t iteration);

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
