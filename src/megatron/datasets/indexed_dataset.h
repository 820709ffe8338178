#pragma once
// Megatron's indexed dataset: token ids in `<prefix>.bin`, their layout in `<prefix>.idx`.
// Byte-compatible with megatron/core/datasets/indexed_dataset.py (reference/megatron-compat.md
// section 1): files written here load in Megatron-LM and Megatron's files load here.
//
// .idx (little-endian, unpadded): magic "MMIDIDX\0\0", u64 version 1, u8 dtype code,
// u64 sequence count N, u64 document count D (= documents + 1), i32 lengths[N],
// i64 byte pointers[N] into .bin, i64 document_indices[D] = [0, ..., N].
// .bin: every sequence's ids in the index dtype, back to back.
//
// A document is a run of sequences (one per sentence with sentence splitting, else one).
// GPT training reads sequences and ignores the document boundaries, like Megatron.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace megatron::datasets {

// Token dtype with Megatron's on-disk codes (the u8 written at .idx offset 17).
enum class IndexDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

size_t index_dtype_size(IndexDType dtype);
const char* index_dtype_name(IndexDType dtype);
// Megatron preprocessing's rule: uint16 when vocab_size < 65500, else int32.
IndexDType optimal_index_dtype(int64_t vocab_size);

std::string idx_file_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_file_path(const std::string& prefix);  // prefix + ".bin"

// Streams documents into `<prefix>.bin.tmp`; finalize() writes `<prefix>.idx.tmp`, syncs both
// and renames them to their final names, so a crash never leaves a partial file under a
// final name. Destroying an unfinalized builder removes its temporary files.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, IndexDType token_dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // One document made of sequences with the given lengths (they must sum to ids.size()).
  // Empty sentence_lengths means one sequence holding the whole document, or none when the
  // document is empty: an empty document still adds a boundary, as in Megatron.
  void add_document(const std::vector<int32_t>& ids, const std::vector<int64_t>& sentence_lengths = {});
  void finalize();

  int64_t num_sequences() const { return int64_t(sequence_lengths_.size()); }
  int64_t num_documents() const { return int64_t(document_indices_.size()) - 1; }

 private:
  std::string prefix_;
  IndexDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_indices_{0};
  std::vector<unsigned char> encoded_;  // reused conversion buffer
  bool finalized_ = false;
};

// A validated, memory-mapped dataset. Copies share the mappings (cheap, thread-safe reads).
class IndexedDataset {
 public:
  // Maps `<prefix>.idx` and `<prefix>.bin` and checks every header field, the file sizes, the
  // document indices and that every sequence lies inside .bin; throws Error naming the file
  // and the fault otherwise.
  static IndexedDataset open(const std::string& prefix);

  const std::string& prefix() const;
  IndexDType token_dtype() const;
  int64_t num_sequences() const;
  int64_t num_documents() const;
  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // byte offset in .bin
  std::vector<int32_t> sequence_lengths() const;
  std::vector<int64_t> document_indices() const;  // [0, ..., N], num_documents() + 1 entries
  // Tokens [offset, offset + length) of sequence i (length -1: to the end), widened to int32.
  std::vector<int32_t> get(int64_t i, int64_t offset = 0, int64_t length = -1) const;
  // The same into caller memory (out holds `length` ids); the allocation-free form.
  void read(int64_t i, int64_t offset, int64_t length, int32_t* out) const;

  struct Impl;

 private:
  explicit IndexedDataset(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace megatron::datasets
