// `megatron generate` prints each sample as the prompt and its continuation decoded together, the
// way the checkpoint's tokenizer joins tokens.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "e2e/e2e_util.h"

using megatron::testing::run_megatron;
using megatron::testing::TempDir;

namespace {

const std::string kTiny =
    " --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    " --lr 1e-3 --train-iters 2 --log-interval 1 --device cpu --mock-data --save-interval 2";

// The text of sample 1: the line after its header.
std::string first_sample(const std::string& output) {
  const std::string header = "----- sample 1 -----\n";
  const size_t at = output.find(header);
  if (at == std::string::npos) return "(no sample in: " + output + ")";
  const size_t begin = at + header.size();
  return output.substr(begin, output.find('\n', begin) - begin);
}

}  // namespace

// The null tokenizer's text is ids separated by spaces: the prompt's ids, then the generated
// ones, each a whole id of the vocabulary (not "7" and "12" glued into "712").
TEST(Generate, NullTokenizerSeparatesPromptAndContinuationIds) {
  TempDir dir;
  const auto train =
      run_megatron("train" + kTiny + " --tokenizer-type NullTokenizer --vocab-size 64 --save " + dir.path());
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto r = run_megatron("generate --load " + dir.path() + " --prompt '5 6 7' --max-new-tokens 4 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = first_sample(r.output);
  std::istringstream words(text);
  std::vector<std::string> ids;
  for (std::string w; words >> w;) ids.push_back(w);
  ASSERT_GT(ids.size(), 3u) << "no token was generated: " << text;
  EXPECT_LE(ids.size(), 7u) << text;
  EXPECT_EQ(text.rfind("5 6 7 ", 0), 0u) << text;
  for (const std::string& id : ids) {
    EXPECT_EQ(id.find_first_not_of("0123456789"), std::string::npos) << id << " in " << text;
    EXPECT_LT(std::stoi(id), 64) << id << " in " << text;
  }
}

// A byte-level tokenizer decodes the prompt back to itself, and the continuation follows it.
TEST(Generate, ByteTokenizerPrintsThePromptThenTheContinuation) {
  TempDir dir;
  const auto train = run_megatron("train" + kTiny + " --tokenizer-type ByteTokenizer --save " + dir.path());
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto r =
      run_megatron("generate --load " + dir.path() + " --prompt 'Once upon' --max-new-tokens 4 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("----- sample 1 -----\nOnce upon"), std::string::npos) << r.output;
}
