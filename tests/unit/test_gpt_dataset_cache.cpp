// The index cache in Megatron's format: MD5, Python's JSON and float text, .npy files, cache
// names, hits, and damaged caches rebuilt. Expected texts come from Python's json/hashlib and
// numpy's format specification.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/dataset_cache.h"
#include "megatron/datasets/gpt_dataset.h"
#include "megatron/datasets/indexed_dataset.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;
using megatron::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string write_corpus(const TempDir& dir) {
  const std::string prefix = dir / "corpus";
  IndexedDatasetBuilder builder(prefix, IndexDType::u16);
  const int lengths[10] = {5, 3, 8, 2, 7, 4, 6, 9, 1, 5};
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < lengths[i]; ++k) ids.push_back(i * 100 + k);
    builder.add_document(ids);
  }
  builder.finalize();
  return prefix;
}

std::vector<std::string> files_in(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

GPTDatasetConfig train_config(const std::string& cache) {
  GPTDatasetConfig config;
  config.seq_length = 4;
  config.seed = 1234;
  config.split = "60,20,20";
  config.cache_path = cache;
  return config;
}

}  // namespace

TEST(Md5, Rfc1321Vectors) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(md5_hex("abcdefghijklmnopqrstuvwxyz"), "c3fcd3d76192e4007dfb496cca67e13b");
  std::string eighty;
  for (int i = 0; i < 8; ++i) eighty += "1234567890";  // crosses a 64-byte block
  EXPECT_EQ(md5_hex(eighty), "57edf4a22be3c955ac49da2e2107b67a");
}

TEST(PythonJson, FloatsAndStringsAsPythonWritesThem) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  list.push_back("a\"b\\c\n\t\x01\x7f \xc3\xa9 \xe2\x82\xac\xf0\x9f\x98\x80");
  for (double v : {1e16, 1e15, 1e-5, 0.0001, 0.1 + 0.2, -0.0, 5.0, 123456789.125, 2.5e-300}) list.push_back(v);
  list.push_back(true);
  list.push_back(nullptr);
  list.push_back(nlohmann::ordered_json::object());
  // Python: print(json.dumps([...], indent=4)) of the same values.
  EXPECT_EQ(python_json_dumps(list),
            "[\n"
            "    \"a\\\"b\\\\c\\n\\t\\u0001\\u007f \\u00e9 \\u20ac\\ud83d\\ude00\",\n"
            "    1e+16,\n"
            "    1000000000000000.0,\n"
            "    1e-05,\n"
            "    0.0001,\n"
            "    0.30000000000000004,\n"
            "    -0.0,\n"
            "    5.0,\n"
            "    123456789.125,\n"
            "    2.5e-300,\n"
            "    true,\n"
            "    null,\n"
            "    {}\n"
            "]");
  EXPECT_EQ(python_json_dumps(std::string("\xff")), "\"\\udcff\"");  // an undecodable byte
}

TEST(PythonJson, DatasetDescriptionAndItsHash) {
  nlohmann::ordered_json tokenizer;
  tokenizer["class"] = "NullTokenizer";
  tokenizer["vocab_size"] = 32000;
  tokenizer["eod_id"] = 31999;
  tokenizer["pad_id"] = -1;
  tokenizer["paths"] = nlohmann::ordered_json::array();
  tokenizer["extra"] = nlohmann::ordered_json::object();
  nlohmann::ordered_json d;
  d["class"] = "GPTDataset";
  d["dataset_path"] = "/data/foo_text_document";
  d["num_samples"] = 30;
  d["index_split"] = "train";
  d["random_seed"] = 1234;
  d["sequence_length"] = 4;
  d["split"] = "60,20,20";
  d["split_matrix"] = split_matrix_json(parse_split("60,20,20"));
  d["tokenizer"] = tokenizer;
  const std::string text = python_json_dumps(d);
  EXPECT_EQ(text,
            "{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": \"/data/foo_text_document\",\n"
            "    \"num_samples\": 30,\n    \"index_split\": \"train\",\n    \"random_seed\": 1234,\n"
            "    \"sequence_length\": 4,\n    \"split\": \"60,20,20\",\n    \"split_matrix\": [\n        [\n"
            "            0,\n            0.6\n        ],\n        [\n            0.6,\n            0.8\n        ],\n"
            "        [\n            0.8,\n            1.0\n        ]\n    ],\n    \"tokenizer\": {\n"
            "        \"class\": \"NullTokenizer\",\n        \"vocab_size\": 32000,\n        \"eod_id\": 31999,\n"
            "        \"pad_id\": -1,\n        \"paths\": [],\n        \"extra\": {}\n    }\n}");
  EXPECT_EQ(md5_hex(text), "5bbe7fc8f2f6f3cd78ab4612a498ad1f");  // Python's hashlib.md5 of the same text
}

