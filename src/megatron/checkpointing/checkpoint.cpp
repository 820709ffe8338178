#include "megatron/checkpointing/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "megatron/checkpointing/atomic_file.h"
#include "megatron/checkpointing/crc32c.h"
#include "megatron/checkpointing/safetensors.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/progress.h"

namespace megatron::checkpointing {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormatName = "megatron-cpp-sharded";
constexpr int kFormatVersion = 1;
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kCommonFile = "common.json";

// Where one shard lives, and which part of the global tensor it holds.
struct ShardLocation {
  std::string file;
  std::string key;
  Shape global_offset;
  Shape local_shape;
};

struct TensorMeta {
  DType dtype = DType::f32;
  Shape global_shape;
  std::vector<ShardLocation> shards;
};

using TensorTable = std::map<std::string, TensorMeta>;

// What one writer wrote: its files' digests and its shards (the report, as JSON, that travels to
// the finishing process).
struct RankReport {
  std::map<std::string, FileDigest> files;
  std::vector<std::pair<std::string, TensorMeta>> shards;  // one shard each
};

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

std::string rank_file(const char* kind, int rank) {
  char text[64];
  std::snprintf(text, sizeof(text), "%s_rank_%05d.safetensors", kind, rank);
  return text;
}

std::string iteration_dir_name(int64_t iteration) {
  if (iteration == kReleaseIteration) return "release";
  char text[32];
  std::snprintf(text, sizeof(text), "iter_%07lld", static_cast<long long>(iteration));
  return text;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Decimal iteration numbers; more than 18 digits could overflow int64.
std::optional<int64_t> parse_iteration(const std::string& digits) {
  if (!all_digits(digits) || digits.size() > 18) return std::nullopt;
  return std::stoll(digits);
}

std::optional<int64_t> iteration_of_dir_name(const std::string& name) {
  if (name.rfind("iter_", 0) != 0) return std::nullopt;
  return parse_iteration(name.substr(5));
}

// Quoted and escaped, for messages about file contents that may be binary garbage.
std::string quoted(const std::string& text) {
  return json(text.substr(0, 64)).dump(-1, ' ', true, json::error_handler_t::replace) + (text.size() > 64 ? "..." : "");
}

std::string list_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() > 5) os << ", ... (" << names.size() << " in all)";
  return names.empty() ? "none" : os.str();
}

// ---- shard geometry -------------------------------------------------------------------------

// The shards must tile the global shape: each inside it, no two sharing an element, and together
// as many elements as the whole (unless `partial`: then CheckpointReader::load checks the slices it
// is asked for). `where` names the tensor's origin in messages.
void check_tiling(const std::string& where, const std::string& name, const TensorMeta& t, bool partial) {
  const size_t rank = t.global_shape.size();
  int64_t covered = 0;
  for (const ShardLocation& s : t.shards) {
    MEGATRON_CHECK(s.global_offset.size() == rank && s.local_shape.size() == rank,
                   where << ": shard of tensor '" << name << "' at offset " << shape_str(s.global_offset)
                         << " with shape " << shape_str(s.local_shape) << " does not have the " << rank
                         << " dimensions of global shape " << shape_str(t.global_shape));
    for (size_t d = 0; d < rank; ++d)
      MEGATRON_CHECK(s.global_offset[d] >= 0 && s.local_shape[d] >= 0 &&
                         s.global_offset[d] + s.local_shape[d] <= t.global_shape[d],
                     where << ": shard of tensor '" << name << "' at offset " << shape_str(s.global_offset)
                           << " with shape " << shape_str(s.local_shape) << " lies outside global shape "
                           << shape_str(t.global_shape));
    covered += shape_numel(s.local_shape);
  }
  for (size_t i = 0; i < t.shards.size(); ++i)
    for (size_t j = i + 1; j < t.shards.size(); ++j) {
      const ShardLocation &a = t.shards[i], &b = t.shards[j];
      bool overlap = shape_numel(a.local_shape) > 0 && shape_numel(b.local_shape) > 0;
      for (size_t d = 0; d < rank && overlap; ++d)
        overlap = a.global_offset[d] < b.global_offset[d] + b.local_shape[d] &&
                  b.global_offset[d] < a.global_offset[d] + a.local_shape[d];
      MEGATRON_CHECK(!overlap, where << ": shards of tensor '" << name << "' at offsets " << shape_str(a.global_offset)
                                     << " and " << shape_str(b.global_offset)
                                     << " overlap; each element must be saved by exactly one rank "
                                     << "(save one replica of data-parallel copies)");
    }
  MEGATRON_CHECK(partial || covered == shape_numel(t.global_shape),
                 where << ": shards of tensor '" << name << "' cover " << covered << " of the "
                       << shape_numel(t.global_shape) << " elements of global shape " << shape_str(t.global_shape)
                       << "; every element must be saved by some rank");
}

