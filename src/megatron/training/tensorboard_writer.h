#pragma once
// TensorBoard event files of scalars (reference/interop-formats.md section 6), written without
// TensorFlow: events.out.tfevents.<unix seconds>.<host>.<pid> in the given directory, a TFRecord
// stream (length, masked CRC-32C of the length, serialized Event, masked CRC-32C of it) whose first
// Event carries file_version "brain.Event:2" and each further one a Summary with one simple_value.
// Scalars are queued and written in whole records when the queue holds `queue_size` of them (as
// Megatron's SummaryWriter(max_queue=--tensorboard-queue-size)), when 120 s have passed since the
// last write (TensorBoard's flush_secs), and at destruction, so a reader never sees half a record.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace megatron {

class TensorBoardWriter {
 public:
  TensorBoardWriter(const std::string& directory, int64_t queue_size);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }
  // Queues Event{wall_time now, step, summary{value{tag, simple_value = float(value)}}}.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();

 private:
  void append_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t queue_size_;
  int64_t queued_ = 0;
  std::string pending_;  // framed records not yet written
  std::chrono::steady_clock::time_point last_flush_;
};

// The framing and encoding, for tests against the reference's worked bytes.
namespace tensorboard {
uint32_t masked_crc32c(const std::string& bytes);
std::string frame_record(const std::string& data);
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
}  // namespace tensorboard

}  // namespace megatron
