#include "megatron/datasets/gpt_dataset_indices.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "megatron/core/logging.h"

namespace megatron::datasets {

size_t index_type_size(IndexType type) {
  switch (type) {
    case IndexType::i16:
      return 2;
    case IndexType::i32:
    case IndexType::u32:
      return 4;
    case IndexType::i64:
      return 8;
  }
  return 0;
}

const char* index_type_name(IndexType type) {
  switch (type) {
    case IndexType::i16:
      return "int16";
    case IndexType::i32:
      return "int32";
    case IndexType::u32:
      return "uint32";
    case IndexType::i64:
      return "int64";
  }
  return "unknown";
}

// ---- IndexArray -----------------------------------------------------------------------------

IndexArray::IndexArray(std::shared_ptr<const void> owner, const void* data, IndexType type, int64_t rows,
                       int64_t columns)
    : owner_(std::move(owner)), data_(data), type_(type), rows_(rows), columns_(columns) {
  MEGATRON_CHECK(rows >= 0 && columns >= 1, "IndexArray: bad shape (" << rows << ", " << columns << ")");
}

int64_t IndexArray::operator[](int64_t flat_index) const {
  switch (type_) {
    case IndexType::i16:
      return static_cast<const int16_t*>(data_)[flat_index];
    case IndexType::i32:
      return static_cast<const int32_t*>(data_)[flat_index];
    case IndexType::u32:
      return static_cast<const uint32_t*>(data_)[flat_index];
    case IndexType::i64:
      return static_cast<const int64_t*>(data_)[flat_index];
  }
  return 0;
}

std::vector<int64_t> IndexArray::to_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) out[size_t(i)] = (*this)[i];
  return out;
}

// ---- epochs ---------------------------------------------------------------------------------

EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length,
                      const std::string& what) {
  MEGATRON_CHECK(seq_length >= 1, "--seq-length must be at least 1, got " << seq_length);
  MEGATRON_CHECK(!num_samples || *num_samples >= 0,
                 "requested sample count " << *num_samples << " for " << what << " must be non-negative");
  // Megatron's index helper asserts tokens_per_epoch > 1; say what to do instead of aborting.
  MEGATRON_CHECK(tokens_per_epoch > 1, what << " holds " << tokens_per_epoch
                                            << " tokens, but a GPT dataset needs at least 2; give this split more "
                                            << "sequences (--split) or use more data");
  EpochPlan plan;
  plan.tokens_per_epoch = tokens_per_epoch;
  if (num_samples) {
    const int64_t wanted_tokens = *num_samples * seq_length + kAddExtraToken;
    plan.num_epochs = std::max<int64_t>(1, (wanted_tokens + tokens_per_epoch - 1) / tokens_per_epoch);
  }
  plan.total_samples = (plan.num_epochs * tokens_per_epoch - kAddExtraToken) / seq_length;
  if (plan.num_epochs > 1) {
    plan.samples_before_final_epoch = ((plan.num_epochs - 1) * tokens_per_epoch - kAddExtraToken) / seq_length;
    const int64_t from_final_epoch = *num_samples - plan.samples_before_final_epoch;
    const int64_t per_epoch = (tokens_per_epoch - kAddExtraToken) / seq_length;
    // Python's int(0.80 * per_epoch): a float64 product truncated toward zero.
    plan.separate_final_epoch = from_final_epoch < int64_t(0.80 * double(per_epoch));
  }
  return plan;
}

// ---- the three indices ----------------------------------------------------------------------

IndexArray build_document_index(const DocumentRange& documents, const EpochPlan& plan, NumpyRandomState& rng,
                                ProgressReporter* progress) {
  const int64_t n = documents.count();
  MEGATRON_CHECK(documents.first >= 0 && documents.first + n - 1 <= std::numeric_limits<int32_t>::max(),
                 "document ids [" << documents.first << ", " << documents.first + n
                                  << ") do not fit the int32 document index Megatron uses");
  std::vector<int32_t> index(static_cast<size_t>(plan.num_epochs * n));
  for (int64_t epoch = 0; epoch < plan.num_epochs; ++epoch) {
    std::iota(index.begin() + epoch * n, index.begin() + (epoch + 1) * n, int32_t(documents.first));
  }
  int64_t reported = 0;
  auto tick = [&](int64_t done) {
    if (progress) progress->advance(done - reported);
    reported = done;
  };
  const std::span<int32_t> all(index);
  if (plan.separate_final_epoch) {
    rng.shuffle(all.first(size_t((plan.num_epochs - 1) * n)), tick);
    reported = 0;
    rng.shuffle(all.last(size_t(n)), tick);
  } else {
    rng.shuffle(all, tick);
  }
  return IndexArray(std::move(index));
}

