#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/checkpointing/retention.h"
#include "megatron/checkpointing/safetensors.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::checkpointing;
namespace fs = std::filesystem;

namespace {

using megatron::testing::TempDir;

std::string read_all(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& file, const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; }

void flip_byte(const std::string& file, size_t position) {
  std::string bytes = read_all(file);
  bytes[position] = char(bytes[position] ^ 0x01);
  write_all(file, bytes);
}

// Element value of the global tensor at a row-major index, shifted by `base` so that two saves
// hold different numbers. Small integers: exact in every dtype used here (bf16 holds 8 bits of
// mantissa, so values stay below 256).
float value_at(const Shape& index, const Shape& shape, float base) {
  float v = base;
  for (size_t d = 0; d < shape.size(); ++d) v = v * float(shape[d]) + float(index[d]);
  return v;
}

// The slice [offset, offset + local) of the global tensor defined by value_at.
Tensor global_slice(const Shape& global, const Shape& offset, const Shape& local, DType dtype, float base) {
  Tensor t = Tensor::empty(local, dtype);
  Shape index(local.size(), 0);
  for (int64_t flat = 0; flat < t.numel(); ++flat) {
    int64_t rest = flat;
    for (size_t d = local.size(); d-- > 0;) {
      index[d] = offset[d] + rest % local[d];
      rest /= local[d];
    }
    t.set_item(flat, value_at(index, global, base));
  }
  return t;
}

ShardedTensor shard(const std::string& name, const Shape& global, const Shape& offset, const Shape& local,
                    DType dtype = DType::f32, float base = 0) {
  return {name, global, offset, global_slice(global, offset, local, dtype, base)};
}

// "w" [6,4] saved as two row shards, plus optimizer state for it, as one rank of a TP=2 run would
// hold them after gathering; `base` makes the values of different saves distinct.
struct Saved {
  std::vector<ShardedTensor> model, optimizer;
  nlohmann::json common;
};

Saved example_state(float base) {
  Saved s;
  s.model = {shard("w", {6, 4}, {0, 0}, {3, 4}, DType::f32, base), shard("w", {6, 4}, {3, 0}, {3, 4}, DType::f32, base),
             shard("b", {4}, {0}, {4}, DType::bf16, base)};
  s.optimizer = {shard("w.exp_avg", {6, 4}, {0, 0}, {6, 4}, DType::f32, base + 1),
                 shard("step", {}, {}, {}, DType::i64, base)};
  s.common = {{"lr", 0.25}, {"rng", {1, 2, 3}}, {"consumed_samples", 1234}, {"base", base}};
  return s;
}

void save_example(const std::string& dir, int64_t iteration, float base, const SaveOptions& options = {}) {
  const Saved s = example_state(base);
  save_checkpoint(dir, iteration, s.model, s.optimizer, s.common, options);
}

// example_state(base) saved by two writers, as two ranks would: writer 0 holds the first rows of
// "w", "b" and "step", writer 1 the other rows of "w" and "w.exp_avg". `writer1` carries writer
// 1's stage hook.
void save_example_two_writers(const std::string& dir, int64_t iteration, float base, const SaveOptions& writer1 = {}) {
  const Saved s = example_state(base);
  CheckpointStaging staging(dir, iteration);
  const nlohmann::json r0 = write_checkpoint_shards(staging.path(), 0, {s.model[0], s.model[2]}, {s.optimizer[1]});
  const nlohmann::json r1 = write_checkpoint_shards(staging.path(), 1, {s.model[1]}, {s.optimizer[0]}, writer1);
  staging.finish({r0, r1}, s.common);
}

// Loads the whole of every tensor of example_state(base) and compares it exactly.
void expect_example(const std::string& dir, int64_t iteration, float base) {
  const CheckpointReader reader = CheckpointReader::open(dir, iteration);
  EXPECT_EQ(reader.common().at("base").get<float>(), base);
  const Saved s = example_state(base);
  for (const auto* group : {&s.model, &s.optimizer})
    for (const ShardedTensor& t : *group) {
      Tensor dest = Tensor::zeros(t.local.shape(), t.local.dtype());
      reader.load(t.name, t.global_offset, dest);
      EXPECT_EQ(dest.to_vector(), t.local.to_vector()) << t.name << " at iteration " << iteration;
    }
}

std::vector<std::string> staging_leftovers(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos) names.push_back(name);
  }
  return names;
}

