#include "megatron/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "megatron/core/error.h"

namespace megatron::datasets {

// Arrays are read and written in host order; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "the .bin/.idx format is little-endian");

namespace {

constexpr std::array<unsigned char, 9> kMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 34;  // magic 9 + version 8 + dtype 1 + N 8 + D 8

const char* const kCreateHint =
    "create it with `megatron preprocess-data --input FILE.jsonl --output-prefix P` and pass the prefix "
    "P_text_document (no extension)";

bool is_integer_dtype(IndexDType dtype) { return dtype != IndexDType::f32 && dtype != IndexDType::f64; }

bool is_known_code(uint8_t code) { return code >= 1 && code <= 8; }

template <class T>
T load_le(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Smallest and largest token id a dtype can hold.
std::pair<int64_t, int64_t> index_dtype_range(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::u8:
      return {0, 255};
    case IndexDType::i8:
      return {-128, 127};
    case IndexDType::i16:
      return {-32768, 32767};
    case IndexDType::u16:
      return {0, 65535};
    default:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  }
}

template <class T>
void encode_as(const int32_t* ids, size_t n, unsigned char* out) {
  for (size_t k = 0; k < n; ++k) {
    const T value = T(ids[k]);
    std::memcpy(out + k * sizeof(T), &value, sizeof(T));
  }
}

void encode_ids(IndexDType dtype, const int32_t* ids, size_t n, unsigned char* out) {
  switch (dtype) {
    case IndexDType::u8:
      return encode_as<uint8_t>(ids, n, out);
    case IndexDType::i8:
      return encode_as<int8_t>(ids, n, out);
    case IndexDType::i16:
      return encode_as<int16_t>(ids, n, out);
    case IndexDType::u16:
      return encode_as<uint16_t>(ids, n, out);
    case IndexDType::i32:
      return encode_as<int32_t>(ids, n, out);
    case IndexDType::i64:
      return encode_as<int64_t>(ids, n, out);
    default:
      MEGATRON_FAIL("cannot encode token ids as " << index_dtype_name(dtype));
  }
}

template <class T>
void decode_as(const unsigned char* src, int64_t n, int32_t* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = int32_t(load_le<T>(src + k * int64_t(sizeof(T))));
}

void decode_i64(const unsigned char* src, int64_t n, int32_t* out, const std::string& path, int64_t sequence) {
  for (int64_t k = 0; k < n; ++k) {
    const int64_t value = load_le<int64_t>(src + k * 8);
    MEGATRON_CHECK(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(),
                   "token id " << value << " of sequence " << sequence << " in " << path
                               << " does not fit int32; token ids must be below 2^31");
    out[k] = int32_t(value);
  }
}

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  if (bytes == 0) return;
  MEGATRON_CHECK(std::fwrite(data, 1, bytes, file) == bytes, "writing " << bytes << " bytes to " << path
                                                                        << " failed: " << std::strerror(errno)
                                                                        << "; check free disk space and permissions");
}

void sync_and_close(std::FILE* file, const std::string& path) {
  const bool ok = std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  const int err = errno;
  std::fclose(file);
  MEGATRON_CHECK(ok, "flushing " << path << " failed: " << std::strerror(err) << "; check free disk space");
}

void rename_file(const std::string& from, const std::string& to) {
  MEGATRON_CHECK(std::rename(from.c_str(), to.c_str()) == 0,
                 "renaming " << from << " to " << to << " failed: " << std::strerror(errno));
}

std::string describe_magic(const unsigned char* p) {
  std::string text;
  static const char* hex = "0123456789abcdef";
  for (size_t k = 0; k < kMagic.size(); ++k) {
    text += k ? " " : "";
    text += hex[p[k] >> 4];
    text += hex[p[k] & 15];
  }
  return text;
}

// A read-only mapping of a whole file; empty files map to nothing.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    MEGATRON_CHECK(fd >= 0, "cannot open indexed dataset file "
                                << path << ": " << std::strerror(errno)
                                << (errno == ENOENT ? std::string("; ") + kCreateHint : std::string()));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      MEGATRON_FAIL("cannot stat " << path << ": " << std::strerror(err));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      const int err = errno;
      ::close(fd);
      MEGATRON_CHECK(mapped != MAP_FAILED,
                     "cannot memory-map " << path << " (" << size_ << " bytes): " << std::strerror(err));
      data_ = static_cast<const unsigned char*>(mapped);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

size_t index_dtype_size(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::u8:
    case IndexDType::i8:
      return 1;
    case IndexDType::i16:
    case IndexDType::u16:
      return 2;
    case IndexDType::i32:
    case IndexDType::f32:
      return 4;
    case IndexDType::i64:
    case IndexDType::f64:
      return 8;
  }
  MEGATRON_FAIL("unknown index dtype code " << int(dtype));
}

