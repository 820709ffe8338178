#include "megatron/checkpointing/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "megatron/checkpointing/crc32c.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"

namespace megatron::checkpointing {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail_os(const char* operation, const std::string& path) {
  const int err = errno;
  MEGATRON_FAIL(operation << " '" << path << "' failed: " << std::strerror(err)
                          << "; check that the directory exists, is writable and has free space");
}

// Owns a file descriptor so that every exit path closes it.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0) : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)) {
    if (fd_ < 0) fail_os("open", path);
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

void fsync_path(const std::string& path, int flags) {
  Fd fd(path, flags);
  // Some filesystems cannot sync directories and say so with EINVAL; there is nothing to do then.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) fail_os("fsync", path);
}

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string suffixed(const std::string& path, const char* kind) {
  return path + "." + kind + "." + std::to_string(::getpid());
}

std::string staging_path(const std::string& path) { return suffixed(path, "tmp"); }

// Makes renames and creations inside the directory durable.
void fsync_directory(const std::string& path) { fsync_path(path, O_RDONLY | O_DIRECTORY); }

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Reads `path` block by block, handing each block to `consume`.
template <class Consume>
void read_blocks(const std::string& path, Consume&& consume) {
  Fd fd(path, O_RDONLY);
  std::vector<char> buffer(size_t(1) << 20);
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_os("read", path);
    if (n == 0) return;
    consume(buffer.data(), size_t(n));
  }
}

}  // namespace

std::optional<std::string> staging_base_name(const std::string& filename) {
  const size_t last_dot = filename.rfind('.');
  if (last_dot == std::string::npos || last_dot < 5 || !is_digits(std::string_view(filename).substr(last_dot + 1)))
    return std::nullopt;
  const std::string_view kind = std::string_view(filename).substr(last_dot - 4, 5);
  if (kind != ".tmp." && kind != ".old.") return std::nullopt;
  return filename.substr(0, last_dot - 4);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), staging_(staging_path(path_)) {
  fd_ = ::open(staging_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_os("create", staging_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(staging_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t size) {
  MEGATRON_CHECK(fd_ >= 0, "write to '" << path_ << "' after commit");
  digest_.crc32c = crc32c(data, size, digest_.crc32c);
  digest_.bytes += size;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t(1) << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_os("write", staging_);
    p += n;
    size -= size_t(n);
  }
}

FileDigest AtomicFileWriter::commit() {
  MEGATRON_CHECK(fd_ >= 0, "'" << path_ << "' was already committed");
  if (::fsync(fd_) != 0) fail_os("fsync", staging_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(staging_.c_str());
    errno = err;
    fail_os("close", staging_);
  }
  if (::rename(staging_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(staging_.c_str());
    errno = err;
    fail_os("rename to its final name", staging_);
  }
  fsync_directory(parent_of(path_));
  return digest_;
}

FileDigest write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.write(content.data(), content.size());
  return writer.commit();
}

std::string read_file(const std::string& path) {
  std::string content;
  read_blocks(path, [&](const char* data, size_t n) { content.append(data, n); });
  return content;
}

FileDigest digest_file(const std::string& path) {
  FileDigest digest;
  read_blocks(path, [&](const char* data, size_t n) {
    digest.crc32c = crc32c(data, n, digest.crc32c);
    digest.bytes += n;
  });
  return digest;
}

StagedDirectory::StagedDirectory(std::string final_path)
    : final_(std::move(final_path)), staging_(staging_path(final_)) {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (ec) MEGATRON_FAIL("cannot remove stale staging directory '" << staging_ << "': " << ec.message());
  if (::mkdir(staging_.c_str(), 0755) != 0) fail_os("mkdir", staging_);
}

StagedDirectory::~StagedDirectory() {
  if (published_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDirectory::publish() {
  MEGATRON_CHECK(!published_, "'" << final_ << "' was already published");
  for (const auto& entry : fs::directory_iterator(staging_))
    if (entry.is_regular_file()) fsync_path(entry.path().string(), O_RDONLY);
  fsync_directory(staging_);

  // The directory to delete once the new one is in place: the old contents of the final name.
  std::string replaced;
  if (!fs::exists(final_)) {
    if (::rename(staging_.c_str(), final_.c_str()) != 0) fail_os("rename to its final name", staging_);
  } else if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) == 0) {
    replaced = staging_;
  } else {
    if (errno != EINVAL && errno != ENOSYS) fail_os("exchange with the existing directory", final_);
    replaced = suffixed(final_, "old");
    if (::rename(final_.c_str(), replaced.c_str()) != 0) fail_os("move aside", final_);
    if (::rename(staging_.c_str(), final_.c_str()) != 0) {
      const int err = errno;
      ::rename(replaced.c_str(), final_.c_str());  // put the previous directory back
      errno = err;
      fail_os("rename to its final name", staging_);
    }
  }
  published_ = true;
  fsync_directory(parent_of(final_));
  if (replaced.empty()) return;
  std::error_code ec;
  fs::remove_all(replaced, ec);
  if (ec) LOG_WARN("could not remove the replaced directory '" << replaced << "': " << ec.message());
}

}  // namespace megatron::checkpointing
