#pragma once
// The three indices of Megatron's GPTDataset (megatron-compat.md section 2), as pure functions:
//
//   document index  the split's documents (.idx *sequences*) repeated for E epochs, shuffled once
//                   across all epochs; with a separate final epoch, the first E-1 epochs and the
//                   last one are shuffled apart;
//   sample index    (total + 1) rows of (position in the document index, token offset): sample k
//                   reads the concatenated documents from row k through row k+1 inclusive, so
//                   consecutive samples overlap by one token (the extra token that makes S
//                   inputs and S labels out of S + 1 tokens). Row k is where token k*S of the
//                   stream lies, inside a non-empty document, except row 0, always (0, 0);
//   shuffle index   a permutation of the samples; with a separate final epoch the samples before
//                   the final epoch and those of it are shuffled apart.
//
// One NumpyRandomState(seed) is consumed in that order (document index, then shuffle index), so
// the results equal numpy's bit for bit. The arrays keep Megatron's dtypes (int32 document
// index; int32 or int64 sample index; uint32 or int64 shuffle index) so they can be written as
// the .npy files Megatron caches and mapped back without conversion.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/progress.h"
#include "megatron/datasets/numpy_random.h"

namespace megatron::datasets {

// Megatron's add_extra_token_to_sequence: always on for GPT pretraining (there is no flag).
inline constexpr int64_t kAddExtraToken = 1;

enum class IndexType : uint8_t { i16, i32, u32, i64 };
size_t index_type_size(IndexType type);
const char* index_type_name(IndexType type);  // "int16", "int32", "uint32", "int64"

// An integer array of one of numpy's index dtypes, rows x columns, row-major. It owns its
// values or views memory kept alive by an owner (a mapped .npy file); copies share it.
class IndexArray {
 public:
  IndexArray() = default;
  template <class T>
  explicit IndexArray(std::vector<T> values, int64_t columns = 1);
  IndexArray(std::shared_ptr<const void> owner, const void* data, IndexType type, int64_t rows, int64_t columns);

  IndexType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t columns() const { return columns_; }
  int64_t size() const { return rows_ * columns_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return size_t(size()) * index_type_size(type_); }
  int64_t operator[](int64_t flat_index) const;  // widened to int64
  int64_t at(int64_t row, int64_t column) const { return (*this)[row * columns_ + column]; }
  std::vector<int64_t> to_vector() const;

 private:
  std::shared_ptr<const void> owner_;
  const void* data_ = nullptr;
  IndexType type_ = IndexType::i64;
  int64_t rows_ = 0;
  int64_t columns_ = 1;
};

// How many epochs a split's documents are repeated and whether the final one is shuffled apart.
struct EpochPlan {
  int64_t tokens_per_epoch = 0;  // T
  int64_t num_epochs = 1;        // E: the least E with E*T >= num_samples*S + 1 (1 without num_samples)
  bool separate_final_epoch = false;
  int64_t samples_before_final_epoch = 0;  // ((E-1)*T - 1) / S, meaningful when separate
  int64_t total_samples = 0;               // (E*T - 1) / S: the dataset's length
};
// Megatron's rule: separate when the final epoch contributes fewer than int(0.80 * samples per
// epoch) of the requested samples. Throws when T <= 1 (Megatron asserts there).
EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length,
                      const std::string& what);

// The documents a GPTDataset draws from: ids [first, first + lengths.size()) of the low-level
// dataset with their token counts.
struct DocumentRange {
  int64_t first = 0;
  std::span<const int32_t> lengths;
  int64_t count() const { return int64_t(lengths.size()); }
  int64_t length(int64_t document) const { return lengths[size_t(document - first)]; }
};

// int32 array of E * count document ids, shuffled by rng as described at the top.
IndexArray build_document_index(const DocumentRange& documents, const EpochPlan& plan, NumpyRandomState& rng,
                                ProgressReporter* progress = nullptr);
// (total + 1, 2) array; int32 unless the document index has more than INT32_MAX entries.
IndexArray build_sample_index(const DocumentRange& documents, const IndexArray& document_index, int64_t seq_length,
                              const EpochPlan& plan, ProgressReporter* progress = nullptr);
// uint32 permutation of [0, total) (int64 from total >= 2^32 - 2 on, as numpy's rule gives).
IndexArray build_shuffle_index(const EpochPlan& plan, NumpyRandomState& rng, ProgressReporter* progress = nullptr);

// ---- template definitions -------------------------------------------------------------------

template <class T>
constexpr IndexType index_type_of() {
  if constexpr (std::is_same_v<T, int16_t>) return IndexType::i16;
  if constexpr (std::is_same_v<T, int32_t>) return IndexType::i32;
  if constexpr (std::is_same_v<T, uint32_t>) return IndexType::u32;
  if constexpr (std::is_same_v<T, int64_t>) return IndexType::i64;
}

template <class T>
IndexArray::IndexArray(std::vector<T> values, int64_t columns) {
  static_assert(std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t> ||
                    std::is_same_v<T, int64_t>,
                "IndexArray holds int16, int32, uint32 or int64");
  MEGATRON_CHECK(columns >= 1 && values.size() % size_t(columns) == 0,
                 "IndexArray: " << values.size() << " values do not make rows of " << columns << " columns");
  auto held = std::make_shared<const std::vector<T>>(std::move(values));
  data_ = held->data();
  type_ = index_type_of<T>();
  columns_ = columns;
  rows_ = int64_t(held->size()) / columns;
  owner_ = std::move(held);
}

}  // namespace megatron::datasets
