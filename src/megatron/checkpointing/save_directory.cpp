#include "megatron/checkpointing/save_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megatron/core/error.h"

namespace megatron::checkpointing {

void prepare_save_directory(const std::string& save_dir, const std::string& probe_name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  MEGATRON_CHECK(!fs::exists(save_dir, ec) || fs::is_directory(save_dir, ec),
                 "--save " << save_dir << " exists and is not a directory: checkpoints go into a directory; give "
                           << "another path (a missing directory is created)");
  // Other ranks may create it at the same time: what counts is that it exists afterwards.
  fs::create_directories(save_dir, ec);
  MEGATRON_CHECK(fs::is_directory(save_dir),
                 "--save " << save_dir << " cannot be created (" << ec.message()
                           << "): give a directory under one this process can write, or create it first");
  const std::string probe = (fs::path(save_dir) / probe_name).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  MEGATRON_CHECK(fd >= 0, "--save " << save_dir
                                    << " is not writable (creating a file there failed: " << std::strerror(errno)
                                    << "): make it writable for this user, or give another directory");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace megatron::checkpointing