using megatron::testing::error_of;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "'" << (needle) << "' not in: " << (haystack)

}  // namespace

TEST(Checkpoint, DirectoryAndTrackerFollowMegatron) {
  TempDir dir;
  save_example(dir.path(), 100, 0);
  EXPECT_EQ(checkpoint_directory(dir.path(), 100), dir.path() + "/iter_0000100");
  EXPECT_EQ(read_all(dir.path() + "/latest_checkpointed_iteration.txt"), "100");  // no newline
  EXPECT_EQ(read_tracker(dir.path()), 100);
  for (const char* file :
       {"model_rank_00000.safetensors", "optim_rank_00000.safetensors", "common.json", "metadata.json"})
    EXPECT_TRUE(fs::is_regular_file(dir.path() + "/iter_0000100/" + file)) << file;
  EXPECT_EQ(list_checkpoints(dir.path()), std::vector<int64_t>{100});
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());
}

TEST(Checkpoint, RoundTripsShardsAndCommonState) {
  TempDir dir;
  const Saved saved = example_state(0);
  save_checkpoint(dir.path(), 7, saved.model, saved.optimizer, saved.common);
  const CheckpointReader reader = CheckpointReader::open(dir.path(), 7);
  EXPECT_EQ(reader.iteration(), 7);
  EXPECT_EQ(reader.common(), saved.common);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"b", "step", "w", "w.exp_avg"}));
  EXPECT_EQ(reader.info("w").global_shape, (Shape{6, 4}));
  EXPECT_EQ(reader.info("b").dtype, DType::bf16);
  EXPECT_EQ(reader.info("step").global_shape, Shape{});

  Tensor whole = Tensor::empty({6, 4}, DType::f32);
  reader.load("w", {0, 0}, whole);
  EXPECT_EQ(whole.to_vector(), global_slice({6, 4}, {0, 0}, {6, 4}, DType::f32, 0).to_vector());
  // Rows [2, 5) straddle the two saved shards.
  Tensor rows = Tensor::empty({3, 4}, DType::f32);
  reader.load("w", {2, 0}, rows);
  EXPECT_EQ(rows.to_vector(), global_slice({6, 4}, {2, 0}, {3, 4}, DType::f32, 0).to_vector());
  // A column split, as a different tensor-parallel layout would ask for, converted to bf16
  // (values are integers below 256, exact in bf16).
  Tensor columns = Tensor::empty({6, 2}, DType::bf16);
  reader.load("w", {0, 2}, columns);
  EXPECT_EQ(columns.to_vector(), global_slice({6, 4}, {0, 2}, {6, 2}, DType::f32, 0).to_vector());
  Tensor step = Tensor::empty({}, DType::i64);
  reader.load("step", {}, step);
  EXPECT_EQ(step.item(), 0.0);

  // Two shards of "w" in one file are told apart by their offsets.
  const SafetensorsReader model = SafetensorsReader::open(dir.path() + "/iter_0000007/model_rank_00000.safetensors");
  EXPECT_TRUE(model.has("w@0,0") && model.has("w@3,0") && model.has("b"));
}

