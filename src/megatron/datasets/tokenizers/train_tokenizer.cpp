#include "megatron/datasets/tokenizers/train_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/datasets/tokenizers/bpe_trainer.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/flags/flag_table.h"

namespace megatron::datasets {

namespace {

#define FIELD(member) MEGATRON_FLAG_FIELD(TrainTokenizerOptions, member)

std::vector<flags::Flag<TrainTokenizerOptions>> train_tokenizer_flag_rows() {
  const char* io = "input and output";
  const char* training = "training";
  return {
      {"--config", flags::ConfigFile{}, "configuration",
       "YAML file of flag values (keys: flag names without the leading dashes, e.g. vocab_size: 32000); "
       "command-line flags override it"},
      {"--input", FIELD(input), io, "Corpus: JSON lines (.jsonl/.json) or plain text, one document per line; required"},
      {"--json-keys", FIELD(json_keys), io, "JSON keys whose strings are documents"},
      {"--output", FIELD(output), io, "tokenizer.json to write; required"},
      {"--vocab-size", FIELD(vocab_size), training,
       "Vocabulary size, 256 bytes and <|endoftext|> included; required, >= 257"},
      {"--min-frequency", FIELD(min_frequency), training, "Pairs seen fewer times are not merged"},
      {"--workers", FIELD(workers), training, "Threads counting words; 0: all cores"},
  };
}

#undef FIELD

bool is_json_lines(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// The documents of the corpus; `storage` owns what the views point into.
std::vector<std::string_view> read_documents(const TrainTokenizerOptions& o, std::string& text,
                                             std::vector<std::string>& storage) {
  text = read_tokenizer_file(o.input, "train-tokenizer --input");
  std::vector<std::string_view> lines;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    end = end == std::string::npos ? text.size() : end + 1;  // a text document keeps its newline
    lines.emplace_back(text.data() + begin, end - begin);
    begin = end;
  }
  if (!is_json_lines(o.input)) return lines;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string_view line = lines[n];
    if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) continue;
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MEGATRON_FAIL(o.input << " line " << n + 1 << " is not valid JSON (" << e.what() << ")");
    }
    MEGATRON_CHECK(doc.is_object(), o.input << " line " << n + 1 << " is not a JSON object");
    for (const std::string& key : o.json_keys) {
      MEGATRON_CHECK(doc.contains(key) && doc.at(key).is_string(),
                     o.input << " line " << n + 1 << " has no string field \"" << key << "\"; check --json-keys");
      storage.push_back(doc.at(key).get<std::string>());
    }
  }
  return {storage.begin(), storage.end()};
}

}  // namespace

std::vector<std::string> validate(const TrainTokenizerOptions& o) {
  std::vector<std::string> errors;
  if (o.input.empty()) errors.push_back("train-tokenizer needs --input FILE: the corpus to learn from");
  if (o.output.empty()) errors.push_back("train-tokenizer needs --output tokenizer.json: the file to write");
  if (o.vocab_size == 0) errors.push_back("train-tokenizer needs --vocab-size N (at least 257)");
  if (o.workers < 0) errors.push_back(concat("--workers ", o.workers, " must be >= 0 (0: all cores)"));
  if (o.min_frequency < 1) errors.push_back(concat("--min-frequency ", o.min_frequency, " must be >= 1"));
  return errors;
}

const flags::FlagTable<TrainTokenizerOptions>& train_tokenizer_flags() {
  static const flags::FlagTable<TrainTokenizerOptions> table(
      "megatron train-tokenizer",
      "usage: megatron train-tokenizer --input CORPUS --vocab-size N --output tokenizer.json [flags]\n\n"
      "Trains a byte-level BPE (GPT-2 pre-tokenizer) and writes a Hugging Face tokenizer.json.\n",
      train_tokenizer_flag_rows(), validate);
  return table;
}

TrainTokenizerReport train_tokenizer(const TrainTokenizerOptions& o, std::ostream& log) {
  if (const std::vector<std::string> problems = validate(o); !problems.empty()) flags::throw_problems(problems);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  TrainTokenizerReport report;
  std::string text;
  std::vector<std::string> storage;
  const std::vector<std::string_view> documents = read_documents(o, text, storage);
  report.documents = int64_t(documents.size());
  for (std::string_view d : documents) report.bytes += int64_t(d.size());
  const int threads = o.workers > 0 ? int(o.workers) : int(std::max(1u, std::thread::hardware_concurrency()));
  const WordCounts counts = count_words(documents, threads);
  report.distinct_words = int64_t(counts.size());
  char line[200];
  std::snprintf(line, sizeof(line),
                "train-tokenizer: %lld documents, %.1f MB, %lld distinct words counted in %.1f s (%.1f MB/s)\n",
                static_cast<long long>(report.documents), double(report.bytes) / 1e6,
                static_cast<long long>(report.distinct_words), seconds(), double(report.bytes) / 1e6 / seconds());
  log << line << std::flush;

  BpeTrainOptions train;
  train.vocab_size = o.vocab_size;
  train.min_frequency = o.min_frequency;
  double last_report = seconds();
  train.progress = [&](int64_t done, int64_t wanted) {
    if (done < wanted && seconds() - last_report < 1.0) return;
    last_report = seconds();
    std::snprintf(line, sizeof(line), "train-tokenizer: %lld / %lld merges (%.1f s)\n", static_cast<long long>(done),
                  static_cast<long long>(wanted), seconds());
    log << line << std::flush;
  };
  const BpeModel model = train_bpe(counts, train);
  report.vocab_size = int64_t(model.tokens.size()) + 1;
  if (report.vocab_size < o.vocab_size) {
    log << "train-tokenizer: no pair occurs " << o.min_frequency << " times any more: the vocabulary has "
        << report.vocab_size << " tokens, not " << o.vocab_size << "\n";
  }

  const std::string temporary = o.output + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary);
    MEGATRON_CHECK(out.good(), "train-tokenizer cannot write " << temporary << "; check --output");
    out << bpe_tokenizer_json(model);
    out.close();
    MEGATRON_CHECK(out.good(), "train-tokenizer failed writing " << temporary << " (disk full?)");
  }
  std::filesystem::rename(temporary, o.output);
  log << "train-tokenizer: wrote " << o.output << " (" << report.vocab_size << " tokens; use --tokenizer-type "
      << "HuggingFaceTokenizer --tokenizer-model " << o.output << ")\n";
  return report;
}

}  // namespace megatron::datasets
