#pragma once
// GPT training samples: fixed-length windows over a token stream, and the batches built from
// them.
//
// This is the simple pipeline of the Foundation issue, not yet Megatron's GPTDataset
// algorithm: the split's sequences are concatenated in file order into one stream of T tokens,
// sample k is stream[k*S, k*S + S + 1) (consecutive samples overlap by one token, as in
// Megatron), the floor((T - 1) / S) samples of an epoch are shuffled once with HostRng(seed),
// and that order repeats for as many epochs as num_samples needs. Megatron's document-level
// shuffle across epochs (megatron-compat.md section 2) arrives with the data pipeline issue as
// another SampleSource; split parsing below already follows Megatron exactly.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/datasets/indexed_dataset.h"

namespace megatron::datasets {

enum class Split : int { train = 0, valid = 1, test = 2 };
const char* split_name(Split split);  // "train", "valid", "test" (Megatron's cache-file names)

// Megatron's split matrix: for each split the fraction range [lo, hi) of the sequences, or
// nullopt where its weight is zero (that split is not built). `--split "969,30,1"`: numbers are
// the runs of [.0-9] (any separator works), padded with zeros to three, normalised by their
// sum in float64 and accumulated left to right.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split(const std::string& split);

// Sequences [begin, end) of a dataset. Like Megatron's GPTDataset, samples are drawn from
// .idx *sequences*; document boundaries are ignored.
struct SequenceRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const SequenceRange&) const = default;
};
// Megatron's rule: begin = round(lo * N), end = round(hi * N), rounding half to even.
std::optional<SequenceRange> split_range(const SplitMatrix& matrix, Split split, int64_t num_sequences);

struct Sample {
  std::vector<int32_t> tokens;  // seq_length + 1 ids: inputs are tokens[:-1], labels tokens[1:]
};

// Anything training can draw samples from by index (GPT datasets now; blends later).
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;  // index in [0, size()); thread-safe
};

// Samples cut from the concatenation of a list of documents (the scheme described at the top).
// Subclasses supply the documents' lengths and contents.
class ConcatenatedSamples : public SampleSource {
 public:
  int64_t size() const override { return num_epochs_ * samples_per_epoch(); }
  Sample get(int64_t index) const override;

  int64_t seq_length() const { return seq_length_; }
  int64_t tokens_per_epoch() const { return starts_.back(); }
  int64_t samples_per_epoch() const { return int64_t(order_.size()); }
  int64_t num_epochs() const { return num_epochs_; }

 protected:
  // num_samples: the least number of samples wanted (0: one epoch). `what` names the data in
  // errors, e.g. "split train of data/foo_text_document".
  ConcatenatedSamples(const std::vector<int64_t>& document_lengths, int64_t seq_length, uint64_t seed,
                      int64_t num_samples, const std::string& what);
  // Writes tokens [offset, offset + length) of document `document` to out.
  virtual void read_document(int64_t document, int64_t offset, int64_t length, int32_t* out) const = 0;
  int64_t document_length(int64_t document) const { return starts_[size_t(document) + 1] - starts_[size_t(document)]; }

 private:
  std::vector<int64_t> starts_;  // stream position of each document's first token; back() = T
  std::vector<int64_t> order_;   // the shuffled sample order of one epoch
  int64_t seq_length_ = 0;
  int64_t num_epochs_ = 1;
};

// Samples from sequences `range` of an indexed dataset.
class GPTDataset final : public ConcatenatedSamples {
 public:
  GPTDataset(IndexedDataset data, SequenceRange range, int64_t seq_length, uint64_t seed, int64_t num_samples);

 private:
  void read_document(int64_t document, int64_t offset, int64_t length, int32_t* out) const override;
  IndexedDataset data_;
  SequenceRange range_;
};

// Synthetic data shaped like Megatron's --mock-data: 100,000 documents, split "1,1,1"; document
// i of length L is [1, 2, ..., L-1] (mod vocab_size) followed by EOD = vocab_size - 1 (the
// NullTokenizer's EOD). Lengths in [1, 4095] come from HostRng(0) where Megatron draws them from
// numpy's PCG64 (default_rng(0)); exact mock parity is left to the data pipeline issue.
class MockGPTDataset final : public ConcatenatedSamples {
 public:
  static constexpr int64_t kNumDocuments = 100000;
  static constexpr int64_t kMaxDocumentLength = 4095;

  MockGPTDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed, int64_t num_samples,
                 Split split = Split::train);

 private:
  void read_document(int64_t document, int64_t offset, int64_t length, int32_t* out) const override;
  int64_t vocab_size_;
};

// The dataset of split `split_index` (0 train, 1 valid, 2 test) of `data_path` (Megatron's
// --data-path list; one prefix without a weight for now). Returns nullptr when that split has
// zero weight in `split`, as Megatron then builds no dataset. Throws on blends, missing files
// and splits too small for one sample.
std::unique_ptr<SampleSource> build_split_dataset(const std::vector<std::string>& data_path, const std::string& split,
                                                  int split_index, int64_t seq_length, uint64_t seed,
                                                  int64_t num_samples);

struct Batch {
  Tensor tokens;     // (B,S) i32: sample[:-1]
  Tensor labels;     // (B,S) i32: sample[1:]
  Tensor loss_mask;  // (B,S) f32: 1, or 0 where the input token is EOD with eod_mask_loss
};

// Stacks the samples at `sample_indices` (one row each). As in Megatron, --eod-mask-loss zeroes
// the loss of positions whose *input* token is EOD: predicting EOD is trained, predicting the
// next document's first token from it is not.
Batch make_batch(const SampleSource& source, const std::vector<int64_t>& sample_indices, int32_t eod,
                 bool eod_mask_loss);

}  // namespace megatron::datasets
