#include "megatron/core/logging.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace megatron {

namespace {
LogSettings g_settings;  // process-wide by nature: one stdout per process
}

void set_log_settings(const LogSettings& settings) { g_settings = settings; }
const LogSettings& log_settings() { return g_settings; }

void log_line(LogLevel level, const std::string& line) {
  if (level < g_settings.min_level) return;
  if (level < LogLevel::warning && g_settings.rank != 0 && !g_settings.print_all_ranks) return;
  std::string out;
  if (level == LogLevel::warning) out = "WARNING: ";
  if (level == LogLevel::error) out = "ERROR: ";
  if (g_settings.print_all_ranks || g_settings.rank != 0) out = "[rank " + std::to_string(g_settings.rank) + "] " + out;
  out += line;
  out += '\n';
  FILE* stream = level >= LogLevel::warning ? stderr : stdout;
  std::fwrite(out.data(), 1, out.size(), stream);
  std::fflush(stream);
}

std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char full[80];
  std::snprintf(full, sizeof full, "%s.%06lld", buf, static_cast<long long>(micros));
  return full;
}

}  // namespace megatron
