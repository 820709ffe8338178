#include "megatron/datasets/dataset_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"

namespace megatron::datasets {

namespace fs = std::filesystem;

// ---- MD5 (RFC 1321) -------------------------------------------------------------------------

namespace {

// floor(|sin(i + 1)| * 2^32), as RFC 1321 defines the table.
constexpr std::array<uint32_t, 64> kMd5Sines = {
    0xd76aa478u, 0xe8c7b756u, 0x242070dbu, 0xc1bdceeeu, 0xf57c0fafu, 0x4787c62au, 0xa8304613u, 0xfd469501u,
    0x698098d8u, 0x8b44f7afu, 0xffff5bb1u, 0x895cd7beu, 0x6b901122u, 0xfd987193u, 0xa679438eu, 0x49b40821u,
    0xf61e2562u, 0xc040b340u, 0x265e5a51u, 0xe9b6c7aau, 0xd62f105du, 0x02441453u, 0xd8a1e681u, 0xe7d3fbc8u,
    0x21e1cde6u, 0xc33707d6u, 0xf4d50d87u, 0x455a14edu, 0xa9e3e905u, 0xfcefa3f8u, 0x676f02d9u, 0x8d2a4c8au,
    0xfffa3942u, 0x8771f681u, 0x6d9d6122u, 0xfde5380cu, 0xa4beea44u, 0x4bdecfa9u, 0xf6bb4b60u, 0xbebfbc70u,
    0x289b7ec6u, 0xeaa127fau, 0xd4ef3085u, 0x04881d05u, 0xd9d4d039u, 0xe6db99e5u, 0x1fa27cf8u, 0xc4ac5665u,
    0xf4292244u, 0x432aff97u, 0xab9423a7u, 0xfc93a039u, 0x655b59c3u, 0x8f0ccc92u, 0xffeff47du, 0x85845dd1u,
    0x6fa87e4fu, 0xfe2ce6e0u, 0xa3014314u, 0x4e0811a1u, 0xf7537e82u, 0xbd3af235u, 0x2ad7d2bbu, 0xeb86d391u,
};
constexpr std::array<int, 16> kMd5Shifts = {7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21};

uint32_t rotl(uint32_t x, int s) { return (x << s) | (x >> (32 - s)); }

void md5_block(std::array<uint32_t, 4>& digest, const unsigned char* block) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) {
    m[i] = uint32_t(block[4 * i]) | uint32_t(block[4 * i + 1]) << 8 | uint32_t(block[4 * i + 2]) << 16 |
           uint32_t(block[4 * i + 3]) << 24;
  }
  uint32_t a = digest[0], b = digest[1], c = digest[2], d = digest[3];
  for (int i = 0; i < 64; ++i) {
    uint32_t f = 0;
    int g = 0;
    if (i < 16) {
      f = (b & c) | (~b & d);
      g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c);
      g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) % 16;
    }
    f += a + kMd5Sines[size_t(i)] + m[g];
    a = d;
    d = c;
    c = b;
    b += rotl(f, kMd5Shifts[size_t(4 * (i / 16) + i % 4)]);
  }
  digest[0] += a;
  digest[1] += b;
  digest[2] += c;
  digest[3] += d;
}

}  // namespace

std::string md5_hex(std::string_view bytes) {
  std::array<uint32_t, 4> digest = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
  size_t whole = bytes.size() / 64 * 64;
  for (size_t pos = 0; pos < whole; pos += 64)
    md5_block(digest, reinterpret_cast<const unsigned char*>(bytes.data()) + pos);
  // The tail, a 0x80 byte, zeros up to 56 mod 64, then the bit length (little-endian u64).
  std::vector<unsigned char> tail(bytes.begin() + std::ptrdiff_t(whole), bytes.end());
  tail.push_back(0x80);
  while (tail.size() % 64 != 56) tail.push_back(0);
  const uint64_t bits = uint64_t(bytes.size()) * 8;
  for (int i = 0; i < 8; ++i) tail.push_back((unsigned char)(bits >> (8 * i)));
  for (size_t pos = 0; pos < tail.size(); pos += 64) md5_block(digest, tail.data() + pos);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t word : digest) {
    for (int i = 0; i < 4; ++i) {
      const auto byte = (unsigned char)(word >> (8 * i));
      out += hex[byte >> 4];
      out += hex[byte & 15];
    }
  }
  return out;
}

