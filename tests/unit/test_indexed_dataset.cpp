#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/indexed_dataset.h"

using namespace megatron;
using namespace megatron::datasets;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("megatron_idx_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name = "data") const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Little-endian encoding written out byte by byte, independent of the code under test.
void put_le(std::vector<unsigned char>& out, uint64_t value, int bytes) {
  for (int k = 0; k < bytes; ++k) out.push_back(static_cast<unsigned char>((value >> (8 * k)) & 0xff));
}

std::vector<unsigned char> idx_header(uint8_t code, uint64_t n, uint64_t d) {
  std::vector<unsigned char> out = {0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00};
  put_le(out, 1, 8);
  out.push_back(code);
  put_le(out, n, 8);
  put_le(out, d, 8);
  return out;
}

const std::vector<int32_t> kTenLengths = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};

// megatron-compat.md 1.1: ten one-sequence documents, document i token k = i*100 + k, uint16.
void build_ten_documents(const std::string& prefix) {
  IndexedDatasetBuilder builder(prefix, IndexDType::u16);
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < kTenLengths[size_t(i)]; ++k) ids.push_back(i * 100 + k);
    builder.add_document(ids);
  }
  builder.finalize();
}

template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& substrings) {
  try {
    fn();
    ADD_FAILURE() << "expected megatron::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& s : substrings) EXPECT_NE(message.find(s), std::string::npos) << message;
  }
}

}  // namespace

TEST_F(IndexedDatasetTest, TenDocumentUint16KnownAnswer) {
  build_ten_documents(prefix());
  std::vector<unsigned char> expected = idx_header(8, 10, 11);
  for (int32_t len : kTenLengths) put_le(expected, uint64_t(len), 4);
  for (uint64_t ptr : {0, 10, 16, 32, 36, 50, 58, 70, 88, 90}) put_le(expected, ptr, 8);
  for (uint64_t j = 0; j <= 10; ++j) put_le(expected, j, 8);
  ASSERT_EQ(expected.size(), 242u);  // the size Megatron writes for this example
  EXPECT_EQ(read_bytes(prefix() + ".idx"), expected);

  std::vector<unsigned char> bin;
  for (int i = 0; i < 10; ++i) {
    for (int k = 0; k < kTenLengths[size_t(i)]; ++k) put_le(bin, uint64_t(i * 100 + k), 2);
  }
  ASSERT_EQ(bin.size(), 100u);
  EXPECT_EQ(read_bytes(prefix() + ".bin"), bin);
}

TEST_F(IndexedDatasetTest, SentenceSplitInt32KnownAnswer) {
  IndexedDatasetBuilder builder(prefix(), IndexDType::i32);
  builder.add_document({11, 12, 13, 14, 15}, {2, 3});
  builder.add_document({}, {});
  builder.add_document({21, 22}, {2});
  builder.finalize();

  std::vector<unsigned char> expected = idx_header(4, 3, 4);
  for (uint64_t len : {2, 3, 2}) put_le(expected, len, 4);
  for (uint64_t ptr : {0, 8, 20}) put_le(expected, ptr, 8);
  for (uint64_t j : {0, 2, 2, 3}) put_le(expected, j, 8);
  EXPECT_EQ(read_bytes(prefix() + ".idx"), expected);
  std::vector<unsigned char> bin;
  for (uint64_t id : {11, 12, 13, 14, 15, 21, 22}) put_le(bin, id, 4);
  EXPECT_EQ(read_bytes(prefix() + ".bin"), bin);

  const IndexedDataset data = IndexedDataset::open(prefix());
  EXPECT_EQ(data.num_sequences(), 3);
  EXPECT_EQ(data.num_documents(), 3);
  EXPECT_EQ(data.document_indices(), (std::vector<int64_t>{0, 2, 2, 3}));
  EXPECT_EQ(data.get(1), (std::vector<int32_t>{13, 14, 15}));
  EXPECT_EQ(data.sequence_pointer(2), 20);
}