const char* index_dtype_name(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::u8:
      return "uint8";
    case IndexDType::i8:
      return "int8";
    case IndexDType::i16:
      return "int16";
    case IndexDType::i32:
      return "int32";
    case IndexDType::i64:
      return "int64";
    case IndexDType::f64:
      return "float64";
    case IndexDType::f32:
      return "float32";
    case IndexDType::u16:
      return "uint16";
  }
  return "unknown";
}

IndexDType optimal_index_dtype(int64_t vocab_size) { return vocab_size < 65500 ? IndexDType::u16 : IndexDType::i32; }

std::string idx_file_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_file_path(const std::string& prefix) { return prefix + ".bin"; }

// ---- builder --------------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, IndexDType token_dtype)
    : prefix_(std::move(prefix)), dtype_(token_dtype) {
  MEGATRON_CHECK(is_known_code(uint8_t(token_dtype)) && is_integer_dtype(token_dtype),
                 "token dtype " << index_dtype_name(token_dtype) << " (code " << int(token_dtype)
                                << ") cannot hold token ids; use uint16 or int32");
  const std::string tmp = bin_file_path(prefix_) + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  MEGATRON_CHECK(bin_ != nullptr, "cannot create " << tmp << ": " << std::strerror(errno)
                                                   << "; check that the output directory exists and is writable");
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (finalized_) return;
  if (bin_ != nullptr) std::fclose(bin_);
  std::remove((bin_file_path(prefix_) + ".tmp").c_str());
  std::remove((idx_file_path(prefix_) + ".tmp").c_str());
}

void IndexedDatasetBuilder::add_document(const std::vector<int32_t>& ids,
                                         const std::vector<int64_t>& sentence_lengths) {
  MEGATRON_CHECK(!finalized_, "add_document after finalize() on " << prefix_);
  const int64_t document = num_documents();
  int64_t total = 0;
  for (int64_t length : sentence_lengths) {
    MEGATRON_CHECK(length >= 0 && length <= std::numeric_limits<int32_t>::max(),
                   "sentence length " << length << " in document " << document << " must be in [0, 2^31)");
    total += length;
  }
  MEGATRON_CHECK(sentence_lengths.empty() || total == int64_t(ids.size()),
                 "sentence lengths of document " << document << " sum to " << total << " but the document has "
                                                 << ids.size() << " ids; they must cover the ids exactly");
  const auto [lo, hi] = index_dtype_range(dtype_);
  for (int32_t id : ids) {
    MEGATRON_CHECK(id >= lo && id <= hi, "token id " << id << " in document " << document << " does not fit "
                                                     << index_dtype_name(dtype_) << " [" << lo << ", " << hi
                                                     << "]; build with int32 (vocab sizes >= 65500 select it)");
  }
  if (sentence_lengths.empty()) {
    if (!ids.empty()) sequence_lengths_.push_back(int32_t(ids.size()));
  } else {
    for (int64_t length : sentence_lengths) sequence_lengths_.push_back(int32_t(length));
  }
  document_indices_.push_back(num_sequences());
  encoded_.resize(ids.size() * index_dtype_size(dtype_));
  encode_ids(dtype_, ids.data(), ids.size(), encoded_.data());
  write_all(bin_, encoded_.data(), encoded_.size(), bin_file_path(prefix_) + ".tmp");
}

void IndexedDatasetBuilder::finalize() {
  MEGATRON_CHECK(!finalized_, "finalize() called twice on " << prefix_);
  const std::string bin_tmp = bin_file_path(prefix_) + ".tmp";
  const std::string idx_tmp = idx_file_path(prefix_) + ".tmp";
  std::FILE* bin = std::exchange(bin_, nullptr);
  sync_and_close(bin, bin_tmp);

  std::FILE* idx = std::fopen(idx_tmp.c_str(), "wb");
  MEGATRON_CHECK(idx != nullptr, "cannot create " << idx_tmp << ": " << std::strerror(errno));
  try {
    const uint64_t n = uint64_t(num_sequences());
    const uint64_t d = uint64_t(document_indices_.size());
    const uint8_t code = uint8_t(dtype_);
    write_all(idx, kMagic.data(), kMagic.size(), idx_tmp);
    write_all(idx, &kVersion, 8, idx_tmp);
    write_all(idx, &code, 1, idx_tmp);
    write_all(idx, &n, 8, idx_tmp);
    write_all(idx, &d, 8, idx_tmp);
    write_all(idx, sequence_lengths_.data(), 4 * n, idx_tmp);
    // Pointers are byte offsets: the running sum of the preceding lengths times the item size.
    std::vector<int64_t> pointers;
    pointers.reserve(std::min<uint64_t>(n, 1 << 16));
    int64_t offset = 0;
    for (int32_t length : sequence_lengths_) {
      pointers.push_back(offset);
      offset += int64_t(length) * int64_t(index_dtype_size(dtype_));
      if (pointers.size() == pointers.capacity()) {
        write_all(idx, pointers.data(), 8 * pointers.size(), idx_tmp);
        pointers.clear();
      }
    }
    write_all(idx, pointers.data(), 8 * pointers.size(), idx_tmp);
    write_all(idx, document_indices_.data(), 8 * d, idx_tmp);
  } catch (...) {
    std::fclose(idx);
    throw;
  }
  sync_and_close(idx, idx_tmp);
  rename_file(bin_tmp, bin_file_path(prefix_));
  rename_file(idx_tmp, idx_file_path(prefix_));
  finalized_ = true;
}

