#pragma once
// The training data loader: this rank's micro-batches in Megatron's order, assembled ahead of
// time on a background thread.
//
// Order (Megatron's MegatronPretrainingSampler): from `consumed_samples` on, the dataset's
// indices are taken in chunks of micro_batch_size * DP; data-parallel rank r gets chunk
// positions [r * mbs, (r + 1) * mbs) of each chunk, and a final partial chunk is dropped. One
// chunk per call to next(), so `num_micro_batches` calls make one global batch, and resuming
// from a checkpoint's consumed-sample count continues with the very next sample.
//
// A worker thread keeps up to `prefetch` micro-batches ready; an exception it meets is
// rethrown by the next() that would have returned the failed batch (batches before it are
// delivered first). Destruction stops and joins the thread.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "megatron/datasets/gpt_dataset.h"

namespace megatron::datasets {

struct DataLoaderOptions {
  int64_t micro_batch_size = 1;
  int64_t data_parallel_size = 1;
  int64_t data_parallel_rank = 0;
  int64_t consumed_samples = 0;  // global samples already trained on (from the checkpoint)
  int64_t prefetch = 2;          // micro-batches prepared ahead; 0 assembles each in next()
  BatchOptions batch;
};

class DataLoader {
 public:
  // `source` must outlive the loader. Throws if consumed_samples exceeds source.size() (a run
  // resumed on less data than it was trained on) or an option is out of range.
  DataLoader(const SampleSource& source, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's next micro-batch, or nullopt once fewer than micro_batch_size * DP samples
  // remain. Rethrows an error the worker met.
  std::optional<Batch> next();
  // Global samples covered by the micro-batches next() has returned, plus the starting count.
  int64_t consumed_samples() const { return consumed_samples_; }
  // How many micro-batches the loader yields in all, from the starting count.
  int64_t num_micro_batches() const { return num_chunks_; }

 private:
  std::vector<int64_t> chunk_indices(int64_t chunk) const;
  void work();

  const SampleSource& source_;
  DataLoaderOptions options_;
  int64_t num_chunks_ = 0;
  int64_t delivered_ = 0;
  int64_t consumed_samples_ = 0;

  struct Item {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> ready_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace megatron::datasets
