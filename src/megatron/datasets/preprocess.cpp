#include "megatron/datasets/preprocess.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"
#include "megatron/datasets/indexed_dataset.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/flags/flag_table.h"

namespace megatron::datasets {

// ---- flags ----------------------------------------------------------------------------------

namespace {

#define FIELD(member) MEGATRON_FLAG_FIELD(PreprocessOptions, member)

std::vector<flags::Flag<PreprocessOptions>> preprocess_flag_rows() {
  using Switch = flags::Switch<PreprocessOptions>;
  const char* io = "input and output";
  const char* tokenizer = "tokenizer (as megatron train takes it)";
  const char* processing = "processing";
  return {
      {"--config", flags::ConfigFile{}, "configuration",
       "YAML file of flag values (keys: flag names without the leading dashes, e.g. json_keys: [text, title]); "
       "command-line flags override it"},
      {"--input", FIELD(input), io, "JSON-lines file to convert; required"},
      {"--output-prefix", FIELD(output_prefix), io, "Writes <prefix>_<key>_document.{bin,idx}; required"},
      {"--json-keys", FIELD(json_keys), io, "Keys to tokenize, one dataset each"},
      {"--tokenizer-type", FIELD(tokenizer_type), tokenizer,
       "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
       "TikTokenizer, ByteTokenizer or NullTokenizer; required"},
      {"--vocab-size", FIELD(vocab_size), tokenizer, "Vocabulary size of NullTokenizer"},
      {"--tokenizer-model", FIELD(tokenizer_model), tokenizer,
       "tokenizer.json, SentencePiece .model or tiktoken vocabulary JSON of tokenizers that read one"},
      {"--vocab-file", FIELD(vocab_file), tokenizer, "GPT-2 vocab.json (GPT2BPETokenizer)"},
      {"--merge-file", FIELD(merge_file), tokenizer, "GPT-2 merges.txt (GPT2BPETokenizer)"},
      {"--tiktoken-pattern", FIELD(tiktoken_pattern), tokenizer,
       "TikTokenizer's split regex: v1 or v2 (Megatron's; unset: v2)"},
      {"--tiktoken-num-special-tokens", FIELD(tiktoken_num_special_tokens), tokenizer,
       "TikTokenizer's number of special-token ids before the vocabulary (unset: 1000)"},
      {"--special-tokens", FIELD(special_tokens), tokenizer,
       "TikTokenizer's special tokens, which must include <unk> <s> </s> <mask> <pad> <cls> <sep> (unset: those "
       "seven)"},
      {"--append-eod", Switch{FIELD(append_eod), true}, processing,
       "Append the end-of-document id to every non-empty document"},
      {"--workers", FIELD(workers), processing, "Tokenizer threads"},
      {"--max-bad-lines-fraction", FIELD(max_bad_lines_fraction), processing,
       "Fail when more than this share of the lines is malformed"},
  };
}

#undef FIELD

}  // namespace

std::vector<std::string> validate(const PreprocessOptions& o) {
  std::vector<std::string> errors;
  if (o.input.empty()) errors.push_back("preprocess-data needs --input FILE.jsonl: the JSON lines to convert");
  if (o.output_prefix.empty())
    errors.push_back("preprocess-data needs --output-prefix P: it writes P_<key>_document.{bin,idx}");
  if (o.tokenizer_type.empty())
    errors.push_back("preprocess-data needs --tokenizer-type, e.g. GPT2BPETokenizer or NullTokenizer (see --help)");
  if (o.json_keys.empty()) errors.push_back("--json-keys needs at least one key, e.g. --json-keys text");
  std::set<std::string> seen;
  for (const std::string& key : o.json_keys) {
    if (!seen.insert(key).second) errors.push_back(concat("--json-keys lists '", key, "' twice; give each key once"));
  }
  if (o.workers < 1 || o.workers > 1024)
    errors.push_back(concat("--workers must be in [1, 1024], got ", o.workers, ": the number of tokenizer threads"));
  if (!(o.max_bad_lines_fraction >= 0.0 && o.max_bad_lines_fraction <= 1.0))
    errors.push_back(concat("--max-bad-lines-fraction must be in [0, 1], got ", o.max_bad_lines_fraction));
  return errors;
}

// tools/preprocess_data.py's flags for what is not built here, with what to do instead.
std::vector<flags::NotBuilt> preprocess_flags_not_built() {
  const std::string sentences = "sentence splitting (NLTK) is not built: each JSON value is tokenized whole";
  return {
      {"--split-sentences", sentences},
      {"--keep-newlines", sentences},
      {"--lang", sentences},
      {"--partitions",
       "the input is read in order and tokenized by --workers threads, in the order of Megatron's single "
       "partition: drop the flag and raise --workers"},
      {"--keep-sequential-samples", "the output always keeps the input's order here: drop the flag"},
      {"--log-interval", "progress is printed as the run goes: drop the flag"},
  };
}

const flags::FlagTable<PreprocessOptions>& preprocess_flags() {
  static const flags::FlagTable<PreprocessOptions> table(
      "megatron preprocess-data",
      "usage: megatron preprocess-data --input FILE.jsonl --output-prefix P --tokenizer-type T [flags]\n\n"
      "Tokenizes the JSON lines into Megatron's .bin/.idx files, one dataset per --json-keys key.\n",
      preprocess_flag_rows(), validate, preprocess_flags_not_built());
  return table;
}

std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

// ---- the pipeline ---------------------------------------------------------------------------

namespace {

constexpr size_t kChunkLines = 256;
constexpr size_t kChunkBytes = size_t(1) << 20;
constexpr int64_t kMaxReportedBadLines = 100;

struct LineChunk {
  int64_t index = 0;
  int64_t first_line = 0;  // 1-based number of lines[0]
  int64_t bytes = 0;
  std::vector<std::string> lines;
};

struct TokenizedLine {
  bool blank = false;
  std::string error;                       // non-empty: malformed
  std::vector<std::vector<int32_t>> docs;  // one per JSON key
};

struct TokenizedChunk {
  int64_t first_line = 0;
  int64_t bytes = 0;
  std::vector<TokenizedLine> lines;
};

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r\n\v\f") == std::string::npos; }

TokenizedLine tokenize_line(const std::string& line, const PreprocessOptions& options, const Tokenizer& tokenizer) {
  TokenizedLine out;
  if (is_blank(line)) {
    out.blank = true;
    return out;
  }
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    out.error = std::string("malformed JSON: ") + e.what();
    return out;
  }
  if (!data.is_object()) {
    out.error = std::string("expected a JSON object, found a JSON ") + data.type_name();
    return out;
  }
  for (const std::string& key : options.json_keys) {
    const auto it = data.find(key);
    if (it == data.end()) {
      out.error = "missing key '" + key + "'";
      return out;
    }
    if (!it->is_string()) {
      out.error = "key '" + key + "' holds a JSON " + it->type_name() + ", not a string";
      return out;
    }
    std::vector<int32_t> ids;
    try {
      ids = tokenizer.encode(it->get_ref<const std::string&>());
    } catch (const Error& e) {
      out.error = std::string("cannot tokenize key '") + key + "': " + e.what();
      return out;
    }
    // Megatron: an empty document gets no EOD and stays empty.
    if (options.append_eod && !ids.empty()) ids.push_back(tokenizer.eod());
    out.docs.push_back(std::move(ids));
  }
  return out;
}

// State shared by the reader, the tokenizer threads and the writer, under one mutex.
struct Pipeline {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<LineChunk> to_tokenize;
  std::map<int64_t, TokenizedChunk> tokenized;
  int64_t chunks_read = 0;
  int64_t next_to_write = 0;
  bool reading_done = false;
  bool stop = false;
  std::exception_ptr error;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = e;
    stop = true;
    changed.notify_all();
  }
};