TEST(Checkpoint, ReshardsIrregularBlocksInThreeDimensions) {
  // Global [5,6,2] saved as four blocks of unequal size split along dims 0 and 1; every box is
  // loaded back and compared with the values computed directly.
  TempDir dir;
  const Shape global = {5, 6, 2};
  std::vector<ShardedTensor> model;
  for (int64_t r0 : {0, 2})
    for (int64_t c0 : {0, 5}) model.push_back(shard("x", global, {r0, c0, 0}, {r0 == 0 ? 2 : 3, c0 == 0 ? 5 : 1, 2}));
  save_checkpoint(dir.path(), 1, model, {}, nlohmann::json::object());
  const CheckpointReader reader = CheckpointReader::open(dir.path(), 1);
  EXPECT_FALSE(fs::exists(dir.path() + "/iter_0000001/optim_rank_00000.safetensors"));
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 6; ++c)
      for (int64_t h = 1; r + h <= 5; h += 2)
        for (int64_t w = 1; c + w <= 6; w += 2) {
          Tensor dest = Tensor::empty({h, w, 1}, DType::f32);
          reader.load("x", {r, c, 1}, dest);
          ASSERT_EQ(dest.to_vector(), global_slice(global, {r, c, 1}, {h, w, 1}, DType::f32, 0).to_vector())
              << "box at [" << r << ", " << c << ", 1] of shape [" << h << ", " << w << ", 1]";
        }
}

TEST(Checkpoint, RefusesShardsThatDoNotTileTheTensor) {
  TempDir dir;
  const auto save = [&](std::vector<ShardedTensor> model, std::vector<ShardedTensor> optimizer = {}) {
    return error_of([&] { save_checkpoint(dir.path(), 1, model, optimizer, nlohmann::json::object()); });
  };
  EXPECT_CONTAINS(save({shard("w", {6, 4}, {0, 0}, {4, 4}), shard("w", {6, 4}, {3, 0}, {3, 4})}), "overlap");
  EXPECT_CONTAINS(save({shard("w", {6, 4}, {0, 0}, {3, 4})}), "cover 12 of the 24 elements");
  EXPECT_CONTAINS(save({shard("w", {6, 4}, {4, 0}, {3, 4}), shard("w", {6, 4}, {0, 0}, {4, 4})}), "outside");
  EXPECT_CONTAINS(save({shard("w", {4}, {0}, {4})}, {shard("w", {4}, {0}, {4})}), "both the model and the optimizer");
  EXPECT_CONTAINS(save({shard("w", {6, 4}, {0, 0}, {3, 4}), shard("w", {6, 4}, {3, 0}, {3, 4}, DType::bf16)}),
                  "disagree");
  EXPECT_FALSE(read_tracker(dir.path()).has_value());
  EXPECT_TRUE(list_checkpoints(dir.path()).empty());
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());
}

TEST(Checkpoint, MissingTensorListsAvailableNames) {
  TempDir dir;
  save_example(dir.path(), 1, 0);
  const CheckpointReader reader = CheckpointReader::open(dir.path(), 1);
  EXPECT_FALSE(reader.has("v"));
  Tensor dest = Tensor::empty({4}, DType::f32);
  const std::string message = error_of([&] { reader.load("v", {0}, dest); });
  EXPECT_CONTAINS(message, "'v'");
  EXPECT_CONTAINS(message, "'w.exp_avg'");
  Tensor too_big = Tensor::empty({5}, DType::f32);
  EXPECT_CONTAINS(error_of([&] { reader.load("b", {0}, too_big); }), "outside global shape");
}

TEST(Checkpoint, FlippedByteInAShardFileIsCaught) {
  TempDir dir;
  save_example(dir.path(), 1, 0);
  save_example(dir.path(), 2, 10);
  const std::string file = dir.path() + "/iter_0000002/model_rank_00000.safetensors";
  flip_byte(file, fs::file_size(file) - 3);  // inside the tensor data: no format check could see it
  const std::string message = error_of([&] { CheckpointReader::open(dir.path(), 2); });
  EXPECT_CONTAINS(message, file);
  EXPECT_CONTAINS(message, "CRC32C expected");
  EXPECT_CONTAINS(message, "corrupt");
  EXPECT_CONTAINS(message, "earlier complete checkpoints in '" + dir.path() + "': iterations 1");
  expect_example(dir.path(), 1, 0);
}

