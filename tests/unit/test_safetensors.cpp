#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/checkpointing/safetensors.h"

using namespace megatron;
using namespace megatron::checkpointing;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  // A file made of an 8-byte little-endian length, the header text and `data`.
  std::string write_file(const std::string& name, const std::string& header, const std::string& data) const {
    std::string bytes(8, '\0');
    uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    return write_raw(name, bytes + header + data);
  }

  // Opening must fail with an Error naming the file and containing `rule`.
  void expect_rejected(const std::string& file, const std::string& rule) const {
    try {
      SafetensorsReader::open(file);
      ADD_FAILURE() << "'" << file << "' was accepted, expected " << rule;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(rule), std::string::npos) << "expected '" << rule << "' in: " << message;
    }
  }

  std::string dir_;
};

std::string read_all(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A tensor whose bytes are a pattern unique to `seed`, whatever the dtype: compared bytewise.
Tensor pattern_tensor(const Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = uint8_t(seed * 31 + i * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The repository's doctest file (interop-formats.md 7.5): one I32 [2,2] tensor, 60-byte header.
const std::string kDoctestHeader = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";

}  // namespace

TEST_F(Safetensors, RoundTripsEveryDType) {
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,  DType::i32,
                          DType::i64, DType::u16, DType::u8,   DType::e4m3, DType::e5m2};
  std::vector<NamedTensor> tensors;
  int seed = 0;
  for (DType d : dtypes) tensors.push_back({std::string("t_") + dtype_name(d), pattern_tensor({3, 5}, d, ++seed)});
  tensors.push_back({"scalar", pattern_tensor({}, DType::f32, ++seed)});
  tensors.push_back({"empty", pattern_tensor({0, 4}, DType::bf16, ++seed)});
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "héllo"}};
  const FileDigest digest = write_safetensors(path("all.safetensors"), tensors, metadata);

  EXPECT_EQ(digest.bytes, std::filesystem::file_size(path("all.safetensors")));
  const SafetensorsReader reader = SafetensorsReader::open(path("all.safetensors"));
  EXPECT_EQ(reader.metadata(), metadata);
  EXPECT_EQ(reader.names().size(), tensors.size());
  for (const NamedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(reader.info(t.name).dtype, t.tensor.dtype());
    EXPECT_EQ(reader.info(t.name).shape, t.tensor.shape());
    EXPECT_TRUE(same_bytes(reader.load(t.name), t.tensor));
  }
}

TEST_F(Safetensors, DTypeNamesMatchTheFormat) {
  EXPECT_STREQ(safetensors_dtype_name(DType::f32), "F32");
  EXPECT_STREQ(safetensors_dtype_name(DType::bf16), "BF16");
  EXPECT_STREQ(safetensors_dtype_name(DType::e4m3), "F8_E4M3");
  EXPECT_STREQ(safetensors_dtype_name(DType::e5m2), "F8_E5M2");
  EXPECT_STREQ(safetensors_dtype_name(DType::u16), "U16");
  EXPECT_EQ(dtype_from_safetensors_name("I64"), DType::i64);
  EXPECT_EQ(dtype_from_safetensors_name("BOOL"), std::nullopt);
  EXPECT_EQ(dtype_from_safetensors_name("f32"), std::nullopt);  // names are case-sensitive
}

TEST_F(Safetensors, WriterMatchesTheReferenceBytes) {
  // interop-formats.md 7.5: 142-byte header padded with 2 spaces to N = 144, data at 152, 164 bytes.
  const Tensor a = Tensor::from_vector({1.0f, -2.0f}, {2});
  const Tensor b = Tensor::from_vector({1.0f, 0.5f}, {1, 2}, DType::bf16);
  write_safetensors(path("ref.safetensors"), {{"b", b}, {"a", a}}, {{"format", "pt"}});
  const std::string bytes = read_all(path("ref.safetensors"));
  ASSERT_EQ(bytes.size(), 164u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x90\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(8, 144),
            R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}  )");
  EXPECT_EQ(std::memcmp(bytes.data() + 152, a.raw(), 8), 0);
  EXPECT_EQ(bytes.substr(160), std::string("\x80\x3f\x00\x3f", 4));  // bf16 1.0 and 0.5, little-endian
}

