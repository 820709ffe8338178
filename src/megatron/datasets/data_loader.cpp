#include "megatron/datasets/data_loader.h"

#include "megatron/core/error.h"

namespace megatron::datasets {

DataLoader::DataLoader(const SampleSource& source, DataLoaderOptions options)
    : source_(source), options_(std::move(options)), consumed_samples_(options_.consumed_samples) {
  const int64_t mbs = options_.micro_batch_size, dp = options_.data_parallel_size;
  MEGATRON_CHECK(mbs >= 1, "--micro-batch-size " << mbs << " must be at least 1");
  MEGATRON_CHECK(dp >= 1, "data-parallel size " << dp << " must be at least 1");
  MEGATRON_CHECK(options_.data_parallel_rank >= 0 && options_.data_parallel_rank < dp,
                 "data-parallel rank " << options_.data_parallel_rank << " must lie in [0, " << dp << ")");
  MEGATRON_CHECK(options_.prefetch >= 0, "prefetch depth " << options_.prefetch << " must be non-negative");
  MEGATRON_CHECK(options_.consumed_samples >= 0 && options_.consumed_samples <= source_.size(),
                 "consumed samples " << options_.consumed_samples << " exceed the dataset's " << source_.size()
                                     << " samples; the checkpoint was trained on more data than this dataset holds: "
                                     << "build it for at least that many samples or check the data paths");
  num_chunks_ = (source_.size() - options_.consumed_samples) / (mbs * dp);
  if (options_.prefetch > 0) worker_ = std::thread([this] { work(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::vector<int64_t> DataLoader::chunk_indices(int64_t chunk) const {
  const int64_t mbs = options_.micro_batch_size;
  const int64_t first =
      options_.consumed_samples + chunk * mbs * options_.data_parallel_size + options_.data_parallel_rank * mbs;
  std::vector<int64_t> indices(static_cast<size_t>(mbs));
  for (int64_t i = 0; i < mbs; ++i) indices[size_t(i)] = first + i;
  return indices;
}

void DataLoader::work() {
  for (int64_t chunk = 0; chunk < num_chunks_; ++chunk) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || int64_t(ready_.size()) < options_.prefetch; });
      if (stopping_) return;
    }
    Item item;
    try {
      item.batch = make_batch(source_, chunk_indices(chunk), options_.batch);
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(item));
    }
    changed_.notify_all();
    if (failed) return;  // later batches are never asked for: next() rethrows this one
  }
}

std::optional<Batch> DataLoader::next() {
  if (delivered_ == num_chunks_) return std::nullopt;
  Item item;
  if (options_.prefetch == 0) {
    item.batch = make_batch(source_, chunk_indices(delivered_), options_.batch);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty(); });
    // A failure stays queued, so every later call rethrows it too.
    if (ready_.front().error) std::rethrow_exception(ready_.front().error);
    item = std::move(ready_.front());
    ready_.pop_front();
  }
  changed_.notify_all();
  ++delivered_;
  consumed_samples_ += options_.micro_batch_size * options_.data_parallel_size;
  return std::move(item.batch);
}

}  // namespace megatron::datasets