// Copies the box `extent` that starts at src_start in a row-major array of shape src_shape to
// dst_start in one of shape dst_shape, a row of the innermost dimension at a time.
void copy_box(const uint8_t* src, const Shape& src_shape, const Shape& src_start, uint8_t* dst, const Shape& dst_shape,
              const Shape& dst_start, const Shape& extent, size_t element_size) {
  if (shape_numel(extent) == 0) return;
  const size_t rank = extent.size();
  if (rank == 0) {
    std::memcpy(dst, src, element_size);
    return;
  }
  const auto linear = [rank](const Shape& shape, const Shape& start, const Shape& index) {
    int64_t offset = 0;
    for (size_t d = 0; d < rank; ++d) offset = offset * shape[d] + start[d] + index[d];
    return size_t(offset);
  };
  const size_t row_bytes = size_t(extent.back()) * element_size;
  Shape index(rank, 0);  // position inside the box; the innermost entry stays 0
  while (true) {
    std::memcpy(dst + linear(dst_shape, dst_start, index) * element_size,
                src + linear(src_shape, src_start, index) * element_size, row_bytes);
    int d = int(rank) - 2;
    for (; d >= 0; --d) {
      if (++index[size_t(d)] < extent[size_t(d)]) break;
      index[size_t(d)] = 0;
    }
    if (d < 0) return;
  }
}

// ---- saving ---------------------------------------------------------------------------------

void check_sharded_tensor(const ShardedTensor& s) {
  MEGATRON_CHECK(!s.name.empty(), "a sharded tensor has an empty name; give every tensor its global name");
  MEGATRON_CHECK(s.local.defined(), "sharded tensor '" << s.name << "' has no local data");
  MEGATRON_CHECK(s.global_shape.size() == s.global_offset.size() && s.global_shape.size() == s.local.shape().size(),
                 "sharded tensor '" << s.name << "': global shape " << shape_str(s.global_shape) << ", offset "
                                    << shape_str(s.global_offset) << " and local shape " << shape_str(s.local.shape())
                                    << " must have the same number of dimensions");
}

// Writes one rank's shards of one kind into `file`, recording its digest and shard locations.
void write_shard_file(const std::string& dir, const std::string& file, const std::vector<ShardedTensor>& shards,
                      RankReport& report) {
  if (shards.empty()) return;
  std::map<std::string, int> count;
  for (const ShardedTensor& s : shards) ++count[s.name];
  std::vector<NamedTensor> named;
  for (const ShardedTensor& s : shards) {
    std::string key = s.name;
    if (count[s.name] > 1) {
      key += "@";
      for (size_t d = 0; d < s.global_offset.size(); ++d) key += (d ? "," : "") + std::to_string(s.global_offset[d]);
    }
    named.push_back({key, s.local.to(Device::cpu())});  // device tensors are written from a host copy
    report.shards.push_back(
        {s.name, {s.local.dtype(), s.global_shape, {{file, key, s.global_offset, s.local.shape()}}}});
  }
  report.files[file] = write_safetensors(join(dir, file), named, {{"format", kFormatName}});
}

void reach(const SaveOptions& options, const char* stage) {
  if (options.on_stage) options.on_stage(stage);
}

// A writer's report as it travels to the finishing process:
//   {"files": {"<file>": {"bytes": 123, "crc32c": "e3069283"}},
//    "shards": [{"name": .., "dtype": "BF16", "global_shape": [..], "file": .., "key": ..,
//                "global_offset": [..], "local_shape": [..]}, ...]}
json report_to_json(const RankReport& report) {
  json files = json::object();
  for (const auto& [name, digest] : report.files)
    files[name] = {{"bytes", digest.bytes}, {"crc32c", hex32(digest.crc32c)}};
  json shards = json::array();
  for (const auto& [name, t] : report.shards) {
    const ShardLocation& s = t.shards.front();
    shards.push_back({{"name", name},
                      {"dtype", safetensors_dtype_name(t.dtype)},
                      {"global_shape", t.global_shape},
                      {"file", s.file},
                      {"key", s.key},
                      {"global_offset", s.global_offset},
                      {"local_shape", s.local_shape}});
  }
  return {{"files", files}, {"shards", shards}};
}