void read_chunks(std::ifstream& in, Pipeline& pipe, int64_t max_in_flight) {
  int64_t line_number = 0;
  bool eof = false;
  while (!eof) {
    LineChunk chunk;
    chunk.first_line = line_number + 1;
    std::string line;
    while (chunk.lines.size() < kChunkLines && size_t(chunk.bytes) < kChunkBytes) {
      if (!std::getline(in, line)) {
        eof = true;
        break;
      }
      ++line_number;
      chunk.bytes += int64_t(line.size()) + 1;
      chunk.lines.push_back(std::move(line));
    }
    MEGATRON_CHECK(!in.bad(), "reading the input failed near line " << line_number);
    std::unique_lock<std::mutex> lock(pipe.mutex);
    // Bound memory: at most max_in_flight chunks between reading and writing.
    pipe.changed.wait(lock, [&] { return pipe.stop || pipe.chunks_read - pipe.next_to_write < max_in_flight; });
    if (pipe.stop) return;
    if (!chunk.lines.empty()) {
      chunk.index = pipe.chunks_read++;
      pipe.to_tokenize.push_back(std::move(chunk));
    }
    if (eof) pipe.reading_done = true;
    pipe.changed.notify_all();
  }
}

void tokenize_chunks(Pipeline& pipe, const PreprocessOptions& options, const Tokenizer& tokenizer) {
  while (true) {
    LineChunk chunk;
    {
      std::unique_lock<std::mutex> lock(pipe.mutex);
      pipe.changed.wait(lock, [&] { return pipe.stop || !pipe.to_tokenize.empty() || pipe.reading_done; });
      if (pipe.stop || pipe.to_tokenize.empty()) return;
      chunk = std::move(pipe.to_tokenize.front());
      pipe.to_tokenize.pop_front();
    }
    TokenizedChunk out;
    out.first_line = chunk.first_line;
    out.bytes = chunk.bytes;
    out.lines.reserve(chunk.lines.size());
    for (const std::string& line : chunk.lines) out.lines.push_back(tokenize_line(line, options, tokenizer));
    std::lock_guard<std::mutex> lock(pipe.mutex);
    pipe.tokenized.emplace(chunk.index, std::move(out));
    pipe.changed.notify_all();
  }
}

