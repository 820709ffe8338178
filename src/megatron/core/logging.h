#pragma once
// Plain line logging to stdout/stderr. Ranks other than the one chosen to print stay quiet
// unless asked; every line is written with one call so ranks do not interleave mid-line.
#include <sstream>
#include <string>

namespace megatron {

enum class LogLevel { debug, info, warning, error };

struct LogSettings {
  int rank = 0;
  bool print_all_ranks = false;
  LogLevel min_level = LogLevel::info;
};

void set_log_settings(const LogSettings& settings);
const LogSettings& log_settings();

// This process logs as `rank` (info lines from rank 0 only) until the scope ends.
class ScopedLogRank {
 public:
  explicit ScopedLogRank(int rank) : saved_(log_settings()) {
    LogSettings settings = saved_;
    settings.rank = rank;
    set_log_settings(settings);
  }
  ~ScopedLogRank() { set_log_settings(saved_); }
  ScopedLogRank(const ScopedLogRank&) = delete;
  ScopedLogRank& operator=(const ScopedLogRank&) = delete;

 private:
  LogSettings saved_;
};
void log_line(LogLevel level, const std::string& line);
// Current local time as "YYYY-MM-DD HH:MM:SS.ffffff" (Megatron's log-line timestamp).
std::string timestamp_now();

}  // namespace megatron

#define MEGATRON_LOG(level, msg_stream)                  \
  do {                                                   \
    std::ostringstream megatron_log_os_;                 \
    megatron_log_os_ << msg_stream;                      \
    ::megatron::log_line(level, megatron_log_os_.str()); \
  } while (0)
#define LOG_INFO(msg) MEGATRON_LOG(::megatron::LogLevel::info, msg)
#define LOG_WARN(msg) MEGATRON_LOG(::megatron::LogLevel::warning, msg)
#define LOG_DEBUG(msg) MEGATRON_LOG(::megatron::LogLevel::debug, msg)