RankReport report_from_json(const json& j, int writer) {
  RankReport report;
  try {
    for (const auto& item : j.at("files").items()) {
      const std::string crc = item.value().at("crc32c").get<std::string>();
      report.files[item.key()] = {item.value().at("bytes").get<uint64_t>(), uint32_t(std::stoul(crc, nullptr, 16))};
    }
    for (const json& s : j.at("shards")) {
      const std::string dtype = s.at("dtype").get<std::string>();
      const std::optional<DType> parsed = dtype_from_safetensors_name(dtype);
      MEGATRON_CHECK(parsed.has_value(), "unknown dtype '" << dtype << "'");
      report.shards.push_back({s.at("name").get<std::string>(),
                               {*parsed,
                                s.at("global_shape").get<Shape>(),
                                {{s.at("file").get<std::string>(), s.at("key").get<std::string>(),
                                  s.at("global_offset").get<Shape>(), s.at("local_shape").get<Shape>()}}}});
    }
  } catch (const std::exception& e) {
    MEGATRON_FAIL("the checkpoint report of writer " << writer << " is malformed (" << e.what()
                                                     << "); it must come from write_checkpoint_shards");
  }
  return report;
}

// A writer's file must be in the staging directory with the size it reported: a writer that saw
// another directory (--save not shared by every rank) or a torn write is caught before publishing.
void check_written_file(const std::string& dir, const std::string& file, const FileDigest& digest, int writer) {
  const std::string path = join(dir, file);
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  MEGATRON_CHECK(!ec, "checkpoint file '" << path << "' reported by writer " << writer << " is not in the staging "
                                          << "directory (" << ec.message() << "): --save must be a directory every "
                                          << "rank shares");
  MEGATRON_CHECK(bytes == digest.bytes, "checkpoint file '" << path << "' of writer " << writer << " has " << bytes
                                                            << " bytes, but the writer reported " << digest.bytes);
}

FileDigest write_common(const std::string& dir, int64_t iteration, const json& common) {
  std::string text;
  try {
    text = json{{"iteration", iteration}, {"state", common}}.dump(2);
  } catch (const json::exception& e) {
    MEGATRON_FAIL("cannot save the common checkpoint state: " << e.what() << "; strings must be valid UTF-8");
  }
  return write_file_atomic(join(dir, kCommonFile), text);
}

// Rank 0: merges the ranks' reports into the tensor table and checks that the shards tile it.
TensorTable merge_reports(const std::vector<RankReport>& reports, bool partial) {
  TensorTable table;
  for (const RankReport& report : reports)
    for (const auto& [name, shard] : report.shards) {
      auto [it, inserted] = table.try_emplace(name, TensorMeta{shard.dtype, shard.global_shape, {}});
      TensorMeta& t = it->second;
      MEGATRON_CHECK(t.dtype == shard.dtype && t.global_shape == shard.global_shape,
                     "shards of tensor '" << name << "' disagree: " << dtype_name(t.dtype) << " "
                                          << shape_str(t.global_shape) << " versus " << dtype_name(shard.dtype) << " "
                                          << shape_str(shard.global_shape)
                                          << "; all shards must share dtype and global shape");
      t.shards.push_back(shard.shards.front());
    }
  for (const auto& [name, t] : table) check_tiling("cannot save checkpoint", name, t, partial);
  return table;
}

json tensor_to_json(const TensorMeta& t) {
  json shards = json::array();
  for (const ShardLocation& s : t.shards)
    shards.push_back(
        {{"file", s.file}, {"key", s.key}, {"global_offset", s.global_offset}, {"local_shape", s.local_shape}});
  return {{"dtype", safetensors_dtype_name(t.dtype)}, {"global_shape", t.global_shape}, {"shards", shards}};
}

// The checksum covers the compact dump of the object without "checksum"; nlohmann::json keeps keys
// sorted and the metadata holds only strings and integers, so the dump is canonical.
std::string metadata_checksum(const json& metadata) {
  const std::string canonical = metadata.dump();
  return hex32(crc32c(canonical.data(), canonical.size()));
}

