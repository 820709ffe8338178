#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/indexed_dataset.h"
#include "megatron/datasets/preprocess.h"
#include "megatron/flags/flag_table.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
namespace fs = std::filesystem;

namespace {

using megatron::testing::error_of;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<int32_t> bytes_plus_eod(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  ids.push_back(256);
  return ids;
}

class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("megatron_pre_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_input(const std::string& contents) const {
    const std::string file = path("input.jsonl");
    std::ofstream(file, std::ios::binary) << contents;
    return file;
  }
  PreprocessOptions byte_options(const std::string& input, const std::string& out) const {
    PreprocessOptions o;
    o.input = input;
    o.output_prefix = path(out);
    o.tokenizer_type = "ByteTokenizer";
    o.append_eod = true;
    return o;
  }
  fs::path dir_;
};

}  // namespace

TEST(PreprocessArgs, ParsesEveryFlag) {
  const PreprocessOptions o = preprocess_flags().parse(
      {"--input", "in.jsonl", "--output-prefix=out", "--json-keys", "text", "title", "--tokenizer-type",
       "NullTokenizer", "--vocab-size", "1000", "--append-eod", "--workers", "3", "--max-bad-lines-fraction", "0.25"});
  EXPECT_EQ(o.input, "in.jsonl");
  EXPECT_EQ(o.output_prefix, "out");
  EXPECT_EQ(o.json_keys, (std::vector<std::string>{"text", "title"}));
  EXPECT_EQ(o.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(o.vocab_size, 1000);
  EXPECT_TRUE(o.append_eod);
  EXPECT_EQ(o.workers, 3);
  EXPECT_EQ(o.max_bad_lines_fraction, 0.25);

  const PreprocessOptions d =
      preprocess_flags().parse({"--input", "a", "--output-prefix", "b", "--tokenizer-type", "X"});
  EXPECT_EQ(d.json_keys, (std::vector<std::string>{"text"}));
  EXPECT_EQ(d.workers, 1);
  EXPECT_EQ(d.max_bad_lines_fraction, 0.001);
  EXPECT_FALSE(d.append_eod);
  EXPECT_NE(preprocess_flags().help().find("--max-bad-lines-fraction"), std::string::npos);
}

// The same machinery as `megatron train`: a --config YAML file under the command line, and the
// closest known flag or key for a typo.
TEST(PreprocessArgs, ConfigFileAndSuggestions) {
  const fs::path yaml = fs::temp_directory_path() / ("megatron_pre_config_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(yaml) << "input: from_yaml.jsonl\njson_keys: [text, title]\nworkers: 2\nappend_eod: true\n";
  const PreprocessOptions o = preprocess_flags().parse(
      {"--config", yaml.string(), "--workers", "4", "--output-prefix", "out", "--tokenizer-type", "ByteTokenizer"});
  EXPECT_EQ(o.input, "from_yaml.jsonl");
  EXPECT_EQ(o.json_keys, (std::vector<std::string>{"text", "title"}));
  EXPECT_EQ(o.workers, 4);  // the command line wins
  EXPECT_TRUE(o.append_eod);
  std::ofstream(yaml) << "json_key: text\n";
  EXPECT_NE(error_of([&] {
              preprocess_flags().parse({"--config", yaml.string()});
            }).find(": json_key: unknown key; did you mean json_keys?"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              preprocess_flags().parse({"--output-prefx", "o"});
            }).find("--output-prefx: unknown flag; did you mean --output-prefix?"),
            std::string::npos);
  fs::remove(yaml);
}

TEST(PreprocessArgs, ErrorsNameTheFlag) {
  const std::vector<std::string> base = {"--input", "a", "--output-prefix", "b", "--tokenizer-type", "X"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return error_of([&] { preprocess_flags().parse(argv); });
  };
  // tools/preprocess_data.py's flags for what is not built say so, with what to do instead.
  EXPECT_NE(with({"--split-sentences"})
                .find("--split-sentences: Megatron's flag, not built here: sentence splitting (NLTK) is not built"),
            std::string::npos);
  EXPECT_NE(
      with({"--partitions", "8"}).find("--partitions: Megatron's flag, not built here: the input is read in order"),
      std::string::npos);
  EXPECT_NE(with({"--workers"}).find("--workers needs a value"), std::string::npos);
  EXPECT_NE(with({"--workers", "two"}).find("--workers 'two': expected an integer"), std::string::npos);
  EXPECT_NE(with({"--workers", "0"}).find("--workers must be in [1, 1024]"), std::string::npos);
  EXPECT_NE(with({"--append-eod=yes"}).find("--append-eod takes no value"), std::string::npos);
  EXPECT_NE(with({"stray"}).find("'stray' follows no flag"), std::string::npos);
  EXPECT_NE(with({"--json-keys", "a", "a"}).find("'a' twice"), std::string::npos);
  EXPECT_NE(error_of([] { preprocess_flags().parse({"--input", "a"}); }).find("--output-prefix"), std::string::npos);
}

TEST_F(PreprocessTest, WritesMegatronDatasetsPerKey) {
  const std::string input = write_input(
      "{\"text\": \"hello\", \"title\": \"A\"}\n"
      "{\"text\": \"\", \"title\": \"B\", \"extra\": 1}\n"
      "\n"
      "{\"title\": \"C\", \"text\": \"caf\\u00e9 \\ud83d\\ude00\"}\n");
  PreprocessOptions o = byte_options(input, "out");
  o.json_keys = {"text", "title"};
  std::ostringstream log;
  const PreprocessReport report = preprocess_data(o, log);
  EXPECT_EQ(report.lines, 3);
  EXPECT_EQ(report.blank_lines, 1);
  EXPECT_EQ(report.bad_lines, 0);
  EXPECT_EQ(report.documents, 3);
  ASSERT_EQ(report.output_prefixes, (std::vector<std::string>{path("out_text_document"), path("out_title_document")}));

  const IndexedDataset text = IndexedDataset::open(path("out_text_document"));
  EXPECT_EQ(text.token_dtype(), IndexDType::u16);  // vocab 257 < 65500
  // The empty text is an empty document: a boundary with no sequence and no EOD (Megatron 1.5).
  EXPECT_EQ(text.num_documents(), 3);
  EXPECT_EQ(text.document_indices(), (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(text.get(0), bytes_plus_eod("hello"));
  EXPECT_EQ(text.get(1), bytes_plus_eod("caf\xC3\xA9 \xF0\x9F\x98\x80"));  // the JSON escapes as UTF-8

  const IndexedDataset title = IndexedDataset::open(path("out_title_document"));
  EXPECT_EQ(title.num_sequences(), 3);
  EXPECT_EQ(title.get(2), bytes_plus_eod("C"));
  EXPECT_EQ(report.tokens, 6 + 0 + 11 + 3 * 2);  // bytes plus one EOD per non-empty document
}

TEST_F(PreprocessTest, WorkerCountDoesNotChangeTheOutput) {
  // Enough lines for several 256-line chunks, of uneven cost, so workers finish out of order.
  std::string contents;
  for (int i = 0; i < 1500; ++i) {
    contents += "{\"text\": \"doc " + std::to_string(i) + " " + std::string(size_t((i * 37) % 300), 'x') + "\"}\n";
  }
  const std::string input = write_input(contents);
  std::ostringstream log;
  PreprocessOptions one = byte_options(input, "one");
  PreprocessOptions three = byte_options(input, "three");
  three.workers = 3;
  preprocess_data(one, log);
  preprocess_data(three, log);
  for (const char* ext : {".bin", ".idx"}) {
    const std::vector<char> a = read_bytes(path("one_text_document") + ext);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a, read_bytes(path("three_text_document") + ext)) << ext;
  }
  const IndexedDataset data = IndexedDataset::open(path("three_text_document"));
  ASSERT_EQ(data.num_sequences(), 1500);
  EXPECT_EQ(data.get(1234), bytes_plus_eod("doc 1234 " + std::string(size_t((1234 * 37) % 300), 'x')));
}

TEST_F(PreprocessTest, MalformedLinesAreReportedAndSkipped) {
  const std::string input = write_input(
      "{\"text\": \"a\"}\n"
      "{\"text\": \"b\"\n"
      "{\"body\": \"c\"}\n"
      "[1, 2]\n"
      "{\"text\": 5}\n"
      "{\"text\": \"d\"}\n");
  PreprocessOptions o = byte_options(input, "out");
  o.max_bad_lines_fraction = 0.7;
  std::ostringstream log;
  const PreprocessReport report = preprocess_data(o, log);
  EXPECT_EQ(report.lines, 6);
  EXPECT_EQ(report.bad_lines, 4);
  EXPECT_EQ(report.documents, 2);
  const std::string text = log.str();
  EXPECT_NE(text.find(input + ":2: malformed JSON"), std::string::npos) << text;
  EXPECT_NE(text.find(input + ":3: missing key 'text'"), std::string::npos) << text;
  EXPECT_NE(text.find(input + ":4: expected a JSON object, found a JSON array"), std::string::npos) << text;
  EXPECT_NE(text.find(input + ":5: key 'text' holds a JSON number"), std::string::npos) << text;
  const IndexedDataset data = IndexedDataset::open(path("out_text_document"));
  EXPECT_EQ(data.get(1), bytes_plus_eod("d"));
}

TEST_F(PreprocessTest, TooManyBadLinesFailAndWriteNothing) {
  std::string contents;
  for (int i = 0; i < 9; ++i) contents += "{\"text\": \"ok\"}\n";
  contents += "not json\n";
  const std::string input = write_input(contents);
  std::ostringstream log;
  const std::string error = error_of([&] { preprocess_data(byte_options(input, "out"), log); });
  EXPECT_NE(error.find("1 of 10 lines"), std::string::npos) << error;
  EXPECT_NE(error.find("--max-bad-lines-fraction 0.001"), std::string::npos) << error;
  EXPECT_NE(log.str().find(input + ":10: malformed JSON"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("out_text_document.bin")));
  EXPECT_FALSE(fs::exists(path("out_text_document.idx")));
  EXPECT_FALSE(fs::exists(path("out_text_document.bin.tmp")));
}

TEST_F(PreprocessTest, NullTokenizerPicksDtypeFromVocabSize) {
  const std::string input = write_input("{\"text\": \"1 2 3\"}\n{\"text\": \"65600\"}\n");
  PreprocessOptions o;
  o.input = input;
  o.output_prefix = path("big");
  o.tokenizer_type = "NullTokenizer";
  o.vocab_size = 70000;
  o.append_eod = true;
  std::ostringstream log;
  preprocess_data(o, log);
  const IndexedDataset big = IndexedDataset::open(path("big_text_document"));
  EXPECT_EQ(big.token_dtype(), IndexDType::i32);  // vocab >= 65500
  EXPECT_EQ(big.get(0), (std::vector<int32_t>{1, 2, 3, 69999}));
  EXPECT_EQ(big.get(1), (std::vector<int32_t>{65600, 69999}));

  // With a small vocabulary 65600 is outside it: the tokenizer's error makes the line bad.
  o.output_prefix = path("small");
  o.vocab_size = 1000;
  o.max_bad_lines_fraction = 0.5;
  const PreprocessReport report = preprocess_data(o, log);
  EXPECT_EQ(report.bad_lines, 1);
  EXPECT_NE(log.str().find(input + ":2: cannot tokenize key 'text'"), std::string::npos) << log.str();
  EXPECT_EQ(IndexedDataset::open(path("small_text_document")).token_dtype(), IndexDType::u16);
}

TEST_F(PreprocessTest, MissingInputIsNamed) {
  std::ostringstream log;
  const std::string error = error_of([&] { preprocess_data(byte_options(path("absent.jsonl"), "out"), log); });
  EXPECT_NE(error.find(path("absent.jsonl")), std::string::npos) << error;
}

// An input that yields no tokens under a key would pass here and fail only in `megatron train`
// (no sample to draw): it fails here, naming the key, and writes nothing.
TEST_F(PreprocessTest, InputWithoutTokensFailsAndWritesNothing) {
  std::ostringstream log;
  const auto expect_no_tokens = [&](const std::string& contents, const std::vector<std::string>& keys,
                                    const std::string& key) {
    PreprocessOptions o = byte_options(write_input(contents), "out");
    o.append_eod = false;  // an EOD would be a token of every non-empty document only
    o.json_keys = keys;
    const std::string error = error_of([&] { preprocess_data(o, log); });
    EXPECT_NE(error.find("yields no tokens for JSON key '" + key + "'"), std::string::npos) << error;
    for (const std::string& k : keys) {
      EXPECT_FALSE(fs::exists(path("out_" + k + "_document.bin"))) << contents;
      EXPECT_FALSE(fs::exists(path("out_" + k + "_document.idx"))) << contents;
    }
  };
  expect_no_tokens("", {"text"}, "text");
  expect_no_tokens("\n  \n{\"text\": \"\"}\n{\"text\": \"\"}\n", {"text"}, "text");
  expect_no_tokens("{\"text\": \"words\", \"title\": \"\"}\n", {"text", "title"}, "title");
}