TEST_F(Safetensors, WriterOrdersByDTypeDescendingThenName) {
  std::vector<NamedTensor> tensors = {
      {"u8", pattern_tensor({3}, DType::u8, 1)},     {"e5m2", pattern_tensor({3}, DType::e5m2, 2)},
      {"e4m3", pattern_tensor({1}, DType::e4m3, 3)}, {"u16", pattern_tensor({3}, DType::u16, 4)},
      {"f16", pattern_tensor({1}, DType::f16, 5)},   {"bf16", pattern_tensor({3}, DType::bf16, 6)},
      {"i32", pattern_tensor({1}, DType::i32, 7)},   {"f32_b", pattern_tensor({3}, DType::f32, 8)},
      {"f32_a", pattern_tensor({1}, DType::f32, 9)}, {"f64", pattern_tensor({1}, DType::f64, 10)},
      {"i64", pattern_tensor({1}, DType::i64, 11)}};
  write_safetensors(path("order.safetensors"), tensors);
  const std::string bytes = read_all(path("order.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  std::vector<std::string> order;
  for (const auto& item : header.items()) order.push_back(item.key());
  // The Rust Dtype enum order, descending: I64 > F64 > F32 > I32 > BF16 > F16 > U16 > F8_E4M3 > F8_E5M2 > U8.
  EXPECT_EQ(order, (std::vector<std::string>{"i64", "f64", "f32_a", "f32_b", "i32", "bf16", "f16", "u16", "e4m3",
                                             "e5m2", "u8"}));
  uint64_t position = 0;
  for (const auto& item : header.items()) {
    const uint64_t begin = item.value()["data_offsets"][0], end = item.value()["data_offsets"][1];
    EXPECT_EQ(begin, position) << item.key();
    const size_t element = dtype_size(*dtype_from_safetensors_name(item.value()["dtype"]));
    EXPECT_EQ((8 + n + begin) % element, 0u) << item.key() << " is not aligned to its element size";
    position = end;
  }
}

TEST_F(Safetensors, WriterRefusesDuplicateAndReservedNames) {
  const Tensor t = pattern_tensor({2}, DType::f32, 1);
  EXPECT_THROW(write_safetensors(path("dup.safetensors"), {{"x", t}, {"x", t}}), Error);
  EXPECT_THROW(write_safetensors(path("meta.safetensors"), {{"__metadata__", t}}), Error);
  EXPECT_FALSE(std::filesystem::exists(path("dup.safetensors")));
}

TEST_F(Safetensors, ReadsForeignFilesWithUnalignedData) {
  // The doctest file's data starts at byte 68, not 8-aligned: loads must not assume alignment.
  const int32_t values[4] = {1, -2, 300000, 4};
  const std::string file = write_file("doctest.safetensors", kDoctestHeader,
                                      std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  const SafetensorsReader reader = SafetensorsReader::open(file);
  EXPECT_TRUE(reader.metadata().empty());
  const Tensor t = reader.load("test");
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, -2, 300000, 4}));
}

TEST_F(Safetensors, AcceptsWhitespaceAroundTheHeader) {
  const SafetensorsReader reader = SafetensorsReader::open(write_file("ws.safetensors", "\t\n{}\r ", ""));
  EXPECT_TRUE(reader.names().empty());
}

