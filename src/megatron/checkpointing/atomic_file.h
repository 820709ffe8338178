#pragma once
// Durable, atomic file I/O for checkpoints. A reader sees either the old file (or directory) or
// the complete new one, never a torn write: new content is written under a staging name
// "<target>.tmp.<pid>", fsync'ed, renamed over the target, and the parent directory is fsync'ed
// so that the rename itself survives a power loss. OS errors become Errors carrying
// strerror(errno) and the path.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace megatron::checkpointing {

// Size and CRC-32C of a file's bytes.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// New files and directories are built under "<path>.tmp.<pid>". For a staging name
// ("<base>.tmp.<digits>", or "<base>.old.<digits>" for a directory moved aside while it is being
// replaced) returns <base>; nullopt for any other name.
std::optional<std::string> staging_base_name(const std::string& filename);

// Streams a new file under its staging name; commit() makes it appear at `path` in one step.
// Destroyed without commit (an exception mid-write), it removes the staging file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  // fsync, close, rename over the target, fsync the parent directory.
  FileDigest commit();

 private:
  std::string path_;
  std::string staging_;
  int fd_ = -1;
  FileDigest digest_;
};

FileDigest write_file_atomic(const std::string& path, std::string_view content);

std::string read_file(const std::string& path);
FileDigest digest_file(const std::string& path);  // streams the file; memory use is bounded

// A directory built under "<final>.tmp.<pid>/" and published under its final name by one rename,
// so a crash at any point leaves either no directory or the previous one at the final name.
class StagedDirectory {
 public:
  // Creates the staging directory, first removing a stale one of the same name (pid reuse).
  explicit StagedDirectory(std::string final_path);
  // Not published (an exception during the save): removes the staging directory, best effort.
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& path() const { return staging_; }
  // fsyncs every file and the staging directory, renames it to the final name, fsyncs the
  // parent. An existing directory at the final name is swapped out in the same atomic step
  // (renameat2 RENAME_EXCHANGE) and then deleted; on filesystems without that call it is moved
  // aside first, which leaves a short window with no directory at the final name.
  void publish();

 private:
  std::string final_;
  std::string staging_;
  bool published_ = false;
};

}  // namespace megatron::checkpointing
