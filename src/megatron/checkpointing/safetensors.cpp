#include "megatron/checkpointing/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "megatron/core/error.h"

// A file that breaks a rule of the format: name the file, the rule (the Rust reader's error
// name, so users can match it with other tools) and what was found.
#define SAFETENSORS_CHECK(cond, path, rule, msg)                                                    \
  MEGATRON_CHECK(cond, "safetensors file '" << (path) << "' is invalid (" << (rule) << "): " << msg \
                                            << "; the file is corrupt, truncated or not safetensors")

namespace megatron::checkpointing {

namespace {

using nlohmann::json;

// Tensor bytes are stored little-endian and copied as-is.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

struct SafetensorsDType {
  DType dtype;
  const char* name;
  int order;  // position in the Rust Dtype enum (BOOL = 0 ... U64 = 21): the writer's sort key
};
constexpr SafetensorsDType kDTypes[] = {
    {DType::u8, "U8", 4},    {DType::e5m2, "F8_E5M2", 6}, {DType::e4m3, "F8_E4M3", 7}, {DType::u16, "U16", 12},
    {DType::f16, "F16", 13}, {DType::bf16, "BF16", 14},   {DType::i32, "I32", 15},     {DType::f32, "F32", 17},
    {DType::f64, "F64", 19}, {DType::i64, "I64", 20},
};

const SafetensorsDType& lookup(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  MEGATRON_FAIL("dtype " << dtype_name(dtype) << " has no safetensors name");
}

std::string supported_names() {
  std::string s;
  for (const auto& d : kDTypes) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

// ---- writer ---------------------------------------------------------------------------------

void check_writable(const std::string& path, const std::vector<NamedTensor>& tensors) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    MEGATRON_CHECK(t.name != "__metadata__", "cannot write '" << path << "': '__metadata__' is reserved by "
                                                              << "safetensors; rename the tensor");
    MEGATRON_CHECK(seen.insert(t.name).second,
                   "cannot write '" << path << "': tensor name '" << t.name << "' appears twice; names must be unique");
    MEGATRON_CHECK(t.tensor.defined(), "cannot write '" << path << "': tensor '" << t.name << "' is undefined");
    MEGATRON_CHECK(t.tensor.device().is_cpu(), "cannot write '" << path << "': tensor '" << t.name << "' is on "
                                                                << t.tensor.device().str()
                                                                << "; copy it to the CPU first");
  }
}

// The reference writer's order: dtype (enum order) descending, then name (bytewise).
std::vector<const NamedTensor*> write_order(const std::vector<NamedTensor>& tensors) {
  std::vector<const NamedTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    const int ka = lookup(a->tensor.dtype()).order, kb = lookup(b->tensor.dtype()).order;
    return ka != kb ? ka > kb : a->name < b->name;
  });
  return order;
}

std::string header_text(const std::string& path, const std::vector<const NamedTensor*>& order,
                        const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    const uint64_t bytes = t->tensor.nbytes();
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = lookup(t->tensor.dtype()).name;
    info["shape"] = t->tensor.shape();
    info["data_offsets"] = {offset, offset + bytes};
    header[t->name] = std::move(info);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("cannot write '" << path << "': a tensor name or metadata string is not valid UTF-8 (" << e.what()
                                   << ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  MEGATRON_CHECK(text.size() <= kSafetensorsMaxHeaderBytes,
                 "cannot write '" << path << "': header of " << text.size()
                                  << " bytes exceeds the safetensors limit of " << kSafetensorsMaxHeaderBytes
                                  << "; split the tensors over several files");
  return text;
}

// ---- reader ---------------------------------------------------------------------------------

// Parses the header, rejecting duplicate keys at any depth (nlohmann would keep the last one).
json parse_header(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end) open_objects.pop_back();
    if (event == json::parse_event_t::key && !open_objects.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::parse_error& e) {
    SAFETENSORS_CHECK(false, path, "InvalidHeaderDeserialization", "header is not valid UTF-8 JSON: " << e.what());
  }
  SAFETENSORS_CHECK(duplicate.empty(), path, "InvalidHeaderDeserialization",
                    "key '" << duplicate << "' appears twice in the header");
  SAFETENSORS_CHECK(header.is_object(), path, "InvalidHeaderDeserialization",
                    "header is a JSON " << header.type_name() << ", expected an object");
  return header;
}