// ---- Python's float repr and json.dumps -----------------------------------------------------

std::string python_float_repr(double value) {
  MEGATRON_CHECK(std::isfinite(value), "python_float_repr: " << value << " is not finite");
  char buffer[64];
  // Shortest round-trip digits in the form "d.ddde±XX".
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string text(buffer, result.ptr);
  const size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  const int exponent = std::stoi(text.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int point = exponent + 1;  // digits d1 d2 ... = 0.d1d2... * 10^point
  const int n = int(digits.size());
  if (point <= -4 || point > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int shown = point - 1;
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%c%02d", shown < 0 ? '-' : '+', std::abs(shown));
    return out + exp_text;
  }
  if (point <= 0) return sign + "0." + std::string(size_t(-point), '0') + digits;
  if (point >= n) return sign + digits + std::string(size_t(point - n), '0') + ".0";
  return sign + digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
}

namespace {

void append_u_escape(std::string& out, uint32_t unit) {
  char text[8];
  std::snprintf(text, sizeof text, "\\u%04x", unsigned(unit));
  out += text;
}

// The length of the valid UTF-8 sequence at s[i] and its code point, or 0 when invalid
// (truncated, overlong, a surrogate or above U+10FFFF), the checks Python's decoder makes.
int decode_utf8(const std::string& s, size_t i, uint32_t& code) {
  const auto b0 = (unsigned char)s[i];
  int length = 0;
  uint32_t min = 0;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    length = 2, code = b0 & 0x1fu, min = 0x80;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    length = 3, code = b0 & 0x0fu, min = 0x800;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    length = 4, code = b0 & 0x07u, min = 0x10000;
  } else {
    return 0;
  }
  if (i + size_t(length) > s.size()) return 0;
  for (int k = 1; k < length; ++k) {
    const auto b = (unsigned char)s[i + size_t(k)];
    if ((b & 0xc0) != 0x80) return 0;
    code = (code << 6) | (b & 0x3fu);
  }
  if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = (unsigned char)s[i];
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            append_u_escape(out, c);  // Python passes only ' '..'~' through
          } else {
            out += char(c);
          }
      }
      ++i;
      continue;
    }
    uint32_t code = 0;
    const int length = decode_utf8(s, i, code);
    if (length == 0) {
      append_u_escape(out, 0xdc00u + c);  // surrogateescape: an undecodable byte
      ++i;
      continue;
    }
    if (code >= 0x10000) {  // a surrogate pair
      code -= 0x10000;
      append_u_escape(out, 0xd800u + (code >> 10));
      append_u_escape(out, 0xdc00u + (code & 0x3ffu));
    } else {
      append_u_escape(out, code);
    }
    i += size_t(length);
  }
  out += '"';
}

void dump(std::string& out, const nlohmann::ordered_json& value, int level) {
  const std::string inner(size_t(4 * (level + 1)), ' ');
  const std::string outer(size_t(4 * level), ' ');
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::null:
      out += "null";
      return;
    case nlohmann::ordered_json::value_t::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case nlohmann::ordered_json::value_t::number_integer:
      out += std::to_string(value.get<int64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out += std::to_string(value.get<uint64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_float:
      out += python_float_repr(value.get<double>());
      return;
    case nlohmann::ordered_json::value_t::string:
      append_json_string(out, value.get_ref<const std::string&>());
      return;
    case nlohmann::ordered_json::value_t::array: {
      if (value.empty()) {
        out += "[]";
        return;
      }
      out += "[\n";
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ",\n";
        first = false;
        out += inner;
        dump(out, item, level + 1);
      }
      out += "\n" + outer + "]";
      return;
    }
    case nlohmann::ordered_json::value_t::object: {
      if (value.empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ",\n";
        first = false;
        out += inner;
        append_json_string(out, key);
        out += ": ";
        dump(out, item, level + 1);
      }
      out += "\n" + outer + "}";
      return;
    }
    default:
      MEGATRON_FAIL("python_json_dumps: a binary or discarded JSON value has no Python form");
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(out, value, 0);
  return out;
}

// ---- .npy files -----------------------------------------------------------------------------

namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicLength = 6;

const char* npy_descr(IndexType type) {
  switch (type) {
    case IndexType::i16:
      return "<i2";
    case IndexType::i32:
      return "<i4";
    case IndexType::u32:
      return "<u4";
    case IndexType::i64:
      return "<i8";
  }
  return "";
}

// Writes bytes to a temporary file beside `path` and renames it over `path`.
void write_file_atomically(const std::string& path, const std::string& head, const void* body, size_t body_bytes) {
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  MEGATRON_CHECK(file != nullptr, "cannot create " << temporary << ": " << std::strerror(errno));
  bool ok = std::fwrite(head.data(), 1, head.size(), file) == head.size();
  if (ok && body_bytes > 0) ok = std::fwrite(body, 1, body_bytes, file) == body_bytes;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    MEGATRON_FAIL("cannot write " << path << ": " << reason);
  }
}