void write_metadata(const std::string& dir, int64_t iteration, int world_size,
                    const std::map<std::string, FileDigest>& files, const TensorTable& tensors, bool partial) {
  json metadata = {{"format", kFormatName},
                   {"format_version", kFormatVersion},
                   {"iteration", iteration},
                   {"world_size", world_size}};
  if (partial) metadata["partial"] = true;
  json& files_json = metadata["files"] = json::object();
  for (const auto& [name, digest] : files)
    files_json[name] = {{"bytes", digest.bytes}, {"crc32c", hex32(digest.crc32c)}};
  json& tensors_json = metadata["tensors"] = json::object();
  for (const auto& [name, t] : tensors) tensors_json[name] = tensor_to_json(t);
  metadata["checksum"] = metadata_checksum(metadata);
  write_file_atomic(join(dir, kMetadataFile), metadata.dump(1));
}

void write_tracker(const std::string& save_dir, int64_t iteration) {
  write_file_atomic(join(save_dir, kTrackerFileName),
                    iteration == kReleaseIteration ? std::string("release") : std::to_string(iteration));
}

// Leftovers of crashed saves: staging copies of iteration directories and of the tracker.
void remove_stale_staging(const std::string& save_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(save_dir, ec)) {
    const std::optional<std::string> base = staging_base_name(entry.path().filename().string());
    if (!base || !(iteration_of_dir_name(*base) || *base == "release" || *base == kTrackerFileName)) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (remove_ec) LOG_WARN("could not remove stale '" << entry.path().string() << "': " << remove_ec.message());
  }
}

// ---- loading --------------------------------------------------------------------------------

// What a reader of a broken checkpoint can load instead, worked out only when an error prints it
// (it reads the metadata of every checkpoint). Empty load_dir: nothing is printed.
struct EarlierCheckpoints {
  std::string load_dir;
  int64_t iteration = 0;
};

std::ostream& operator<<(std::ostream& os, const EarlierCheckpoints& hint) {
  if (hint.load_dir.empty()) return os;
  std::string list;
  for (int64_t i : complete_checkpoints(hint.load_dir))
    if (hint.iteration == kReleaseIteration || i < hint.iteration)
      list += (list.empty() ? "" : ", ") + std::to_string(i);
  if (list.empty()) return os << "; no earlier complete checkpoint exists in '" << hint.load_dir << "'";
  return os << "; earlier complete checkpoints in '" << hint.load_dir << "': iterations " << list;
}

TensorMeta tensor_from_json(const json& j) {
  TensorMeta t;
  const std::string dtype = j.at("dtype").get<std::string>();
  const std::optional<DType> parsed = dtype_from_safetensors_name(dtype);
  MEGATRON_CHECK(parsed.has_value(), "unknown dtype '" << dtype << "'");
  t.dtype = *parsed;
  t.global_shape = j.at("global_shape").get<Shape>();
  for (const json& s : j.at("shards"))
    t.shards.push_back({s.at("file").get<std::string>(), s.at("key").get<std::string>(),
                        s.at("global_offset").get<Shape>(), s.at("local_shape").get<Shape>()});
  return t;
}

// Reads metadata.json and checks its own checksum and format.
json read_metadata(const std::string& dir, int64_t iteration, const EarlierCheckpoints& hint) {
  const std::string path = join(dir, kMetadataFile);
  MEGATRON_CHECK(fs::exists(path), "checkpoint '" << dir << "' has no " << kMetadataFile
                                                  << ": its save did not complete, or it is not a megatron-cpp "
                                                  << "checkpoint" << hint);
  json metadata = json::parse(read_file(path), nullptr, false);
  MEGATRON_CHECK(metadata.is_object() && metadata.contains("checksum") && metadata["checksum"].is_string(),
                 "checkpoint metadata '" << path << "' is not a JSON object with a checksum: the checkpoint is "
                                         << "corrupt" << hint);
  const std::string expected = metadata["checksum"].get<std::string>();
  metadata.erase("checksum");
  const std::string actual = metadata_checksum(metadata);
  MEGATRON_CHECK(actual == expected, "checkpoint metadata '" << path << "' fails its checksum (CRC32C expected "
                                                             << expected << ", actual " << actual
                                                             << "): the checkpoint is corrupt" << hint);
  MEGATRON_CHECK(metadata.value("format", "") == kFormatName && metadata.value("format_version", 0) == kFormatVersion,
                 "checkpoint '" << dir << "' has format " << quoted(metadata.value("format", "")) << " version "
                                << metadata.value("format_version", 0) << "; this build reads " << kFormatName
                                << " version " << kFormatVersion);
  MEGATRON_CHECK(metadata.value("iteration", int64_t(-2)) == iteration,
                 "checkpoint '" << dir << "' records iteration " << metadata.value("iteration", int64_t(-2)) << ", not "
                                << iteration << " as its directory name says; it was moved or renamed");
  return metadata;
}