// ---- reader ---------------------------------------------------------------------------------

struct IndexedDataset::Impl {
  std::string prefix;
  MappedFile idx;
  MappedFile bin;
  IndexDType dtype = IndexDType::u16;
  int64_t n = 0;  // sequences
  int64_t d = 0;  // document index entries (documents + 1)
  const unsigned char* lengths = nullptr;
  const unsigned char* pointers = nullptr;
  const unsigned char* doc_indices = nullptr;

  explicit Impl(const std::string& p) : prefix(p), idx(idx_file_path(p)), bin(bin_file_path(p)) {}

  int32_t length(int64_t i) const { return load_le<int32_t>(lengths + 4 * i); }
  int64_t pointer(int64_t i) const { return load_le<int64_t>(pointers + 8 * i); }
  int64_t doc_index(int64_t j) const { return load_le<int64_t>(doc_indices + 8 * j); }

  void parse_header();
  void check_document_indices() const;
  void check_sequences() const;
};

void IndexedDataset::Impl::parse_header() {
  const std::string& path = idx.path();
  const unsigned char* p = idx.data();
  MEGATRON_CHECK(idx.size() >= kHeaderBytes, path << " is truncated: a .idx header needs " << kHeaderBytes
                                                  << " bytes, the file has " << idx.size()
                                                  << "; rebuild it with `megatron preprocess-data`");
  MEGATRON_CHECK(std::memcmp(p, kMagic.data(), kMagic.size()) == 0,
                 path << " is not a Megatron .idx file: magic bytes are " << describe_magic(p)
                      << ", expected 4d 4d 49 44 49 44 58 00 00 (\"MMIDIDX\\0\\0\")");
  const uint64_t version = load_le<uint64_t>(p + 9);
  MEGATRON_CHECK(version == kVersion, path << " has .idx version " << version << "; only version 1 is supported");
  const uint8_t code = p[17];
  MEGATRON_CHECK(is_known_code(code),
                 path << " has unknown dtype code " << int(code) << "; Megatron's codes are 1..8 (uint8 .. uint16)");
  dtype = IndexDType(code);
  MEGATRON_CHECK(is_integer_dtype(dtype),
                 path << " holds " << index_dtype_name(dtype) << " values; token datasets must use an integer dtype");
  const uint64_t count = load_le<uint64_t>(p + 18);
  const uint64_t doc_count = load_le<uint64_t>(p + 26);
  // Expected size 34 + 12N + 8D, computed without overflow for corrupt counts.
  uint64_t expected = 0, sequence_bytes = 0, document_bytes = 0;
  const bool overflow = __builtin_mul_overflow(count, uint64_t(12), &sequence_bytes) ||
                        __builtin_mul_overflow(doc_count, uint64_t(8), &document_bytes) ||
                        __builtin_add_overflow(sequence_bytes, document_bytes, &expected) ||
                        __builtin_add_overflow(expected, uint64_t(kHeaderBytes), &expected) ||
                        expected > uint64_t(std::numeric_limits<int64_t>::max());
  MEGATRON_CHECK(!overflow, path << " is corrupt: its header claims " << count << " sequences and " << doc_count
                                 << " document indices, more than any file can hold");
  MEGATRON_CHECK(doc_count >= 1, path << " is corrupt: document count is 0 but the document indices always start "
                                         "with a 0 entry");
  MEGATRON_CHECK(idx.size() != expected + count || count == 0,
                 path << " has " << count << " trailing bytes of sequence modes: multimodal datasets are not "
                      << "supported; use a text dataset");
  MEGATRON_CHECK(idx.size() >= expected, path << " is truncated: the header (" << count << " sequences, " << doc_count
                                              << " document indices) needs " << expected << " bytes but the file has "
                                              << idx.size() << "; rebuild it with `megatron preprocess-data`");
  MEGATRON_CHECK(idx.size() == expected, path << " has " << idx.size() << " bytes but its header (" << count
                                              << " sequences, " << doc_count << " document indices) implies "
                                              << expected << "; the file is corrupt");
  n = int64_t(count);
  d = int64_t(doc_count);
  lengths = p + kHeaderBytes;
  pointers = lengths + 4 * n;
  doc_indices = pointers + 8 * n;
}