// Complete: metadata.json present and passing its checksum, every listed file present with its
// size. Contents are only checked on open (a flipped data byte leaves the checkpoint complete).
TEST(Checkpoint, CompleteCheckpoints) {
  TempDir dir;
  for (int64_t i = 1; i <= 5; ++i) save_example(dir.path(), i, float(i));
  const auto path = [&](int64_t i, const char* file) {
    return dir.path() + "/iter_000000" + std::to_string(i) + "/" + file;
  };
  EXPECT_EQ(complete_checkpoints(dir.path()), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  fs::remove(path(2, "metadata.json"));
  flip_byte(path(3, "metadata.json"), 40);
  const std::string optim = read_all(path(4, "optim_rank_00000.safetensors"));
  write_all(path(4, "optim_rank_00000.safetensors"), optim.substr(0, optim.size() - 1));
  flip_byte(path(5, "model_rank_00000.safetensors"), fs::file_size(path(5, "model_rank_00000.safetensors")) - 3);
  EXPECT_EQ(complete_checkpoints(dir.path()), (std::vector<int64_t>{1, 5}));
  EXPECT_FALSE(checkpoint_is_complete(dir.path(), 6));  // no such directory
  const std::string message = error_of([&] { CheckpointReader::open(dir.path(), 5); });
  EXPECT_CONTAINS(message, "CRC32C expected");
  EXPECT_CONTAINS(message, "earlier complete checkpoints in '" + dir.path() + "': iterations 1");
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 1); }), "(no error)");
}

// --keep-last-checkpoints: the newest K at or below the tracker stay, and so does a directory
// above it (a save that has not published yet); the tracker's checkpoint still loads.
TEST(Checkpoint, RemovingOldCheckpointsKeepsTheNewestUpToTheTracker) {
  TempDir dir;
  for (int64_t i = 1; i <= 4; ++i) save_example(dir.path(), i, float(i));
  save_example(dir.path(), 6, 6.0f);
  write_all(dir.path() + "/latest_checkpointed_iteration.txt", "4");  // as if 6 were still publishing
  EXPECT_EQ(remove_old_checkpoints(dir.path(), 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(list_checkpoints(dir.path()), (std::vector<int64_t>{3, 4, 6}));
  EXPECT_TRUE(remove_old_checkpoints(dir.path(), 2).empty());
  expect_example(dir.path(), 4, 4.0f);
  EXPECT_EQ(remove_old_checkpoints(dir.path(), 1), (std::vector<int64_t>{3}));
  EXPECT_EQ(list_checkpoints(dir.path()), (std::vector<int64_t>{4, 6}));
}

// A partial checkpoint (one rank's local state) holds the rows it was given; a slice within them
// loads, one reaching into the gap is refused naming it; without `partial` the gap is refused on save.
TEST(Checkpoint, PartialCheckpointLoadsWhatItHoldsAndRefusesTheRest) {
  TempDir dir;
  const std::vector<ShardedTensor> rows = {shard("w", {6, 4}, {2, 0}, {3, 4})};
  EXPECT_CONTAINS(error_of([&] { save_checkpoint(dir.path(), 1, rows, {}, {{"base", 0}}); }), "cover 12 of the 24");
  save_checkpoint(dir.path(), 2, rows, {}, {{"base", 0}}, {.on_stage = {}, .partial = true});
  const CheckpointReader reader = CheckpointReader::open(dir.path(), 2);
  Tensor held = Tensor::zeros({2, 4}, DType::f32);
  reader.load("w", {3, 0}, held);
  EXPECT_EQ(held.to_vector(), global_slice({6, 4}, {3, 0}, {2, 4}, DType::f32, 0).to_vector());
  Tensor gap = Tensor::zeros({2, 4}, DType::f32);
  EXPECT_CONTAINS(error_of([&] { reader.load("w", {1, 0}, gap); }), "holds 4 of the 8 elements of tensor 'w'");
}

TEST(Checkpoint, TruncatedOrMissingFilesAreCaught) {
  TempDir dir;
  save_example(dir.path(), 1, 0);
  const std::string optim = dir.path() + "/iter_0000001/optim_rank_00000.safetensors";
  const std::string bytes = read_all(optim);
  write_all(optim, bytes.substr(0, bytes.size() - 1));
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 1); }), "bytes, expected");
  fs::remove(optim);
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 1); }), "is missing");
  fs::remove(dir.path() + "/iter_0000001/metadata.json");
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 1); }), "has no metadata.json");
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 3); }), "does not exist");
}