// Every listed file must have the recorded size and (with `contents`) CRC-32C: a flipped bit
// anywhere is caught before any tensor is used.
void verify_files(const std::string& dir, const json& files, const EarlierCheckpoints& hint, bool contents = true) {
  // Checksumming reads every byte: the long part of loading a large checkpoint.
  int64_t total_bytes = 0;
  for (const auto& item : files.items()) total_bytes += item.value().at("bytes").get<int64_t>();
  ProgressReporter progress("checkpoint '" + dir + "' verification", total_bytes, "bytes");
  for (const auto& item : files.items()) {
    const std::string& name = item.key();
    MEGATRON_CHECK(name.find('/') == std::string::npos && name != "." && name != "..",
                   "checkpoint '" << dir << "' lists file " << quoted(name) << ", which is not a plain file name");
    const std::string path = join(dir, name);
    MEGATRON_CHECK(fs::is_regular_file(path),
                   "checkpoint file '" << path << "' is missing: the checkpoint is incomplete" << hint);
    const uint64_t bytes = item.value().at("bytes").get<uint64_t>();
    if (!contents) {
      MEGATRON_CHECK(fs::file_size(path) == bytes, "checkpoint file '" << path << "' has " << fs::file_size(path)
                                                                       << " bytes, expected " << bytes
                                                                       << ": the checkpoint is corrupt" << hint);
      continue;
    }
    const FileDigest actual = digest_file(path);
    const std::string crc = item.value().at("crc32c").get<std::string>();
    MEGATRON_CHECK(actual.bytes == bytes, "checkpoint file '" << path << "' has " << actual.bytes << " bytes, expected "
                                                              << bytes << ": the checkpoint is corrupt" << hint);
    MEGATRON_CHECK(hex32(actual.crc32c) == crc, "checkpoint file '" << path << "' fails its checksum (CRC32C expected "
                                                                    << crc << ", actual " << hex32(actual.crc32c)
                                                                    << "): the checkpoint is corrupt" << hint);
    progress.advance(int64_t(bytes));
  }
  if (contents) progress.finish();
}

// common.json's state, which must record the directory's iteration (its digest is verified first).
json read_common_state(const std::string& dir, int64_t iteration, const EarlierCheckpoints& hint) {
  const json common = json::parse(read_file(join(dir, kCommonFile)));
  MEGATRON_CHECK(common.at("iteration").get<int64_t>() == iteration,
                 "'" << join(dir, kCommonFile) << "' records iteration " << common.at("iteration") << ", not "
                     << iteration << ": the directory mixes files of different saves" << hint);
  return common.at("state");
}

// The files of a checkpoint that hold no tensor shard: common.json and the caller's added files.
json files_without_shards(const json& metadata) {
  json files = metadata.at("files");
  for (const auto& tensor : metadata.at("tensors").items())
    for (const json& s : tensor.value().at("shards")) files.erase(s.at("file").get<std::string>());
  return files;
}

