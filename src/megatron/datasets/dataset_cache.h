#pragma once
// Megatron's on-disk index cache (megatron-compat.md section 2.5), in Megatron's own format so
// either program can reuse the other's files:
//
//   <dir>/<md5>-<Class>-<split>-description.txt   the dataset's identifiers, written as Python's
//                                                  json.dumps(identifiers, indent=4)
//   <dir>/<md5>-<Class>-<split>-<name>.npy         one NumPy v1.0 .npy file per index array
//
// where <md5> is the MD5 of the description text, <Class> is GPTDataset, MockGPTDataset or
// BlendedDataset and <split> is train, valid or test. A hit needs every file present, the
// description byte-identical and each .npy well-formed; anything else is rebuilt (a damaged or
// partial cache with a warning) and rewritten. Files are written under temporary names and
// renamed into place, description last, so concurrent writers and crashes never leave a file
// that parses but is incomplete.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megatron/datasets/gpt_dataset_indices.h"

namespace megatron::datasets {

std::string md5_hex(std::string_view bytes);  // 32 lowercase hex digits (RFC 1321)

// Python's repr() of a float: the shortest digits that round-trip, positional when the decimal
// exponent lies in [-4, 16), else scientific ("1e-05", "1e+16"); integral values end in ".0".
std::string python_float_repr(double value);
// Python's json.dumps(value, indent=4) with its defaults (ensure_ascii, ", " and ": "
// separators, keys in insertion order). Invalid UTF-8 bytes in strings are written as the lone
// surrogates \udc80-\udcff, as Python holds undecodable command-line bytes.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// NumPy's .npy format. write_npy produces the bytes numpy.save does (version 1.0, header padded
// to 64 bytes) under a temporary name and renames it into place. read_npy maps the file and
// throws an Error naming the path and the fault for anything that is not a C-order
// little-endian int16/int32/uint32/int64 array of one or two dimensions whose data fills the
// file exactly.
void write_npy(const std::string& path, const IndexArray& array);
IndexArray read_npy(const std::string& path);

// Megatron's default cache directory for a dataset read from `prefix`: the directory
// <prefix>/cache/<class_name>_indices, named after the prefix (next to prefix.bin, not in it).
std::string default_cache_directory(const std::string& prefix, const std::string& class_name);

// The cache files of one dataset.
class IndexCache {
 public:
  IndexCache(std::string directory, const std::string& class_name, const std::string& split, std::string description);

  const std::string& description() const { return description_; }
  std::string path(const std::string& name) const;  // <dir>/<md5>-<Class>-<split>-<name>

  // The arrays `<name>.npy` for each name, or nullopt on a miss. A miss where some of the files
  // exist, the description differs or a file is malformed is logged as a warning naming the
  // file, since the cache will be rebuilt over it.
  std::optional<std::vector<IndexArray>> load(const std::vector<std::string>& names) const;
  // Writes `<name>.npy` for each array, then description.txt. A directory that cannot be
  // created or written costs only the cache: the failure is logged as a warning.
  void save(const std::vector<std::pair<std::string, const IndexArray*>>& arrays) const;
  // Logs that the loaded arrays failed the dataset's own checks (`why`); the caller rebuilds.
  void report_invalid(const std::string& why) const;

 private:
  std::string directory_;
  std::string base_;  // <md5>-<Class>-<split>
  std::string description_;
};

}  // namespace megatron::datasets