// Starts the reader and tokenizer threads; stops and joins them however the writer leaves.
class Workers {
 public:
  Workers(Pipeline& pipe, std::ifstream& in, const PreprocessOptions& options, const Tokenizer& tokenizer)
      : pipe_(pipe) {
    const int64_t max_in_flight = 4 * options.workers;
    threads_.emplace_back([&pipe, &in, max_in_flight] {
      try {
        read_chunks(in, pipe, max_in_flight);
      } catch (...) {
        pipe.fail(std::current_exception());
      }
    });
    for (int64_t w = 0; w < options.workers; ++w) {
      threads_.emplace_back([&pipe, &options, &tokenizer] {
        try {
          tokenize_chunks(pipe, options, tokenizer);
        } catch (...) {
          pipe.fail(std::current_exception());
        }
      });
    }
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(pipe_.mutex);
      pipe_.stop = true;
      pipe_.changed.notify_all();
    }
    for (std::thread& t : threads_) t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

 private:
  Pipeline& pipe_;
  std::vector<std::thread> threads_;
};

// Prints documents, throughput and ETA about once a second.
class Progress {
 public:
  Progress(std::ostream& log, int64_t total_bytes) : log_(log), total_bytes_(total_bytes) {}
  void maybe_print(int64_t documents, int64_t bytes_done) {
    const auto now = Clock::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double mb_per_s = double(bytes_done) / 1e6 / std::max(seconds, 1e-9);
    std::ostringstream line;
    line << std::fixed << std::setprecision(1) << "preprocess-data: " << documents << " documents, " << mb_per_s
         << " MB/s";
    if (total_bytes_ > 0 && bytes_done > 0) {
      const double eta = seconds * double(std::max<int64_t>(total_bytes_ - bytes_done, 0)) / double(bytes_done);
      line << ", " << 100.0 * double(bytes_done) / double(total_bytes_) << "% of " << double(total_bytes_) / 1e6
           << " MB, ETA " << std::setprecision(0) << eta << " s";
    }
    log_ << line.str() << std::endl;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& log_;
  int64_t total_bytes_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = Clock::now();
};

int64_t regular_file_size(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;  // a pipe: no ETA
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : int64_t(size);
}

// Writes one tokenized chunk in line order and counts what it held.
void write_chunk(const TokenizedChunk& chunk, const std::string& input,
                 std::vector<std::unique_ptr<IndexedDatasetBuilder>>& builders, PreprocessReport& report,
                 std::ostream& log) {
  for (size_t k = 0; k < chunk.lines.size(); ++k) {
    const TokenizedLine& line = chunk.lines[k];
    if (line.blank) {
      ++report.blank_lines;
      continue;
    }
    ++report.lines;
    if (!line.error.empty()) {
      ++report.bad_lines;
      if (report.bad_lines <= kMaxReportedBadLines) {
        log << input << ":" << chunk.first_line + int64_t(k) << ": " << line.error << "; line skipped" << std::endl;
      }
      if (report.bad_lines == kMaxReportedBadLines) log << "further bad lines are counted but not shown" << std::endl;
      continue;
    }
    for (size_t key = 0; key < builders.size(); ++key) {
      builders[key]->add_document(line.docs[key]);
      report.tokens += int64_t(line.docs[key].size());
      report.tokens_per_key[key] += int64_t(line.docs[key].size());
    }
    ++report.documents;
  }
}

}  // namespace