TEST(Checkpoint, EveryFlippedBitOfMetadataIsCaught) {
  // metadata.json cannot list its own CRC, so it carries a checksum of its canonical form: a
  // flipped bit anywhere must fail either the JSON parse or that checksum.
  // One small tensor keeps the file short: the loop rewrites it once per byte.
  TempDir dir;
  save_checkpoint(dir.path(), 1, {shard("w", {2, 2}, {0, 0}, {2, 2})}, {}, {{"seed", 1}});
  const std::string file = dir.path() + "/iter_0000001/metadata.json";
  const std::string original = read_all(file);
  for (size_t i = 0; i < original.size(); ++i) {
    std::string bytes = original;
    bytes[i] = char(bytes[i] ^ 0x01);
    write_all(file, bytes);
    const std::string message = error_of([&] { CheckpointReader::open(dir.path(), 1); });
    ASSERT_NE(message.find(file), std::string::npos) << "flip at byte " << i << ": " << message;
    ASSERT_NE(message.find("corrupt"), std::string::npos) << "flip at byte " << i << ": " << message;
  }
  write_all(file, original);
  EXPECT_NO_THROW(CheckpointReader::open(dir.path(), 1));
}

TEST(Checkpoint, FlippedByteInCommonStateIsCaught) {
  TempDir dir;
  save_example(dir.path(), 1, 0);
  const std::string file = dir.path() + "/iter_0000001/common.json";
  flip_byte(file, read_all(file).find("1234"));
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 1); }), "common.json' fails its checksum");
}

TEST(Checkpoint, StagesAreReachedInOrder) {
  TempDir dir;
  std::vector<std::string> reached;
  SaveOptions options;
  options.on_stage = [&](const std::string& stage) { reached.push_back(stage); };
  save_example(dir.path(), 1, 0, options);
  EXPECT_EQ(reached, std::vector<std::string>(std::begin(kSaveStages), std::end(kSaveStages)));
}

TEST(Checkpoint, ExceptionAtAnyStageKeepsThePreviousCheckpoint) {
  for (const std::string stage : kSaveStages) {
    SCOPED_TRACE(stage);
    TempDir dir;
    save_example(dir.path(), 1, 0);
    SaveOptions options;
    options.on_stage = [&](const std::string& s) {
      if (s == stage) throw std::runtime_error("injected failure");
    };
    EXPECT_THROW(save_example(dir.path(), 2, 10, options), std::runtime_error);
    const bool tracker_moved = stage == "after_tracker";
    EXPECT_EQ(read_tracker(dir.path()), tracker_moved ? 2 : 1);
    expect_example(dir.path(), 1, 0);
    EXPECT_TRUE(staging_leftovers(dir.path()).empty());  // an unpublished staging directory is removed
  }
}

TEST(Checkpoint, ExceptionInASecondWriterKeepsThePreviousCheckpoint) {
  for (const std::string stage : kWriterSaveStages) {
    SCOPED_TRACE(stage);
    TempDir dir;
    save_example(dir.path(), 1, 0);
    SaveOptions options;
    options.on_stage = [&](const std::string& s) {
      if (s == stage) throw std::runtime_error("injected failure");
    };
    EXPECT_THROW(save_example_two_writers(dir.path(), 2, 10, options), std::runtime_error);
    EXPECT_EQ(read_tracker(dir.path()), 1);
    expect_example(dir.path(), 1, 0);
    EXPECT_TRUE(staging_leftovers(dir.path()).empty());
  }
}

