#pragma once
// Megatron's GPTDataset (megatron-compat.md section 2): the same samples in the same order as
// Megatron-LM for the same files, split, seed, sequence length and sample count.
//
// A GPTDataset reads one split (a range of .idx *sequences*, which it treats as documents; the
// .idx document boundaries are ignored as in Megatron) and builds three indices
// (gpt_dataset_indices.h): the documents over E epochs shuffled once across epochs, the sample
// boundaries in that stream, and a shuffle of the samples. Its length is every sample of the E
// epochs, usually more than the number asked for. The indices are cached on disk in Megatron's
// format (dataset_cache.h). MockGPTDataset is the same algorithm over Megatron's synthetic
// documents (section 3).
#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/datasets/gpt_dataset_indices.h"
#include "megatron/datasets/indexed_dataset.h"

namespace megatron::datasets {

enum class Split : int { train = 0, valid = 1, test = 2 };
const char* split_name(Split split);  // "train", "valid", "test" (Megatron's Split names)

// Megatron's split matrix: for each split the fraction range [lo, hi) of the sequences, or
// nullopt where its weight is zero (that split is not built). `--split "969,30,1"`: numbers are
// the runs of [.0-9] (any separator works), padded with zeros to three, normalised by their
// sum in float64 and accumulated left to right.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split(const std::string& split);
// The matrix as Megatron writes it in a dataset description: [[0, 0.969], [0.969, 0.999], ...],
// null for unbuilt splits; the very first bound is the integer 0, as Python's running sum
// starts from int 0.
nlohmann::ordered_json split_matrix_json(const SplitMatrix& matrix);

// Sequences [begin, end) of a dataset.
struct SequenceRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const SequenceRange&) const = default;
};
// Megatron's rule: begin = round(lo * N), end = round(hi * N), rounding half to even.
std::optional<SequenceRange> split_range(const SplitMatrix& matrix, Split split, int64_t num_sequences);

// Fixed-length token samples by index: GPT datasets and blends of them.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t sample_length() const = 0;  // ids per sample: seq_length + 1 (inputs, then one more label)
  // Writes sample `index` (in [0, size())) as sample_length() ids. Thread-safe.
  virtual void read(int64_t index, int32_t* out) const = 0;
  std::vector<int32_t> get(int64_t index) const;  // read() into a new vector
};

// The token sequences a GPT dataset draws its documents from (Megatron's low-level dataset).
class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  virtual int64_t num_sequences() const = 0;
  virtual int32_t sequence_length(int64_t i) const = 0;
  // Tokens [offset, offset + length) of sequence i. Thread-safe.
  virtual void read(int64_t i, int64_t offset, int64_t length, int32_t* out) const = 0;
  virtual std::optional<std::string> path() const = 0;  // the data prefix; nullopt for mock data
  virtual std::string dataset_class() const = 0;        // "GPTDataset" or "MockGPTDataset"
};

// The sequences of `<prefix>.bin/.idx`.
std::shared_ptr<const SequenceSource> open_indexed_sequences(const std::string& prefix);

// Megatron's mock documents: 100,000 of them, lengths numpy.random.default_rng(0).integers(1,
// 4096) (so in [1, 4095]); document i of length L holds (1, 2, ..., L-1) mod vocab_size, then
// eod.
inline constexpr int64_t kMockNumDocuments = 100000;
std::shared_ptr<const SequenceSource> mock_sequences(int64_t vocab_size, int32_t eod);

// What, besides the data and the split's range, decides a GPTDataset's indices, and what its
// cached description records.
struct GPTDatasetConfig {
  int64_t seq_length = 0;
  int64_t seed = 1234;  // --seed: the dataset's RandomState seed (not offset per rank)
  // The --split string the range came from; nullopt when each split has its own paths (the
  // description then records null for the split and its matrix).
  std::optional<std::string> split;
  // --data-cache-path. Empty: Megatron's default <prefix>/cache/GPTDataset_indices for files,
  // no cache for mock data.
  std::string cache_path;
  // The tokenizer's identifiers (Megatron's tokenizer.unique_identifiers), recorded in the
  // description, so the cache is keyed on the tokenizer too; null if unknown.
  nlohmann::ordered_json tokenizer;
};

class GPTDataset final : public SampleSource {
 public:
  // Builds the indices over sequences `range` of `data` for `split`, or maps them from the
  // cache. num_samples is the least number of samples wanted (nullopt: one epoch).
  GPTDataset(std::shared_ptr<const SequenceSource> data, SequenceRange range, Split split,
             std::optional<int64_t> num_samples, const GPTDatasetConfig& config);