// The value text after 'key': in a .npy header dict, up to the next top-level comma.
std::string header_field(const std::string& header, const std::string& key, const std::string& path) {
  const std::string quoted = "'" + key + "':";
  const size_t at = header.find(quoted);
  MEGATRON_CHECK(at != std::string::npos,
                 path << ": the .npy header has no '" << key << "' entry; the file is damaged");
  size_t pos = at + quoted.size();
  while (pos < header.size() && header[pos] == ' ') ++pos;
  int depth = 0;
  size_t end = pos;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' || c == '}') && depth == 0) break;
  }
  return header.substr(pos, end - pos);
}

}  // namespace

void write_npy(const std::string& path, const IndexArray& array) {
  std::ostringstream dict;
  const std::string first_dim = std::to_string(array.rows());
  dict << "{'descr': '" << npy_descr(array.type()) << "', 'fortran_order': False, 'shape': (" << first_dim
       << (array.columns() == 1 ? "," : ", " + std::to_string(array.columns())) << "), }";
  std::string header = dict.str();
  header += std::string(21 - first_dim.size(), ' ');  // numpy's room to grow the first dimension
  // Magic, two version bytes, a u16 length, then the header padded with spaces and ended by a
  // newline so the data starts on a 64-byte boundary.
  const size_t unpadded = kNpyMagicLength + 2 + 2 + header.size() + 1;
  header += std::string(64 - unpadded % 64, ' ');
  header += '\n';
  std::string head(kNpyMagic, kNpyMagicLength);
  head += '\x01';
  head += '\x00';
  head += char(header.size() & 0xff);
  head += char(header.size() >> 8);
  head += header;
  write_file_atomically(path, head, array.data(), array.nbytes());
}