TEST(CheckpointCrashDeathTest, CrashAtAnyStageKeepsThePreviousCheckpoint) {
  // The save runs in a forked child that dies with _exit at the stage: no destructors run, so the
  // staging directory is left behind exactly as after a real crash.
  TempDir dir;
  save_example(dir.path(), 1, 0);
  for (const std::string stage : kSaveStages) {
    SCOPED_TRACE(stage);
    SaveOptions options;
    options.on_stage = [&](const std::string& s) {
      if (s == stage) ::_exit(3);
    };
    EXPECT_EXIT(save_example(dir.path(), 2, 10, options), ::testing::ExitedWithCode(3), "");
    const bool tracker_moved = stage == "after_tracker";
    ASSERT_EQ(read_tracker(dir.path()), tracker_moved ? 2 : 1);
    expect_example(dir.path(), 1, 0);
    if (tracker_moved) expect_example(dir.path(), 2, 10);
  }
  EXPECT_FALSE(staging_leftovers(dir.path()).empty());                    // the children's crashes left them
  EXPECT_EQ(list_checkpoints(dir.path()), (std::vector<int64_t>{1, 2}));  // and readers ignore them
  save_example(dir.path(), 3, 20);
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());  // the next successful save removes them
  expect_example(dir.path(), 3, 20);
}

// The same for a writer other than the staging one, dying while writing its files after writer 0
// has written its own: nothing is published, and the next save clears the leftovers.
TEST(CheckpointCrashDeathTest, CrashOfASecondWriterKeepsThePreviousCheckpoint) {
  TempDir dir;
  save_example_two_writers(dir.path(), 1, 0);
  for (const std::string stage : kWriterSaveStages) {
    SCOPED_TRACE(stage);
    SaveOptions options;
    options.on_stage = [&](const std::string& s) {
      if (s == stage) ::_exit(3);
    };
    EXPECT_EXIT(save_example_two_writers(dir.path(), 2, 10, options), ::testing::ExitedWithCode(3), "");
    ASSERT_EQ(read_tracker(dir.path()), 1);
    expect_example(dir.path(), 1, 0);
    EXPECT_EQ(list_checkpoints(dir.path()), std::vector<int64_t>{1});
  }
  EXPECT_FALSE(staging_leftovers(dir.path()).empty());
  save_example_two_writers(dir.path(), 2, 10);
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());
  expect_example(dir.path(), 2, 10);
}

TEST(Checkpoint, TwoWritersShareOneCheckpoint) {
  TempDir dir;
  save_example_two_writers(dir.path(), 1, 0);
  expect_example(dir.path(), 1, 0);
  const std::string iter = dir.path() + "/iter_0000001/";
  for (const char* file : {"model_rank_00000", "model_rank_00001", "optim_rank_00000", "optim_rank_00001"})
    EXPECT_TRUE(fs::exists(iter + file + ".safetensors")) << file;
  const nlohmann::json metadata = nlohmann::json::parse(read_all(iter + "metadata.json"));
  EXPECT_EQ(metadata.at("world_size"), 2);
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());
}