// The file names the format itself writes; the caller's added files must not take them.
bool reserved_file_name(const std::string& name) {
  return name == kCommonFile || name == kMetadataFile || name.rfind("model_rank_", 0) == 0 ||
         name.rfind("optim_rank_", 0) == 0;
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------

std::string checkpoint_directory(const std::string& root, int64_t iteration) {
  MEGATRON_CHECK(iteration >= 0 || iteration == kReleaseIteration,
                 "checkpoint iteration " << iteration << " is negative; use a non-negative iteration or "
                                         << "kReleaseIteration");
  return join(root, iteration_dir_name(iteration));
}

std::optional<int64_t> read_tracker(const std::string& load_dir) {
  const std::string path = join(load_dir, kTrackerFileName);
  if (!fs::exists(path)) return std::nullopt;
  const std::string content = read_file(path);
  const size_t first = content.find_first_not_of(" \t\r\n");
  const std::string trimmed =
      first == std::string::npos ? "" : content.substr(first, content.find_last_not_of(" \t\r\n") - first + 1);
  if (trimmed == "release") return kReleaseIteration;
  const std::optional<int64_t> iteration = parse_iteration(trimmed);
  MEGATRON_CHECK(iteration.has_value(), "checkpoint tracker '" << path << "' holds " << quoted(content)
                                                               << "; expected an iteration number in ASCII decimal "
                                                               << "or 'release': the checkpoint to resume from");
  return iteration;
}

std::vector<int64_t> list_checkpoints(const std::string& load_dir) {
  std::vector<int64_t> iterations;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(load_dir, ec)) {
    const std::optional<int64_t> iteration = iteration_of_dir_name(entry.path().filename().string());
    if (iteration && entry.is_directory()) iterations.push_back(*iteration);
  }
  std::sort(iterations.begin(), iterations.end());
  return iterations;
}

bool checkpoint_is_complete(const std::string& load_dir, int64_t iteration) {
  const std::string dir = checkpoint_directory(load_dir, iteration);
  try {
    const json metadata = read_metadata(dir, iteration, {});
    verify_files(dir, metadata.at("files"), {}, /*contents=*/false);
    return true;
  } catch (const std::exception&) {  // Error, or a metadata structure that does not parse
    return false;
  }
}

std::vector<int64_t> complete_checkpoints(const std::string& load_dir) {
  std::vector<int64_t> complete;
  for (int64_t i : list_checkpoints(load_dir))
    if (checkpoint_is_complete(load_dir, i)) complete.push_back(i);
  return complete;
}

json write_checkpoint_shards(const std::string& staging, int writer, const std::vector<ShardedTensor>& model,
                             const std::vector<ShardedTensor>& optimizer, const SaveOptions& options) {
  std::set<std::string> model_names;
  for (const ShardedTensor& s : model) {
    check_sharded_tensor(s);
    model_names.insert(s.name);
  }
  for (const ShardedTensor& s : optimizer) {
    check_sharded_tensor(s);
    MEGATRON_CHECK(model_names.count(s.name) == 0, "tensor name '" << s.name << "' is used by both the model and the "
                                                                   << "optimizer state; names must be unique");
  }
  MEGATRON_CHECK(writer >= 0, "checkpoint writer " << writer << " must be >= 0 (its rank)");
  RankReport report;
  write_shard_file(staging, rank_file("model", writer), model, report);
  reach(options, "after_model_file");
  write_shard_file(staging, rank_file("optim", writer), optimizer, report);
  reach(options, "after_optim_file");
  return report_to_json(report);
}

CheckpointStaging::CheckpointStaging(const std::string& save_dir, int64_t iteration)
    : save_dir_(save_dir), iteration_(iteration) {
  const std::string final_dir = checkpoint_directory(save_dir, iteration);
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MEGATRON_CHECK(!ec, "cannot create checkpoint directory '" << save_dir << "': " << ec.message()
                                                             << "; check the path and its permissions");
  directory_ = std::make_unique<StagedDirectory>(final_dir);
}

CheckpointStaging::~CheckpointStaging() = default;

const std::string& CheckpointStaging::path() const { return directory_->path(); }

void CheckpointStaging::add_file(const std::string& name, std::string_view content) {
  MEGATRON_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                 "checkpoint file name " << quoted(name) << " must be a plain file name (no '/')");
  MEGATRON_CHECK(!reserved_file_name(name), "checkpoint file name '"
                                                << name << "' is the format's own (common.json, metadata.json, "
                                                << "model_rank_*, optim_rank_*); give the file another name");
  MEGATRON_CHECK(added_.count(name) == 0, "checkpoint file '" << name << "' is added twice; add each file once");
  added_[name] = write_file_atomic(join(path(), name), content);
}

