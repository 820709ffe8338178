#pragma once
// safetensors (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON header,
// then the tensors' bytes; see reference/interop-formats.md section 1.
//
// The writer reproduces the reference implementation's bytes: tensors sorted by dtype in the
// Rust enum's order, descending (widest types first, so every tensor stays aligned to its element
// size), then by name; compact JSON with "__metadata__" first and tensors in data order; header
// padded with spaces to a multiple of 8. The file is written atomically (atomic_file.h).
//
// The reader maps the file and enforces every rule of the Rust reader (section 1.4) and, as the
// spec asks of careful readers, rejects duplicate JSON keys. Errors name the file and the rule.
// Tensor bytes in files from other writers need not be aligned: they are only ever memcpy'd.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/checkpointing/atomic_file.h"
#include "megatron/core/tensor.h"

namespace megatron::checkpointing {

// The header's "__metadata__": string to string only, as the format requires.
using SafetensorsMetadata = std::map<std::string, std::string>;

// Largest header the reference reader and writer accept, in bytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// "F32", "BF16", "F8_E4M3", ...
const char* safetensors_dtype_name(DType dtype);
// Our dtype for a safetensors dtype string; nullopt for types we cannot hold (BOOL, I8, C64, ...).
std::optional<DType> dtype_from_safetensors_name(const std::string& name);

struct NamedTensor {
  std::string name;
  Tensor tensor;  // CPU
};

// Writes `tensors` to `path` (replacing it atomically) and returns the file's size and CRC-32C.
// Metadata is written only when non-empty, like the reference writer.
FileDigest write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const SafetensorsMetadata& metadata = {});

struct SafetensorsEntry {
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, end exclusive
  uint64_t end = 0;
};

// A validated, memory-mapped safetensors file. Cheap to copy (copies share the mapping).
class SafetensorsReader {
 public:
  static SafetensorsReader open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }  // in data order
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& info(const std::string& name) const;
  const SafetensorsMetadata& metadata() const { return metadata_; }
  Tensor load(const std::string& name) const;  // a CPU copy
  // The tensor's bytes inside the mapping, little-endian, possibly unaligned; valid while any
  // copy of this reader lives.
  const uint8_t* bytes(const std::string& name) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping_;
  std::string path_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

}  // namespace megatron::checkpointing