TEST(Npy, BytesMatchNumpySave) {
  TempDir dir;
  const std::string path = dir / "a.npy";
  write_npy(path, IndexArray(std::vector<int32_t>{1, -2, 3}));
  const std::string bytes = read_file(path);
  // numpy.save: magic, version 1.0, header length 118 so the data starts at byte 128; the dict
  // is followed by 21 - len("3") spaces of growth room, then padding and a newline.
  ASSERT_EQ(bytes.size(), 128u + 12u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(bytes.substr(8, 2), std::string("\x76\x00", 2));
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes.substr(10 + dict.size(), 117 - dict.size()), std::string(117 - dict.size(), ' '));
  EXPECT_EQ(bytes[127], '\n');
  EXPECT_EQ(bytes.substr(128, 4), std::string("\x01\x00\x00\x00", 4));

  write_npy(path, IndexArray(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, 2));
  EXPECT_NE(read_file(path).find("'shape': (3, 2), }"), std::string::npos);
  const IndexArray back = read_npy(path);
  EXPECT_EQ(back.type(), IndexType::i64);
  EXPECT_EQ(back.rows(), 3);
  EXPECT_EQ(back.columns(), 2);
  EXPECT_EQ(back.to_vector(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"a.npy"}));  // no temporaries left
}

TEST(Npy, MalformedFilesAreRejected) {
  TempDir dir;
  const std::string path = dir / "a.npy";
  write_npy(path, IndexArray(std::vector<uint32_t>{7, 8, 9}));
  const std::string good = read_file(path);
  write_file(path, good.substr(0, good.size() - 1));
  EXPECT_NE(error_of([&] { read_npy(path); }).find("the file is damaged"), std::string::npos);
  write_file(path, "PK" + good.substr(2));
  EXPECT_NE(error_of([&] { read_npy(path); }).find("bad magic"), std::string::npos);
  std::string float_array = good;
  float_array.replace(float_array.find("<u4"), 3, "<f4");
  write_file(path, float_array);
  EXPECT_NE(error_of([&] { read_npy(path); }).find("'<f4' is not an index dtype"), std::string::npos);
  EXPECT_NE(error_of([&] { read_npy(dir / "missing.npy"); }).find("cannot open"), std::string::npos);
}

TEST(IndexCacheTest, MegatronNamesAndHits) {
  TempDir dir;
  const auto data = open_indexed_sequences(write_corpus(dir));
  const std::string cache = dir / "cache";
  const GPTDataset built(data, {0, 6}, Split::train, 30, train_config(cache));
  EXPECT_FALSE(built.loaded_from_cache());
  const std::string hash = md5_hex(python_json_dumps(built.identifiers()));
  const std::string base = hash + "-GPTDataset-train-";
  EXPECT_EQ(files_in(cache), (std::vector<std::string>{base + "description.txt", base + "document_index.npy",
                                                       base + "sample_index.npy", base + "shuffle_index.npy"}));
  EXPECT_EQ(read_file(cache + "/" + base + "description.txt"), python_json_dumps(built.identifiers()));
  EXPECT_EQ(built.identifiers()["dataset_path"], dir / "corpus");
  EXPECT_EQ(built.identifiers()["num_samples"], 30);

  const GPTDataset loaded(data, {0, 6}, Split::train, 30, train_config(cache));
  EXPECT_TRUE(loaded.loaded_from_cache());
  EXPECT_EQ(loaded.shuffle_index().to_vector(), built.shuffle_index().to_vector());
  for (int64_t i = 0; i < built.size(); ++i) EXPECT_EQ(loaded.get(i), built.get(i));

  // Another sample count is another description, hence other files.
  const GPTDataset other(data, {0, 6}, Split::train, 31, train_config(cache));
  EXPECT_FALSE(other.loaded_from_cache());
  EXPECT_EQ(files_in(cache).size(), 8u);
}