void CheckpointStaging::finish(const std::vector<json>& reports, const json& common, const SaveOptions& options) {
  std::vector<RankReport> parsed;
  std::map<std::string, FileDigest> files;
  for (size_t w = 0; w < reports.size(); ++w) {
    parsed.push_back(report_from_json(reports[w], int(w)));
    for (const auto& [file, digest] : parsed.back().files) {
      MEGATRON_CHECK(files.emplace(file, digest).second,
                     "checkpoint file '" << file << "' is reported by two writers; each writer names its files "
                                         << "by its own rank");
      check_written_file(path(), file, digest, int(w));
    }
  }
  const TensorTable tensors = merge_reports(parsed, options.partial);
  files.insert(added_.begin(), added_.end());  // reserved_file_name keeps them apart from the writers'
  files[kCommonFile] = write_common(path(), iteration_, common);
  reach(options, "after_common_file");
  write_metadata(path(), iteration_, int(reports.size()), files, tensors, options.partial);
  reach(options, "before_publish");
  directory_->publish();
  reach(options, "before_tracker");
  write_tracker(save_dir_, iteration_);
  reach(options, "after_tracker");
  remove_stale_staging(save_dir_);
}

void save_checkpoint(const std::string& save_dir, int64_t iteration, const std::vector<ShardedTensor>& model,
                     const std::vector<ShardedTensor>& optimizer, const json& common, const SaveOptions& options) {
  CheckpointStaging staging(save_dir, iteration);
  staging.finish({write_checkpoint_shards(staging.path(), 0, model, optimizer, options)}, common, options);
}

struct CheckpointReader::State {
  std::string directory;
  int64_t iteration = 0;
  json common;
  TensorTable tensors;
  std::map<std::string, SafetensorsReader> files;
};

CheckpointReader CheckpointReader::open(const std::string& load_dir, int64_t iteration) {
  auto state = std::make_shared<State>();
  state->directory = checkpoint_directory(load_dir, iteration);
  state->iteration = iteration;
  const EarlierCheckpoints hint{load_dir, iteration};
  MEGATRON_CHECK(fs::is_directory(state->directory),
                 "checkpoint directory '" << state->directory << "' does not exist" << hint);
  const std::string where = "checkpoint metadata '" + join(state->directory, kMetadataFile) + "'";
  json metadata;
  // Past the checksums, a structure that does not parse is a writer's bug rather than a flipped
  // bit; either way the checkpoint cannot be used.
  try {
    metadata = read_metadata(state->directory, iteration, hint);
    verify_files(state->directory, metadata.at("files"), hint);
    for (const auto& item : metadata.at("tensors").items()) state->tensors[item.key()] = tensor_from_json(item.value());
    state->common = read_common_state(state->directory, iteration, hint);
  } catch (const json::exception& e) {
    MEGATRON_FAIL(where << " or " << kCommonFile << " is malformed (" << e.what() << ")" << hint);
  }
  for (const auto& [name, t] : state->tensors) {
    check_tiling(where, name, t, metadata.value("partial", false));
    for (const ShardLocation& s : t.shards) {
      MEGATRON_CHECK(metadata["files"].contains(s.file),
                     where << ": tensor '" << name << "' has a shard in unlisted file '" << s.file << "'");
      auto it = state->files.find(s.file);
      if (it == state->files.end())
        it = state->files.emplace(s.file, SafetensorsReader::open(join(state->directory, s.file))).first;
      const SafetensorsEntry& entry = it->second.info(s.key);
      MEGATRON_CHECK(entry.dtype == t.dtype && entry.shape == s.local_shape,
                     where << ": shard '" << s.key << "' of '" << s.file << "' is " << dtype_name(entry.dtype) << " "
                           << shape_str(entry.shape) << " but the metadata says " << dtype_name(t.dtype) << " "
                           << shape_str(s.local_shape));
    }
  }
  CheckpointReader reader;
  reader.state_ = std::move(state);
  return reader;
}

const std::string& CheckpointReader::directory() const { return state_->directory; }
int64_t CheckpointReader::iteration() const { return state_->iteration; }
const json& CheckpointReader::common() const { return state_->common; }

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> names;
  for (const auto& item : state_->tensors) names.push_back(item.first);
  return names;
}

bool CheckpointReader::has(const std::string& name) const { return state_->tensors.count(name) != 0; }

TensorInfo CheckpointReader::info(const std::string& name) const {
  const auto it = state_->tensors.find(name);
  MEGATRON_CHECK(it != state_->tensors.end(), "tensor '" << name << "' is not in checkpoint '" << state_->directory
                                                         << "'; it holds " << list_names(names()));
  return {it->second.global_shape, it->second.dtype};
}