TEST_F(Safetensors, MissingTensorNamesTheAvailableOnes) {
  write_safetensors(path("two.safetensors"), {{"alpha", pattern_tensor({1}, DType::f32, 1)}});
  const SafetensorsReader reader = SafetensorsReader::open(path("two.safetensors"));
  try {
    reader.load("beta");
    ADD_FAILURE() << "loading a missing tensor succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'beta'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'alpha'"), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, RejectsBadLengthPrefix) {
  expect_rejected(write_raw("small", std::string("\x01\0\0\0\0", 5)), "HeaderTooSmall");
  expect_rejected(write_raw("large", std::string("\x3c\0\0\0\0\xff\xff\xff", 8) + kDoctestHeader), "HeaderTooLarge");
  expect_rejected(write_raw("past_end", std::string("\x3c\0\0\0\0\0\0\0", 8)), "InvalidHeaderLength");
}

TEST_F(Safetensors, RejectsBadJson) {
  const std::string rule = "InvalidHeaderDeserialization";
  expect_rejected(write_file("brace", "{", ""), rule);
  expect_rejected(write_file("array", "[]", ""), rule);
  expect_rejected(write_file("utf8", "{\"\xff\":{}}", ""), rule);
  expect_rejected(write_file("dup_tensor",
                             R"({"test":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                             R"("test":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                             std::string(4, '\0')),
                  "'test' appears twice");
  expect_rejected(write_file("dup_field", R"({"t":{"dtype":"I32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                             std::string(4, '\0')),
                  "'dtype' appears twice");
  expect_rejected(write_file("no_offsets", R"({"t":{"dtype":"I32","shape":[1]}})", std::string(4, '\0')),
                  "data_offsets");
  expect_rejected(
      write_file("extra_key", R"({"t":{"dtype":"I32","shape":[1],"data_offsets":[0,4],"x":1}})", std::string(4, '\0')),
      "unknown key 'x'");
  expect_rejected(
      write_file("neg_dim", R"({"t":{"dtype":"I32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "non-negative integer");
  expect_rejected(
      write_file("float_dim", R"({"t":{"dtype":"I32","shape":[1.0],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "non-negative integer");
  expect_rejected(write_file("meta_num", R"({"__metadata__":{"format":1}})", ""), "only strings");
}

TEST_F(Safetensors, RejectsUnknownOrUnsupportedDType) {
  expect_rejected(write_file("q4", R"({"t":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
                  "dtype 'Q4'");
  expect_rejected(
      write_file("bool", R"({"t":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
      "dtype 'BOOL'");
}

TEST_F(Safetensors, RejectsGapsOverlapsAndBadSizes) {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  expect_rejected(
      write_file("gap", "{\"a\":{" + f32x2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32x2 + ",\"data_offsets\":[12,20]}}",
                 std::string(20, '\0')),
      "InvalidOffset(b)");
  expect_rejected(
      write_file("overlap",
                 "{\"a\":{" + f32x2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32x2 + ",\"data_offsets\":[4,12]}}",
                 std::string(12, '\0')),
      "InvalidOffset(b)");
  expect_rejected(write_file("late_start", "{\"a\":{" + f32x2 + ",\"data_offsets\":[4,12]}}", std::string(12, '\0')),
                  "InvalidOffset(a)");
  expect_rejected(
      write_file("reversed",
                 "{\"a\":{" + f32x2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32x2 + ",\"data_offsets\":[8,0]}}",
                 std::string(8, '\0')),
      "InvalidOffset(b)");
  // interop-formats.md 7.5: offsets [0,4] for I32 [2,2] is TensorInvalidInfo.
  expect_rejected(
      write_file("short", R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "TensorInvalidInfo");
  expect_rejected(
      write_file("overflow", R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                 std::string(8, '\0')),
      "ValidationOverflow");
}

TEST_F(Safetensors, RejectsTruncatedFilesAndTrailingBytes) {
  expect_rejected(write_file("truncated", kDoctestHeader, std::string(14, '\0')), "MetadataIncompleteBuffer");
  expect_rejected(write_file("trailing", kDoctestHeader, std::string(16, '\0') + "garbage"),
                  "MetadataIncompleteBuffer");
  EXPECT_NO_THROW(SafetensorsReader::open(write_file("exact", kDoctestHeader, std::string(16, '\0'))));
}
