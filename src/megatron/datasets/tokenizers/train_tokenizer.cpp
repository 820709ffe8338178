#include "megatron/datasets/tokenizers/train_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/datasets/tokenizers/bpe_trainer.h"
#include "megatron/datasets/tokenizers/tokenizer.h"

namespace megatron::datasets {

namespace {

struct Flag {
  const char* name;
  bool many;  // takes one or more values
  const char* help;
  void (*set)(TrainTokenizerOptions&, const std::vector<std::string>&);
};

int64_t to_int(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MEGATRON_CHECK(used == value.size() && !value.empty(), flag << " expects an integer, got '" << value << "'");
  return v;
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--input", false, "corpus: JSON lines (.jsonl/.json) or plain text, one document per line (required)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) { o.input = v[0]; }},
      {"--json-keys", true, "JSON keys whose strings are documents (default: text)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) { o.json_keys = v; }},
      {"--vocab-size", false, "vocabulary size, 256 bytes and <|endoftext|> included (required, >= 257)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) {
         o.vocab_size = to_int("--vocab-size", v[0]);
       }},
      {"--output", false, "tokenizer.json to write (required)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) { o.output = v[0]; }},
      {"--workers", false, "threads counting words (default: all cores)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) { o.workers = to_int("--workers", v[0]); }},
      {"--min-frequency", false, "pairs seen fewer times are not merged (default 2)",
       [](TrainTokenizerOptions& o, const std::vector<std::string>& v) {
         o.min_frequency = to_int("--min-frequency", v[0]);
       }},
  };
  return table;
}

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

TrainTokenizerOptions parse_train_tokenizer_args(const std::vector<std::string>& argv) {
  TrainTokenizerOptions o;
  for (size_t k = 0; k < argv.size();) {
    std::string name = argv[k++];
    std::vector<std::string> values;
    if (const size_t eq = name.find('='); eq != std::string::npos && name.rfind("--", 0) == 0) {
      values.push_back(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags()) {
      if (name == f.name) flag = &f;
    }
    MEGATRON_CHECK(flag != nullptr, "train-tokenizer: unknown flag '" << name << "' (see train-tokenizer --help)");
    while (values.empty() || (flag->many && k < argv.size() && argv[k].rfind("--", 0) != 0)) {
      if (k >= argv.size() || argv[k].rfind("--", 0) == 0) break;
      values.push_back(argv[k++]);
    }
    MEGATRON_CHECK(!values.empty(), "train-tokenizer: " << name << " needs a value");
    flag->set(o, values);
  }
  MEGATRON_CHECK(!o.input.empty(), "train-tokenizer needs --input FILE");
  MEGATRON_CHECK(!o.output.empty(), "train-tokenizer needs --output tokenizer.json");
  MEGATRON_CHECK(o.vocab_size != 0, "train-tokenizer needs --vocab-size N (at least 257)");
  MEGATRON_CHECK(o.workers >= 0, "--workers " << o.workers << " must be >= 0 (0: all cores)");
  MEGATRON_CHECK(o.min_frequency >= 1, "--min-frequency " << o.min_frequency << " must be >= 1");
  return o;
}

std::string train_tokenizer_help() {
  std::ostringstream os;
  os << "usage: megatron train-tokenizer --input CORPUS --vocab-size N --output tokenizer.json [flags]\n\n"
     << "Trains a byte-level BPE (GPT-2 pre-tokenizer) and writes a Hugging Face tokenizer.json.\n\n";
  for (const Flag& f : flags()) os << "  " << f.name << (f.many ? " V [V ...]" : " V") << "\n      " << f.help << "\n";
  return os.str();
}

TrainTokenizerReport train_tokenizer(const TrainTokenizerOptions& o, std::ostream& log) {
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