IndexArray read_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MEGATRON_CHECK(fd >= 0, "cannot open " << path << ": " << std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const auto file_bytes = size_t(st.st_size);
  void* base = stat_ok && file_bytes > 0 ? ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  MEGATRON_CHECK(base != MAP_FAILED,
                 "cannot map " << path << " (" << file_bytes << " bytes): " << std::strerror(errno));
  std::shared_ptr<const void> mapping(base,
                                      [file_bytes](const void* p) { ::munmap(const_cast<void*>(p), file_bytes); });
  const auto* bytes = static_cast<const unsigned char*>(base);

  MEGATRON_CHECK(file_bytes >= 10 && std::memcmp(bytes, kNpyMagic, kNpyMagicLength) == 0,
                 path << " is not a .npy file (bad magic); delete it and the cache will be rebuilt");
  const int major = bytes[6];
  size_t header_length = 0, prefix = 0;
  if (major == 1) {
    header_length = size_t(bytes[8]) | size_t(bytes[9]) << 8;
    prefix = 10;
  } else {
    MEGATRON_CHECK((major == 2 || major == 3) && file_bytes >= 12,
                   path << ": .npy format version " << major << " is not 1, 2 or 3");
    header_length = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
    prefix = 12;
  }
  MEGATRON_CHECK(prefix + header_length <= file_bytes, path << ": the .npy header overruns the file; it is truncated");
  const std::string header(reinterpret_cast<const char*>(bytes + prefix), header_length);

  const std::string descr = header_field(header, "descr", path);
  IndexType type = IndexType::i64;
  if (descr == "'<i2'") {
    type = IndexType::i16;
  } else if (descr == "'<i4'") {
    type = IndexType::i32;
  } else if (descr == "'<u4'") {
    type = IndexType::u32;
  } else if (descr == "'<i8'") {
    type = IndexType::i64;
  } else {
    MEGATRON_FAIL(path << ": dtype " << descr << " is not an index dtype (<i2, <i4, <u4, <i8)");
  }
  MEGATRON_CHECK(header_field(header, "fortran_order", path) == "False", path << ": a Fortran-order array");
  const std::string shape = header_field(header, "shape", path);
  std::vector<int64_t> dims;
  for (size_t pos = 0; pos < shape.size();) {
    if (shape[pos] < '0' || shape[pos] > '9') {
      ++pos;
      continue;
    }
    int64_t dim = 0;
    const auto parsed = std::from_chars(shape.data() + pos, shape.data() + shape.size(), dim);
    dims.push_back(dim);
    pos = size_t(parsed.ptr - shape.data());
  }
  MEGATRON_CHECK(dims.size() == 1 || dims.size() == 2,
                 path << ": shape " << shape << " is not one- or two-dimensional, as index arrays are");
  const int64_t rows = dims[0], columns = dims.size() == 2 ? dims[1] : 1;
  MEGATRON_CHECK(columns >= 1, path << ": shape " << shape << " has no columns");
  const size_t data_bytes = size_t(rows * columns) * index_type_size(type);
  MEGATRON_CHECK(prefix + header_length + data_bytes == file_bytes,
                 path << " holds " << file_bytes - prefix - header_length << " data bytes but shape " << shape << " of "
                      << index_type_name(type) << " needs " << data_bytes << "; the file is damaged");
  return IndexArray(std::move(mapping), bytes + prefix + header_length, type, rows, columns);
}

// ---- the cache ------------------------------------------------------------------------------

std::string default_cache_directory(const std::string& prefix, const std::string& class_name) {
  return (fs::path(prefix) / "cache" / (class_name + "_indices")).string();
}

IndexCache::IndexCache(std::string directory, const std::string& class_name, const std::string& split,
                       std::string description)
    : directory_(std::move(directory)),
      base_(md5_hex(description) + "-" + class_name + "-" + split),
      description_(std::move(description)) {}

std::string IndexCache::path(const std::string& name) const {
  return (fs::path(directory_) / (base_ + "-" + name)).string();
}

std::optional<std::vector<IndexArray>> IndexCache::load(const std::vector<std::string>& names) const {
  std::vector<std::string> files = {path("description.txt")};
  for (const std::string& name : names) files.push_back(path(name + ".npy"));
  size_t present = 0;
  for (const std::string& file : files) present += fs::is_regular_file(file) ? 1 : 0;
  if (present == 0) return std::nullopt;
  if (present < files.size()) {
    LOG_WARN("the index cache " << path("*") << " is incomplete (" << present << " of " << files.size()
                                << " files); rebuilding it");
    return std::nullopt;
  }
  std::ifstream in(files[0], std::ios::binary);
  const std::string stored((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (stored != description_) {
    LOG_WARN(files[0] << " does not hold this dataset's description; rebuilding the index cache");
    return std::nullopt;
  }
  std::vector<IndexArray> arrays;
  for (size_t i = 1; i < files.size(); ++i) {
    try {
      arrays.push_back(read_npy(files[i]));
    } catch (const Error& e) {
      LOG_WARN("damaged index cache file (" << e.what() << "); rebuilding the index cache");
      return std::nullopt;
    }
  }
  return arrays;
}

void IndexCache::save(const std::vector<std::pair<std::string, const IndexArray*>>& arrays) const {
  try {
    fs::create_directories(directory_);
    for (const auto& [name, array] : arrays) write_npy(path(name + ".npy"), *array);
    write_file_atomically(path("description.txt"), description_, nullptr, 0);
  } catch (const std::exception& e) {
    LOG_WARN("cannot write the index cache in " << directory_ << " (" << e.what()
                                                << "); continuing without it. Give a writable "
                                                << "--data-cache-path to keep the indices between runs");
  }
}

void IndexCache::report_invalid(const std::string& why) const {
  LOG_WARN("the index cache " << path("*") << " is damaged (" << why << "); rebuilding it");
}

}  // namespace megatron::datasets