TEST_F(IndexedDatasetTest, RoundTripEveryIntegerDtype) {
  const std::vector<std::pair<IndexDType, std::pair<int32_t, int32_t>>> cases = {
      {IndexDType::u8, {0, 255}},    {IndexDType::i8, {-128, 127}},    {IndexDType::i16, {-32768, 32767}},
      {IndexDType::u16, {0, 65535}}, {IndexDType::i32, {-5, 1 << 30}}, {IndexDType::i64, {0, 2147483647}},
  };
  std::mt19937 gen(7);
  for (const auto& [dtype, range] : cases) {
    const std::string p = prefix(index_dtype_name(dtype));
    std::uniform_int_distribution<int32_t> id(range.first, range.second);
    std::uniform_int_distribution<int> len(6, 40);  // long enough for the sub-range reads below
    std::vector<std::vector<int32_t>> docs(25);
    {
      IndexedDatasetBuilder builder(p, dtype);
      for (auto& doc : docs) {
        doc.resize(size_t(len(gen)));
        for (int32_t& v : doc) v = id(gen);
        doc.front() = range.first;  // the extremes must survive the narrowing and widening
        doc.back() = range.second;
        builder.add_document(doc);
      }
      builder.finalize();
    }
    const IndexedDataset data = IndexedDataset::open(p);
    EXPECT_EQ(data.token_dtype(), dtype);
    ASSERT_EQ(data.num_sequences(), 25);
    for (int64_t i = 0; i < 25; ++i) {
      EXPECT_EQ(data.get(i), docs[size_t(i)]) << index_dtype_name(dtype) << " sequence " << i;
      EXPECT_EQ(data.sequence_length(i), int32_t(docs[size_t(i)].size()));
    }
    const std::vector<int32_t>& doc = docs[3];
    EXPECT_EQ(data.get(3, 2, 3), std::vector<int32_t>(doc.begin() + 2, doc.begin() + 5));
    EXPECT_EQ(data.get(3, 4), std::vector<int32_t>(doc.begin() + 4, doc.end()));
  }
}