TEST(IndexCacheTest, DamagedCachesAreRebuilt) {
  TempDir dir;
  const auto data = open_indexed_sequences(write_corpus(dir));
  const std::string cache = dir / "cache";
  const GPTDataset built(data, {0, 6}, Split::train, 30, train_config(cache));
  const std::string base = cache + "/" + md5_hex(python_json_dumps(built.identifiers())) + "-GPTDataset-train-";
  const std::string shuffle = read_file(base + "shuffle_index.npy");

  // A value duplicated inside the permutation: the file parses, the check catches it.
  std::string duplicated = shuffle;
  duplicated.replace(128 + 4, 4, shuffle.substr(128, 4));
  write_file(base + "shuffle_index.npy", duplicated);
  ::testing::internal::CaptureStderr();
  const GPTDataset after_duplicate(data, {0, 6}, Split::train, 30, train_config(cache));
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("WARNING: the index cache " + base + "* is damaged (shuffle_index[1]"), std::string::npos)
      << warning;
  EXPECT_FALSE(after_duplicate.loaded_from_cache());
  EXPECT_EQ(read_file(base + "shuffle_index.npy"), shuffle);  // rewritten

  write_file(base + "sample_index.npy", read_file(base + "sample_index.npy").substr(0, 140));  // truncated
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(GPTDataset(data, {0, 6}, Split::train, 30, train_config(cache)).loaded_from_cache());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("sample_index.npy holds 12 data bytes"), std::string::npos);
  fs::remove(base + "document_index.npy");  // incomplete
  EXPECT_FALSE(GPTDataset(data, {0, 6}, Split::train, 30, train_config(cache)).loaded_from_cache());
  write_file(base + "description.txt", "{}");  // not this dataset's description
  EXPECT_FALSE(GPTDataset(data, {0, 6}, Split::train, 30, train_config(cache)).loaded_from_cache());

  const GPTDataset healed(data, {0, 6}, Split::train, 30, train_config(cache));
  EXPECT_TRUE(healed.loaded_from_cache());
  EXPECT_EQ(healed.shuffle_index().to_vector(), built.shuffle_index().to_vector());
}

TEST(IndexCacheTest, DefaultDirectoryIsNamedAfterThePrefix) {
  TempDir dir;
  const std::string prefix = write_corpus(dir);
  GPTDataConfig config;
  config.data_path = {prefix};
  config.split = "60,20,20";
  config.seq_length = 4;
  build_gpt_dataset(config, Split::valid, 5);
  EXPECT_EQ(default_cache_directory(prefix, "GPTDataset"), prefix + "/cache/GPTDataset_indices");
  EXPECT_EQ(files_in(prefix + "/cache/GPTDataset_indices").size(), 4u);

  // Mock data is cached only in an explicit directory.
  GPTDataConfig mock;
  mock.mock_data = true;
  mock.seq_length = 4096;
  mock.vocab_size = 1000;
  mock.eod = 999;
  EXPECT_GT(build_gpt_dataset(mock, Split::test, 1)->size(), 0);
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"corpus", "corpus.bin", "corpus.idx"}));
  mock.data_cache_path = dir / "mock_cache";
  build_gpt_dataset(mock, Split::test, 1);
  const std::vector<std::string> names = files_in(dir / "mock_cache");
  ASSERT_EQ(names.size(), 4u);
  EXPECT_NE(names[0].find("-MockGPTDataset-test-"), std::string::npos) << names[0];
}

TEST(IndexCacheTest, UnwritableDirectoryCostsOnlyTheCache) {
  TempDir dir;
  const auto data = open_indexed_sequences(write_corpus(dir));
  write_file(dir / "blocker", "a file where the cache directory should go");
  const GPTDataset ds(data, {0, 6}, Split::train, 30, train_config(dir / "blocker/cache"));
  EXPECT_EQ(ds.size(), 36);
}