namespace {

// Walks the documents in document-index order, S + 1 tokens per sample; each sample starts at
// the last token of the previous one. Row k = (document position, offset) of sample k's first
// token; a sample ending exactly at a document's end leaves the next one starting on that
// document's last token, so offsets always lie inside their document.
template <class T>
std::vector<T> walk_samples(const DocumentRange& documents, const IndexArray& document_index, int64_t seq_length,
                            int64_t total_samples, ProgressReporter* progress) {
  std::vector<T> rows(static_cast<size_t>(2 * (total_samples + 1)));
  int64_t position = 0;  // in the document index
  int64_t offset = 0;    // token offset inside that document
  rows[0] = 0;
  rows[1] = 0;
  for (int64_t sample = 1; sample <= total_samples; ++sample) {
    int64_t remaining = seq_length + kAddExtraToken;
    while (remaining != 0) {
      const int64_t available = documents.length(document_index[position]) - offset;
      remaining -= available;
      if (remaining <= 0) {
        offset += available + remaining - kAddExtraToken;
        remaining = 0;
      } else {
        MEGATRON_CHECK(position + 1 < document_index.size(), "sample index: the document index ran out at sample "
                                                                 << sample << " of " << total_samples
                                                                 << "; the document lengths disagree with the plan");
        ++position;
        offset = 0;
      }
    }
    rows[size_t(2 * sample)] = T(position);
    rows[size_t(2 * sample + 1)] = T(offset);
    if (progress && (sample & ((int64_t(1) << 20) - 1)) == 0) progress->advance(int64_t(1) << 20);
  }
  return rows;
}

}  // namespace

IndexArray build_sample_index(const DocumentRange& documents, const IndexArray& document_index, int64_t seq_length,
                              const EpochPlan& plan, ProgressReporter* progress) {
  // Offsets are below a sequence length (an int32), so only the position can outgrow int32.
  if (document_index.size() <= std::numeric_limits<int32_t>::max()) {
    return IndexArray(walk_samples<int32_t>(documents, document_index, seq_length, plan.total_samples, progress), 2);
  }
  return IndexArray(walk_samples<int64_t>(documents, document_index, seq_length, plan.total_samples, progress), 2);
}

namespace {

template <class T>
IndexArray shuffled_samples(const EpochPlan& plan, NumpyRandomState& rng, ProgressReporter* progress) {
  std::vector<T> index(static_cast<size_t>(plan.total_samples));
  std::iota(index.begin(), index.end(), T(0));
  int64_t reported = 0;
  auto tick = [&](int64_t done) {
    if (progress) progress->advance(done - reported);
    reported = done;
  };
  const std::span<T> all(index);
  const int64_t first = plan.separate_final_epoch ? plan.samples_before_final_epoch : plan.total_samples;
  rng.shuffle(all.first(size_t(first)), tick);
  if (first < plan.total_samples) {
    reported = 0;
    rng.shuffle(all.subspan(size_t(first)), tick);
  }
  return IndexArray(std::move(index));
}

}  // namespace

IndexArray build_shuffle_index(const EpochPlan& plan, NumpyRandomState& rng, ProgressReporter* progress) {
  // numpy: uint32 unless total >= iinfo(uint32).max - 1.
  if (plan.total_samples < int64_t(std::numeric_limits<uint32_t>::max()) - 1) {
    return shuffled_samples<uint32_t>(plan, rng, progress);
  }
  return shuffled_samples<int64_t>(plan, rng, progress);
}

}  // namespace megatron::datasets