// The staging process publishes only files it can see with the size their writer reported.
TEST(Checkpoint, FinishRefusesAWriterFileItCannotSee) {
  for (const bool remove : {true, false}) {
    SCOPED_TRACE(remove ? "missing" : "truncated");
    TempDir dir;
    save_example(dir.path(), 1, 0);
    const Saved s = example_state(10);
    {
      CheckpointStaging staging(dir.path(), 2);
      const nlohmann::json r0 = write_checkpoint_shards(staging.path(), 0, {s.model[0], s.model[2]}, s.optimizer);
      const nlohmann::json r1 = write_checkpoint_shards(staging.path(), 1, {s.model[1]}, {});
      const std::string file = staging.path() + "/model_rank_00001.safetensors";
      if (remove)
        fs::remove(file);
      else
        fs::resize_file(file, fs::file_size(file) - 1);
      const std::string message = error_of([&] { staging.finish({r0, r1}, s.common); });
      EXPECT_CONTAINS(message, "model_rank_00001.safetensors");
      EXPECT_CONTAINS(message, remove ? "reported by writer 1 is not in the staging directory" : "of writer 1 has");
    }
    EXPECT_EQ(read_tracker(dir.path()), 1);
    expect_example(dir.path(), 1, 0);
    EXPECT_TRUE(staging_leftovers(dir.path()).empty());  // the unpublished staging directory is gone
  }
}

TEST(Checkpoint, SavingAnIterationAgainReplacesIt) {
  TempDir dir;
  save_example(dir.path(), 5, 0);
  const CheckpointReader old_reader = CheckpointReader::open(dir.path(), 5);
  save_example(dir.path(), 5, 30);
  expect_example(dir.path(), 5, 30);
  EXPECT_TRUE(staging_leftovers(dir.path()).empty());
  // A reader opened before the replacement keeps reading the old files (they stay mapped).
  Tensor b = Tensor::empty({4}, DType::bf16);
  old_reader.load("b", {0}, b);
  EXPECT_EQ(b.to_vector(), global_slice({4}, {0}, {4}, DType::f32, 0).to_vector());
}

TEST(Checkpoint, TrackerFormat) {
  TempDir dir;
  const std::string tracker = dir.path() + "/latest_checkpointed_iteration.txt";
  EXPECT_FALSE(read_tracker(dir.path()).has_value());
  write_all(tracker, "release");
  EXPECT_EQ(read_tracker(dir.path()), kReleaseIteration);
  write_all(tracker, "  42\n");  // hand-edited: Megatron strips whitespace too
  EXPECT_EQ(read_tracker(dir.path()), 42);
  for (const std::string bad : {"", "abc", "-5", "12x", "1e3", "99999999999999999999"}) {
    write_all(tracker, bad);
    const std::string message = error_of([&] { read_tracker(dir.path()); });
    EXPECT_CONTAINS(message, tracker);
    EXPECT_CONTAINS(message, nlohmann::json(bad).dump());
    EXPECT_EQ(message.find("delete"), std::string::npos) << "the tracker names the checkpoint to resume from";
  }
}

TEST(Checkpoint, ReleaseCheckpoint) {
  TempDir dir;
  save_example(dir.path(), kReleaseIteration, 0);
  EXPECT_EQ(read_all(dir.path() + "/latest_checkpointed_iteration.txt"), "release");
  EXPECT_TRUE(fs::is_directory(dir.path() + "/release"));
  EXPECT_EQ(read_tracker(dir.path()), kReleaseIteration);
  expect_example(dir.path(), kReleaseIteration, 0);
  EXPECT_TRUE(list_checkpoints(dir.path()).empty());  // only numbered iterations are listed
}

TEST(Checkpoint, StaleStagingFromAnotherProcessIsIgnoredThenRemoved) {
  TempDir dir;
  save_example(dir.path(), 1, 0);
  fs::create_directory(dir.path() + "/iter_0000002.tmp.99999");
  write_all(dir.path() + "/iter_0000002.tmp.99999/model_rank_00000.safetensors", "partial");
  write_all(dir.path() + "/latest_checkpointed_iteration.txt.tmp.99999", "2");
  write_all(dir.path() + "/notes.tmp.1", "not ours");
  EXPECT_EQ(list_checkpoints(dir.path()), std::vector<int64_t>{1});
  EXPECT_EQ(read_tracker(dir.path()), 1);
  save_example(dir.path(), 2, 10);
  EXPECT_EQ(staging_leftovers(dir.path()), std::vector<std::string>{"notes.tmp.1"});  // only ours are removed
}