void CheckpointReader::load(const std::string& name, const Shape& global_offset, Tensor& dest) const {
  const TensorInfo tensor = info(name);
  const TensorMeta& meta = state_->tensors.at(name);
  const size_t rank = tensor.global_shape.size();
  MEGATRON_CHECK(dest.defined(), "loading tensor '" << name << "' needs a defined destination tensor");
  if (!dest.device().is_cpu()) {  // assemble on the host, then one copy to the device
    Tensor host = Tensor::empty(dest.shape(), dest.dtype());
    load(name, global_offset, host);
    dest.copy_from(host);
    return;
  }
  MEGATRON_CHECK(dest.shape().size() == rank && global_offset.size() == rank,
                 "loading tensor '" << name << "' of global shape " << shape_str(tensor.global_shape) << " into "
                                    << shape_str(dest.shape()) << " at offset " << shape_str(global_offset)
                                    << ": the number of dimensions differs");
  for (size_t d = 0; d < rank; ++d)
    MEGATRON_CHECK(global_offset[d] >= 0 && global_offset[d] + dest.shape()[d] <= tensor.global_shape[d],
                   "loading tensor '" << name << "': slice at offset " << shape_str(global_offset) << " with shape "
                                      << shape_str(dest.shape()) << " lies outside global shape "
                                      << shape_str(tensor.global_shape));
  const Shape origin(rank, 0);
  const size_t stored_size = dtype_size(tensor.dtype);
  int64_t found = 0;  // elements of the slice the shards hold (they never overlap)
  for (const ShardLocation& s : meta.shards) {
    Shape lo(rank), extent(rank);
    bool overlaps = true;
    for (size_t d = 0; d < rank && overlaps; ++d) {
      lo[d] = std::max(global_offset[d], s.global_offset[d]);
      extent[d] = std::min(global_offset[d] + dest.shape()[d], s.global_offset[d] + s.local_shape[d]) - lo[d];
      overlaps = extent[d] > 0;
    }
    if (!overlaps) continue;
    found += shape_numel(extent);
    Shape src_start(rank), dst_start(rank);
    for (size_t d = 0; d < rank; ++d) {
      src_start[d] = lo[d] - s.global_offset[d];
      dst_start[d] = lo[d] - global_offset[d];
    }
    const uint8_t* src = state_->files.at(s.file).bytes(s.key);
    auto* dst = static_cast<uint8_t*>(dest.raw());
    if (dest.dtype() == tensor.dtype) {
      copy_box(src, s.local_shape, src_start, dst, dest.shape(), dst_start, extent, stored_size);
      continue;
    }
    Tensor piece = Tensor::empty(extent, tensor.dtype);
    copy_box(src, s.local_shape, src_start, static_cast<uint8_t*>(piece.raw()), extent, origin, extent, stored_size);
    const Tensor converted = piece.to(dest.dtype());
    copy_box(static_cast<const uint8_t*>(converted.raw()), extent, origin, dst, dest.shape(), dst_start, extent,
             dest.element_size());
  }
  // Only a partial checkpoint (SaveOptions::partial) can leave a hole.
  MEGATRON_CHECK(found == dest.numel(), "checkpoint '" << state_->directory << "' holds " << found << " of the "
                                                       << dest.numel() << " elements of tensor '" << name
                                                       << "' at offset " << shape_str(global_offset) << " with shape "
                                                       << shape_str(dest.shape())
                                                       << ": it is a partial (per-rank) checkpoint of another layout");
}

CheckpointHeader read_checkpoint_header(const std::string& load_dir, int64_t iteration) {
  CheckpointHeader header;
  header.directory = checkpoint_directory(load_dir, iteration);
  const EarlierCheckpoints hint{load_dir, iteration};
  MEGATRON_CHECK(fs::is_directory(header.directory),
                 "checkpoint directory '" << header.directory << "' does not exist" << hint);
  try {
    const json files = files_without_shards(read_metadata(header.directory, iteration, hint));
    verify_files(header.directory, files, hint);
    header.common = read_common_state(header.directory, iteration, hint);
    for (const auto& item : files.items())
      if (item.key() != kCommonFile) header.files[item.key()] = join(header.directory, item.key());
  } catch (const json::exception& e) {
    MEGATRON_FAIL("checkpoint metadata '" << join(header.directory, kMetadataFile) << "' or " << kCommonFile
                                          << " is malformed (" << e.what() << ")" << hint);
  }
  return header;
}

}  // namespace megatron::checkpointing