uint64_t read_u64(const std::string& path, const json& value, const std::string& what) {
  SAFETENSORS_CHECK(value.is_number_unsigned(), path, "InvalidHeaderDeserialization",
                    what << " is " << value.dump() << ", expected a non-negative integer");
  return value.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value) {
  const char* rule = "InvalidHeaderDeserialization";
  SAFETENSORS_CHECK(value.is_object(), path, rule, "entry of tensor '" << name << "' is not an object");
  for (const auto& item : value.items())
    SAFETENSORS_CHECK(item.key() == "dtype" || item.key() == "shape" || item.key() == "data_offsets", path, rule,
                      "tensor '" << name << "' has unknown key '" << item.key() << "'");
  SAFETENSORS_CHECK(value.contains("dtype") && value["dtype"].is_string(), path, rule,
                    "tensor '" << name << "' lacks a string 'dtype'");
  SAFETENSORS_CHECK(value.contains("shape") && value["shape"].is_array(), path, rule,
                    "tensor '" << name << "' lacks an array 'shape'");
  SAFETENSORS_CHECK(
      value.contains("data_offsets") && value["data_offsets"].is_array() && value["data_offsets"].size() == 2, path,
      rule, "tensor '" << name << "' lacks 'data_offsets' as [BEGIN, END]");
  SafetensorsEntry entry;
  const std::string dtype = value["dtype"].get<std::string>();
  const std::optional<DType> ours = dtype_from_safetensors_name(dtype);
  // A valid safetensors type we cannot hold (BOOL, I8, ...) is not corruption: say so.
  MEGATRON_CHECK(ours.has_value(), "safetensors file '" << path << "': tensor '" << name << "' has dtype '" << dtype
                                                        << "', which megatron-cpp does not support (supported: "
                                                        << supported_names() << "); convert the file's tensors");
  entry.dtype = *ours;
  for (const json& d : value["shape"]) {
    const uint64_t dim = read_u64(path, d, "a dimension of tensor '" + name + "'");
    SAFETENSORS_CHECK(dim <= uint64_t(std::numeric_limits<int64_t>::max()), path, "ValidationOverflow",
                      "tensor '" << name << "' has dimension " << dim);
    entry.shape.push_back(int64_t(dim));
  }
  entry.begin = read_u64(path, value["data_offsets"][0], "data_offsets[0] of tensor '" + name + "'");
  entry.end = read_u64(path, value["data_offsets"][1], "data_offsets[1] of tensor '" + name + "'");
  return entry;
}

SafetensorsMetadata parse_metadata(const std::string& path, const json& value) {
  SAFETENSORS_CHECK(value.is_object(), path, "InvalidHeaderDeserialization", "'__metadata__' is not an object");
  SafetensorsMetadata metadata;
  for (const auto& item : value.items()) {
    SAFETENSORS_CHECK(item.value().is_string(), path, "InvalidHeaderDeserialization",
                      "'__metadata__' value of key '" << item.key() << "' is " << item.value().dump()
                                                      << "; only strings are allowed");
    metadata[item.key()] = item.value().get<std::string>();
  }
  return metadata;
}

// Offsets sorted by position must tile [0, data size) exactly, each tensor's span matching its
// shape and dtype. Returns the data section size the header describes.
uint64_t check_layout(const std::string& path, std::vector<std::pair<std::string, const SafetensorsEntry*>>& order) {
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  uint64_t position = 0;
  for (const auto& [name, e] : order) {
    SAFETENSORS_CHECK(e->begin == position && e->end >= e->begin, path, "InvalidOffset(" + name + ")",
                      "tensor '" << name << "' has data_offsets [" << e->begin << ", " << e->end
                                 << "] but the previous tensor ends at " << position
                                 << "; tensors must be contiguous, without gaps or overlaps");
    uint64_t count = 1;
    for (int64_t d : e->shape)
      SAFETENSORS_CHECK(!__builtin_mul_overflow(count, uint64_t(d), &count), path, "ValidationOverflow",
                        "element count of tensor '" << name << "' with shape " << shape_str(e->shape) << " overflows");
    uint64_t bytes = 0;
    SAFETENSORS_CHECK(!__builtin_mul_overflow(count, uint64_t(dtype_size(e->dtype)), &bytes), path,
                      "ValidationOverflow", "byte size of tensor '" << name << "' overflows");
    SAFETENSORS_CHECK(e->end - e->begin == bytes, path, "TensorInvalidInfo",
                      "tensor '" << name << "' spans " << e->end - e->begin << " bytes but shape "
                                 << shape_str(e->shape) << " of " << safetensors_dtype_name(e->dtype) << " needs "
                                 << bytes);
    position = e->end;
  }
  return position;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) { return lookup(dtype).name; }