  int64_t size() const override { return plan_.total_samples; }
  int64_t sample_length() const override { return seq_length_ + 1; }
  void read(int64_t index, int32_t* out) const override;

  // Megatron's unique_identifiers: class, dataset_path, num_samples, index_split, random_seed,
  // sequence_length, split, split_matrix, tokenizer (in that order).
  const nlohmann::ordered_json& identifiers() const { return identifiers_; }
  const EpochPlan& plan() const { return plan_; }
  const IndexArray& document_index() const { return document_index_; }
  const IndexArray& sample_index() const { return sample_index_; }
  const IndexArray& shuffle_index() const { return shuffle_index_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  void build(const std::string& what);
  // Empty when the arrays fit this dataset; else what is wrong (a damaged cache).
  std::string check_indices() const;

  std::shared_ptr<const SequenceSource> data_;
  SequenceRange range_;
  int64_t seq_length_ = 0;
  int64_t seed_ = 0;
  std::vector<int32_t> lengths_;  // of sequences [range.begin, range.end)
  DocumentRange documents_;
  EpochPlan plan_;
  nlohmann::ordered_json identifiers_;
  IndexArray document_index_, sample_index_, shuffle_index_;
  bool loaded_from_cache_ = false;
};

// ---- batches --------------------------------------------------------------------------------

// Megatron's per-sample masks and positions (megatron-compat.md section 2.4, step 4-5).
struct BatchOptions {
  int32_t eod = -1;                   // the tokenizer's end-of-document id
  bool eod_mask_loss = false;         // --eod-mask-loss
  bool reset_position_ids = false;    // --reset-position-ids
  bool reset_attention_mask = false;  // --reset-attention-mask
  // Megatron's tokenizer.pad (-1 when the tokenizer has none): labels equal to it are not
  // trained and both tokens and labels equal to it are replaced by 0.
  int32_t pad = -1;
};

struct Batch {
  Tensor tokens;     // (B,S) i32: sample[:-1]
  Tensor labels;     // (B,S) i32: sample[1:]
  Tensor loss_mask;  // (B,S) f32: 1; 0 where the input is EOD (eod_mask_loss) or the label is pad
  // (B,S) i32: 0..S-1, or with reset_position_ids restarting at 0 after each EOD input.
  Tensor position_ids;
  // (B,S) i32, only with reset_attention_mask (else undefined): the document each position
  // belongs to, counting the EOD inputs before it. Megatron's block-diagonal causal mask lets
  // position t attend to s exactly when s <= t and segment_ids[s] == segment_ids[t]; attention
  // takes them as AttentionParams::segment_ids.
  Tensor segment_ids;
};

// Stacks the samples at `sample_indices` (one row each) and derives masks and positions as
// Megatron's GPTDataset.__getitem__ does. The tensors are ordinary (pageable) host memory, also
// for GPU runs: pinning needs cudaHostAlloc and cudaFreeHost, which wait for the whole device
// (every collective and receive in flight, while the loader's worker runs beside a step and at each
// batch's release); their copies are a few hundred KiB per micro-batch.
Batch make_batch(const SampleSource& source, std::span<const int64_t> sample_indices, const BatchOptions& options);

// ---- transitional entry points ----------------------------------------------------------------
// The calls training.cpp makes today, kept until it moves to build_gpt_dataset
// (blended_dataset.h) and DataLoader (data_loader.h); delete them then.

// Mock data with EOD = vocab_size - 1, as a SampleSource.
class MockGPTDataset final : public SampleSource {
 public:
  MockGPTDataset(int64_t vocab_size, int64_t seq_length, int64_t seed, int64_t num_samples, Split split = Split::train);
  int64_t size() const override { return dataset_->size(); }
  int64_t sample_length() const override { return dataset_->sample_length(); }
  void read(int64_t index, int32_t* out) const override { dataset_->read(index, out); }

 private:
  std::unique_ptr<GPTDataset> dataset_;
};
// build_gpt_dataset for --data-path/--split (defined in blended_dataset.cpp).
std::unique_ptr<SampleSource> build_split_dataset(const std::vector<std::string>& data_path, const std::string& split,
                                                  int split_index, int64_t seq_length, int64_t seed,
                                                  int64_t num_samples);
Batch make_batch(const SampleSource& source, const std::vector<int64_t>& sample_indices, int32_t eod,
                 bool eod_mask_loss);

}  // namespace megatron::datasets
