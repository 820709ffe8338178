#include "megatron/training/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megatron/checkpointing/crc32c.h"
#include "megatron/core/error.h"

namespace megatron {

namespace tensorboard {
namespace {
// Protobuf wire format: a field's key is (number << 3) | wire type, as a varint.
enum WireType : uint8_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, WireType type) { put_varint(out, uint64_t(field) << 3 | type); }
template <class T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, length_delimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5.
// Summary: value = 1 (repeated); Summary.Value: tag = 1 (string), simple_value = 2 (float).
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
constexpr int kSummaryValue = 1, kTag = 1, kSimpleValue = 2;

std::string event_head(double wall_time) {
  std::string event;
  put_key(event, kWallTime, fixed64);
  put_little_endian(event, wall_time);
  return event;
}
}  // namespace

uint32_t masked_crc32c(const std::string& bytes) {
  const uint32_t crc = checkpointing::crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string frame_record(const std::string& data) {
  std::string length;
  put_little_endian(length, uint64_t(data.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record += data;
  put_little_endian(record, masked_crc32c(data));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event = event_head(wall_time);
  put_bytes(event, kFileVersion, "brain.Event:2");
  return event;
}

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, kTag, tag);
  put_key(summary_value, kSimpleValue, fixed32);
  put_little_endian(summary_value, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, summary_value);
  std::string event = event_head(wall_time);
  put_key(event, kStep, varint);
  put_varint(event, uint64_t(step));
  put_bytes(event, kSummary, summary);
  return event;
}
}  // namespace tensorboard

namespace {
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
constexpr std::chrono::seconds kFlushEvery{120};
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& directory, int64_t queue_size)
    : queue_size_(queue_size), last_flush_(std::chrono::steady_clock::now()) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  MEGATRON_CHECK(!ec, "cannot create --tensorboard-dir " << directory << ": " << ec.message()
                                                         << "; give a directory this process can write");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d", static_cast<long long>(wall_seconds()), host,
                int(getpid()));
  path_ = (std::filesystem::path(directory) / name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  MEGATRON_CHECK(file_ != nullptr, "cannot create the TensorBoard event file " << path_ << ": " << std::strerror(errno)
                                                                               << "; check --tensorboard-dir");
  append_record(tensorboard::file_version_event(wall_seconds()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const Error&) {
    // Destructors never throw; the error was the disk's, and the file keeps what was written.
  }
  std::fclose(file_);
}

void TensorBoardWriter::append_record(const std::string& event) { pending_ += tensorboard::frame_record(event); }

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  append_record(tensorboard::scalar_event(wall_seconds(), step, tag, float(value)));
  if (++queued_ >= queue_size_ || std::chrono::steady_clock::now() - last_flush_ >= kFlushEvery) flush();
}

void TensorBoardWriter::flush() {
  last_flush_ = std::chrono::steady_clock::now();
  queued_ = 0;
  if (pending_.empty()) return;
  const bool written = std::fwrite(pending_.data(), 1, pending_.size(), file_) == pending_.size();
  pending_.clear();
  MEGATRON_CHECK(written && std::fflush(file_) == 0,
                 "cannot write the TensorBoard event file " << path_ << ": " << std::strerror(errno));
}

}  // namespace megatron