// The caller's own files (a tokenizer's) travel inside the iteration directory, listed and
// checksummed in metadata.json like the shards; the header reads them without the shards.
namespace {
void save_with_files(const std::string& dir, int64_t iteration, float base) {
  const Saved s = example_state(base);
  CheckpointStaging staging(dir, iteration);
  staging.add_file("vocab.json", R"({"a": 0})");
  staging.add_file("merges.txt", "#version: 0.2\na b\n");
  staging.finish({write_checkpoint_shards(staging.path(), 0, s.model, s.optimizer)}, s.common);
}
}  // namespace

TEST(Checkpoint, AddedFilesAreChecksummedAndReadBack) {
  TempDir dir;
  save_with_files(dir.path(), 3, 0);
  const std::string iter = dir.path() + "/iter_0000003";
  const nlohmann::json metadata = nlohmann::json::parse(read_all(iter + "/metadata.json"));
  EXPECT_EQ(metadata.at("files").at("merges.txt").at("bytes"), 18);
  EXPECT_TRUE(metadata.at("files").contains("vocab.json"));
  expect_example(dir.path(), 3, 0);

  const CheckpointHeader header = read_checkpoint_header(dir.path(), 3);
  EXPECT_EQ(header.directory, iter);
  EXPECT_EQ(header.common, example_state(0).common);
  EXPECT_EQ(header.files, (std::map<std::string, std::string>{{"merges.txt", iter + "/merges.txt"},
                                                              {"vocab.json", iter + "/vocab.json"}}));
  EXPECT_EQ(read_all(header.files.at("vocab.json")), R"({"a": 0})");
  // A checkpoint saved without added files has none.
  save_example(dir.path(), 4, 0);
  EXPECT_TRUE(read_checkpoint_header(dir.path(), 4).files.empty());

  // The header verifies what it returns and skips the shards; the reader verifies everything.
  const std::string shard = iter + "/model_rank_00000.safetensors";
  flip_byte(shard, fs::file_size(shard) - 3);
  EXPECT_EQ(read_checkpoint_header(dir.path(), 3).files.size(), 2u);
  EXPECT_CONTAINS(error_of([&] { CheckpointReader::open(dir.path(), 3); }), "model_rank_00000.safetensors");
  flip_byte(iter + "/merges.txt", 5);
  for (const std::string& message : {error_of([&] { read_checkpoint_header(dir.path(), 3); }),
                                     error_of([&] { CheckpointReader::open(dir.path(), 3); })}) {
    EXPECT_CONTAINS(message, "merges.txt' fails its checksum");
  }
  flip_byte(iter + "/common.json", 5);
  EXPECT_CONTAINS(error_of([&] { read_checkpoint_header(dir.path(), 3); }), "common.json' fails its checksum");
  save_with_files(dir.path(), 5, 0);
  fs::remove(dir.path() + "/iter_0000005/vocab.json");
  EXPECT_CONTAINS(error_of([&] { read_checkpoint_header(dir.path(), 5); }), "vocab.json' is missing");
  EXPECT_CONTAINS(error_of([&] { read_checkpoint_header(dir.path(), 9); }), "does not exist");
}

TEST(Checkpoint, AddedFileNamesAreCheckedUpFront) {
  TempDir dir;
  CheckpointStaging staging(dir.path(), 1);
  for (const char* name : {"common.json", "metadata.json", "model_rank_00000.safetensors", "optim_rank_00003.x"})
    EXPECT_CONTAINS(error_of([&] { staging.add_file(name, "x"); }), "is the format's own");
  for (const char* name : {"", "a/b", "..", "."})
    EXPECT_CONTAINS(error_of([&] { staging.add_file(name, "x"); }), "must be a plain file name");
  staging.add_file("tokenizer.json", "{}");
  EXPECT_CONTAINS(error_of([&] { staging.add_file("tokenizer.json", "{}"); }), "is added twice");
}