TEST_F(IndexedDatasetTest, EmptyDatasetAndEmptyDocuments) {
  {
    IndexedDatasetBuilder builder(prefix(), IndexDType::u16);
    builder.add_document({});
    builder.add_document({});
    builder.finalize();
  }
  const IndexedDataset data = IndexedDataset::open(prefix());
  EXPECT_EQ(data.num_sequences(), 0);
  EXPECT_EQ(data.num_documents(), 2);
  EXPECT_EQ(data.document_indices(), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(fs::file_size(prefix() + ".bin"), 0u);
}

TEST_F(IndexedDatasetTest, OptimalDtypeFollowsMegatronThreshold) {
  EXPECT_EQ(optimal_index_dtype(50257), IndexDType::u16);
  EXPECT_EQ(optimal_index_dtype(65499), IndexDType::u16);
  EXPECT_EQ(optimal_index_dtype(65500), IndexDType::i32);
  EXPECT_EQ(optimal_index_dtype(128256), IndexDType::i32);
}

TEST_F(IndexedDatasetTest, BuilderRejectsBadInput) {
  IndexedDatasetBuilder builder(prefix(), IndexDType::u16);
  expect_error([&] { builder.add_document({1, 70000}); }, {"70000", "does not fit", "uint16", "int32"});
  expect_error([&] { builder.add_document({1, 2, 3}, {1, 1}); }, {"sum to 2", "3 ids"});
  expect_error([] { IndexedDatasetBuilder(std::string("/nonexistent-dir/x"), IndexDType::u16); },
               {"/nonexistent-dir/x.bin.tmp", "output directory"});
  expect_error([&] { IndexedDatasetBuilder(prefix("f"), IndexDType::f32); }, {"float32", "uint16 or int32"});
}

TEST_F(IndexedDatasetTest, WritesThroughTemporaryFiles) {
  {
    IndexedDatasetBuilder builder(prefix(), IndexDType::u16);
    builder.add_document({1, 2, 3});
    EXPECT_TRUE(fs::exists(prefix() + ".bin.tmp"));
    EXPECT_FALSE(fs::exists(prefix() + ".bin"));
    // Destroyed without finalize(): an interrupted run leaves nothing behind.
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  build_ten_documents(prefix());
  EXPECT_FALSE(fs::exists(prefix() + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(prefix() + ".idx.tmp"));
  EXPECT_TRUE(fs::exists(prefix() + ".idx"));
}

TEST_F(IndexedDatasetTest, MissingFilesNameThePathAndTheFix) {
  expect_error([&] { IndexedDataset::open(prefix("absent")); },
               {prefix("absent") + ".idx", "No such file", "megatron preprocess-data"});
  build_ten_documents(prefix());
  fs::remove(prefix() + ".bin");
  expect_error([&] { IndexedDataset::open(prefix()); }, {prefix() + ".bin", "megatron preprocess-data"});
  expect_error([&] { IndexedDataset::open(prefix() + ".idx"); }, {"without the extension"});
}

TEST_F(IndexedDatasetTest, CorruptHeadersAreRejected) {
  build_ten_documents(prefix());
  const std::string idx = prefix() + ".idx";
  const std::vector<unsigned char> good = read_bytes(idx);
  auto with = [&](auto&& edit, const std::vector<std::string>& substrings) {
    std::vector<unsigned char> bytes = good;
    edit(bytes);
    write_bytes(idx, bytes);
    expect_error([&] { IndexedDataset::open(prefix()); }, substrings);
  };
  with([](auto& b) { b[0] = 'X'; }, {idx, "not a Megatron .idx", "58 4d 49"});
  with([](auto& b) { b[9] = 2; }, {idx, "version 2"});
  with([](auto& b) { b[17] = 9; }, {idx, "unknown dtype code 9"});
  with([](auto& b) { b[17] = 7; }, {idx, "float32"});
  with([](auto& b) { b.resize(20); }, {idx, "truncated", "34 bytes", "has 20"});
  with([](auto& b) { b.resize(234); }, {idx, "truncated", "needs 242 bytes", "has 234"});
  with([](auto& b) { b.push_back(0); }, {idx, "243 bytes", "implies 242"});
  with([](auto& b) { b.insert(b.end(), 10, 0); }, {idx, "multimodal"});
  with(
      [](auto& b) {
        b[18] = 0xff;
        b[25] = 0x7f;
      },
      {idx, "corrupt"});
  // document_indices start at 34 + 12*10 = 154; entry j at 154 + 8j.
  with([](auto& b) { b[154 + 8 * 4] = 9; }, {idx, "document_indices[5]", "non-decreasing"});
  with([](auto& b) { b[154 + 8 * 10] = 9; }, {idx, "last document index is 9", "10 sequences"});
  with([](auto& b) { b[154] = 1; }, {idx, "document_indices[0] is 1"});
}

TEST_F(IndexedDatasetTest, SequencesOutsideTheBinAreRejected) {
  build_ten_documents(prefix());
  const std::vector<unsigned char> bin = read_bytes(prefix() + ".bin");
  write_bytes(prefix() + ".bin", std::vector<unsigned char>(bin.begin(), bin.end() - 2));
  expect_error([&] { IndexedDataset::open(prefix()); },
               {"sequence 9", "[90, 100)", prefix() + ".bin", "has 98 bytes", "rebuild"});

  write_bytes(prefix() + ".bin", bin);
  std::vector<unsigned char> idx = read_bytes(prefix() + ".idx");
  idx[34 + 4 * 10 + 8 * 3] = 200;  // pointer of sequence 3 moves past the end of .bin
  write_bytes(prefix() + ".idx", idx);
  expect_error([&] { IndexedDataset::open(prefix()); }, {"sequence 3", "[200, 204)"});
}

TEST_F(IndexedDatasetTest, ReadsOutsideASequenceAreRejected) {
  build_ten_documents(prefix());
  const IndexedDataset data = IndexedDataset::open(prefix());
  EXPECT_EQ(data.get(7, 8), (std::vector<int32_t>{708}));
  EXPECT_EQ(data.get(7, 9), std::vector<int32_t>{});
  expect_error([&] { data.get(10); }, {"sequence 10 out of range [0, 10)"});
  expect_error([&] { data.get(1, 2, 2); }, {"[2, 4)", "sequence 1 of length 3"});
  expect_error([&] { data.get(1, 4); }, {"sequence 1 of length 3"});
}