std::optional<DType> dtype_from_safetensors_name(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

FileDigest write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const SafetensorsMetadata& metadata) {
  check_writable(path, tensors);
  const std::vector<const NamedTensor*> order = write_order(tensors);
  const std::string header = header_text(path, order, metadata);
  const uint64_t length = header.size();
  AtomicFileWriter file(path);
  file.write(&length, sizeof(length));
  file.write(header.data(), header.size());
  for (const NamedTensor* t : order)
    if (t->tensor.nbytes() > 0) file.write(t->tensor.raw(), t->tensor.nbytes());
  return file.commit();
}

// The whole file, mapped read-only; unmapped when the last reader copy goes away.
struct SafetensorsReader::Mapping {
  void* address = nullptr;
  size_t size = 0;

  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MEGATRON_CHECK(fd >= 0, "cannot open safetensors file '" << path << "': " << std::strerror(errno));
    struct stat st {};
    int err = 0;
    if (::fstat(fd, &st) != 0) {
      err = errno;
    } else if (st.st_size > 0) {  // mmap refuses empty files; the size check below reports them
      void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        err = errno;
      } else {
        address = p;
        size = size_t(st.st_size);
      }
    }
    ::close(fd);
    MEGATRON_CHECK(err == 0, "cannot map safetensors file '" << path << "': " << std::strerror(err));
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (address != nullptr) ::munmap(address, size);
  }
};

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  auto mapping = std::make_shared<const Mapping>(path);
  const size_t file_size = mapping->size;
  const auto* bytes = static_cast<const uint8_t*>(mapping->address);
  SAFETENSORS_CHECK(file_size >= 8, path, "HeaderTooSmall",
                    "file is " << file_size << " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  SAFETENSORS_CHECK(n <= kSafetensorsMaxHeaderBytes, path, "HeaderTooLarge",
                    "header length " << n << " exceeds the limit of " << kSafetensorsMaxHeaderBytes << " bytes");
  SAFETENSORS_CHECK(8 + n <= file_size, path, "InvalidHeaderLength",
                    "header length " << n << " runs past the end of the " << file_size << "-byte file");
  const json header = parse_header(path, std::string_view(reinterpret_cast<const char*>(bytes) + 8, n));

  SafetensorsReader reader;
  reader.path_ = path;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__")
      reader.metadata_ = parse_metadata(path, item.value());
    else
      reader.entries_[item.key()] = parse_entry(path, item.key(), item.value());
  }
  std::vector<std::pair<std::string, const SafetensorsEntry*>> order;
  for (const auto& [name, entry] : reader.entries_) order.emplace_back(name, &entry);
  const uint64_t data_size = check_layout(path, order);
  SAFETENSORS_CHECK(8 + n + data_size == file_size, path, "MetadataIncompleteBuffer",
                    "header and tensors account for " << 8 + n + data_size << " bytes but the file has " << file_size
                                                      << " (truncated, or trailing bytes)");
  for (const auto& item : order) reader.names_.push_back(item.first);
  reader.data_ = bytes + 8 + n;
  reader.mapping_ = std::move(mapping);
  return reader;
}

const SafetensorsEntry& SafetensorsReader::info(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it != entries_.end()) return it->second;
  std::ostringstream available;
  for (size_t i = 0; i < names_.size() && i < 5; ++i) available << (i ? ", " : "") << "'" << names_[i] << "'";
  if (names_.size() > 5) available << ", ...";
  MEGATRON_FAIL("tensor '" << name << "' not found in safetensors file '" << path_ << "', which holds " << names_.size()
                           << " tensors (" << available.str() << ")");
}

const uint8_t* SafetensorsReader::bytes(const std::string& name) const { return data_ + info(name).begin; }

Tensor SafetensorsReader::load(const std::string& name) const {
  const SafetensorsEntry& e = info(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.raw(), data_ + e.begin, e.end - e.begin);
  return t;
}

}  // namespace megatron::checkpointing
