// Encodes a text file with one of our tokenizers on one thread and prints the throughput:
//   tokenizer_bench FILE REPEATS --tokenizer-type T [--vocab-file F --merge-file F | --tokenizer-model F]
// One line per pass: "pass N: BYTES bytes TOKENS tokens SECONDS s MB/s". The first pass starts
// with an empty word cache; later passes show the steady state of a long preprocessing run.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/tokenizer.h"

int main(int argc, char** argv) {
  using namespace megatron::datasets;
  if (argc < 5) {
    std::cerr << "usage: tokenizer_bench FILE REPEATS --tokenizer-type T [--vocab-file F --merge-file F | "
                 "--tokenizer-model F]\n";
    return 2;
  }
  try {
    TokenizerOptions options;
    for (int k = 3; k + 1 < argc; k += 2) {
      const std::string flag = argv[k];
      const std::string value = argv[k + 1];
      if (flag == "--tokenizer-type")
        options.type = value;
      else if (flag == "--vocab-file")
        options.vocab_file = value;
      else if (flag == "--merge-file")
        options.merge_file = value;
      else if (flag == "--tokenizer-model")
        options.model = value;
      else
        MEGATRON_FAIL("unknown flag " << flag);
    }
    const auto tokenizer = make_tokenizer(options);
    std::ifstream in(argv[1], std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    const std::string text = content.str();
    const int repeats = std::stoi(argv[2]);
    for (int pass = 1; pass <= repeats; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      const size_t tokens = tokenizer->encode(text).size();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("pass %d: %zu bytes %zu tokens %.3f s %.2f MB/s\n", pass, text.size(), tokens, seconds,
                  double(text.size()) / 1e6 / seconds);
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