PreprocessReport preprocess_data(const PreprocessOptions& options, std::ostream& log) {
  if (const std::vector<std::string> problems = validate(options); !problems.empty()) flags::throw_problems(problems);
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(TokenizerOptions{
      options.tokenizer_type, options.vocab_size, options.tokenizer_model, options.vocab_file, options.merge_file,
      options.tiktoken_pattern, options.tiktoken_num_special_tokens, options.special_tokens});
  std::error_code ec;
  MEGATRON_CHECK(!std::filesystem::is_directory(options.input, ec),
                 "--input " << options.input << " is a directory; give a .jsonl file");
  std::ifstream in(options.input, std::ios::binary);
  MEGATRON_CHECK(in.is_open(), "cannot open --input " << options.input << "; check the path");

  PreprocessReport report;
  const IndexDType dtype = optimal_index_dtype(tokenizer->vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : options.json_keys) {
    report.output_prefixes.push_back(preprocess_output_prefix(options.output_prefix, key));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(report.output_prefixes.back(), dtype));
  }
  report.tokens_per_key.assign(options.json_keys.size(), 0);

  Pipeline pipe;
  Progress progress(log, regular_file_size(options.input));
  int64_t bytes_done = 0;
  {
    Workers workers(pipe, in, options, *tokenizer);
    while (true) {
      TokenizedChunk chunk;
      {
        std::unique_lock<std::mutex> lock(pipe.mutex);
        // Wake at least every 100 ms so progress prints while a slow chunk is tokenized.
        pipe.changed.wait_for(lock, std::chrono::milliseconds(100), [&] {
          return pipe.stop || pipe.tokenized.count(pipe.next_to_write) > 0 ||
                 (pipe.reading_done && pipe.next_to_write == pipe.chunks_read);
        });
        if (pipe.error) std::rethrow_exception(pipe.error);
        if (pipe.reading_done && pipe.next_to_write == pipe.chunks_read) break;
        const auto it = pipe.tokenized.find(pipe.next_to_write);
        if (it != pipe.tokenized.end()) {
          chunk = std::move(it->second);
          pipe.tokenized.erase(it);
          ++pipe.next_to_write;
          pipe.changed.notify_all();
        }
      }
      write_chunk(chunk, options.input, builders, report, log);
      bytes_done += chunk.bytes;
      progress.maybe_print(report.documents, bytes_done);
    }
  }

  const double allowed = options.max_bad_lines_fraction * double(report.lines);
  MEGATRON_CHECK(double(report.bad_lines) <= allowed,
                 report.bad_lines << " of " << report.lines << " lines of " << options.input
                                  << " are malformed, more than --max-bad-lines-fraction "
                                  << options.max_bad_lines_fraction
                                  << " allows; fix the input (bad lines are listed above) or raise the fraction; "
                                  << "nothing was written");
  for (size_t key = 0; key < builders.size(); ++key) {
    MEGATRON_CHECK(report.tokens_per_key[key] > 0,
                   "--input " << options.input << " yields no tokens for JSON key '" << options.json_keys[key] << "' ("
                              << report.documents << " documents, none with a token; " << report.blank_lines
                              << " blank and " << report.bad_lines << " malformed lines skipped): training could "
                              << "draw no sample from it; check the file and --json-keys; nothing was written");
  }
  for (auto& builder : builders) builder->finalize();
  return report;
}

}  // namespace megatron::datasets