void IndexedDataset::Impl::check_document_indices() const {
  const std::string& path = idx.path();
  MEGATRON_CHECK(doc_index(0) == 0, path << " is corrupt: document_indices[0] is " << doc_index(0) << ", must be 0");
  for (int64_t j = 1; j < d; ++j) {
    MEGATRON_CHECK(doc_index(j) >= doc_index(j - 1), path << " is corrupt: document_indices[" << j
                                                          << "] = " << doc_index(j) << " is below document_indices["
                                                          << j - 1 << "] = " << doc_index(j - 1)
                                                          << "; they must be non-decreasing");
  }
  MEGATRON_CHECK(doc_index(d - 1) == n, path << " is corrupt: the last document index is " << doc_index(d - 1)
                                             << " but there are " << n << " sequences; they must be equal");
}

void IndexedDataset::Impl::check_sequences() const {
  const int64_t bin_size = int64_t(bin.size());
  const int64_t item = int64_t(index_dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = length(i), ptr = pointer(i);
    MEGATRON_CHECK(len >= 0, idx.path() << " is corrupt: sequence " << i << " has negative length " << len);
    MEGATRON_CHECK(ptr >= 0 && ptr <= bin_size && len * item <= bin_size - ptr,
                   "sequence " << i << " of " << idx.path() << " spans bytes [" << ptr << ", " << ptr + len * item
                               << ") but " << bin.path() << " has " << bin_size
                               << " bytes; the .bin is truncated or belongs to another .idx: rebuild both together");
  }
}

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  for (const char* ext : {".bin", ".idx"}) {
    const std::string e(ext);
    MEGATRON_CHECK(prefix.size() < e.size() || prefix.compare(prefix.size() - e.size(), e.size(), e) != 0,
                   "data prefix " << prefix << " ends in " << e << "; pass the prefix without the extension");
  }
  auto impl = std::make_shared<Impl>(prefix);
  impl->parse_header();
  impl->check_document_indices();
  impl->check_sequences();
  return IndexedDataset(std::move(impl));
}

const std::string& IndexedDataset::prefix() const { return impl_->prefix; }
IndexDType IndexedDataset::token_dtype() const { return impl_->dtype; }
int64_t IndexedDataset::num_sequences() const { return impl_->n; }
int64_t IndexedDataset::num_documents() const { return impl_->d - 1; }

int32_t IndexedDataset::sequence_length(int64_t i) const {
  MEGATRON_CHECK(i >= 0 && i < impl_->n,
                 "sequence " << i << " out of range [0, " << impl_->n << ") in " << impl_->prefix);
  return impl_->length(i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  MEGATRON_CHECK(i >= 0 && i < impl_->n,
                 "sequence " << i << " out of range [0, " << impl_->n << ") in " << impl_->prefix);
  return impl_->pointer(i);
}

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> out(size_t(impl_->n));
  if (impl_->n > 0) std::memcpy(out.data(), impl_->lengths, 4 * out.size());
  return out;
}

std::vector<int64_t> IndexedDataset::document_indices() const {
  std::vector<int64_t> out(size_t(impl_->d));
  std::memcpy(out.data(), impl_->doc_indices, 8 * out.size());
  return out;
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int32_t* out) const {
  const int64_t len = sequence_length(i);
  MEGATRON_CHECK(offset >= 0 && length >= 0 && offset <= len && length <= len - offset,
                 "tokens [" << offset << ", " << offset + length << ") are outside sequence " << i << " of length "
                            << len << " in " << impl_->prefix);
  const int64_t item = int64_t(index_dtype_size(impl_->dtype));
  const unsigned char* src = impl_->bin.data() + impl_->pointer(i) + offset * item;
  switch (impl_->dtype) {
    case IndexDType::u8:
      return decode_as<uint8_t>(src, length, out);
    case IndexDType::i8:
      return decode_as<int8_t>(src, length, out);
    case IndexDType::i16:
      return decode_as<int16_t>(src, length, out);
    case IndexDType::u16:
      return decode_as<uint16_t>(src, length, out);
    case IndexDType::i32:
      return decode_as<int32_t>(src, length, out);
    case IndexDType::i64:
      return decode_i64(src, length, out, impl_->bin.path(), i);
    default:
      MEGATRON_FAIL("dtype " << index_dtype_name(impl_->dtype) << " cannot hold token ids");
  }
}

std::vector<int32_t> IndexedDataset::get(int64_t i, int64_t offset, int64_t length) const {
  if (length < 0) length = sequence_length(i) - offset;
  std::vector<int32_t> out(size_t(std::max<int64_t>(length, 0)));
  read(i, offset, length, out.data());
  return out;
}

}  // namespace megatron::datasets
