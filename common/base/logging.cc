#include "common/base/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {
namespace {

LogSeverity InitialSeverity() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  if (std::strcmp(env, "DEBUG") == 0) return LogSeverity::kDebug;
  if (std::strcmp(env, "WARNING") == 0) return LogSeverity::kWarning;
  if (std::strcmp(env, "ERROR") == 0) return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinSeverityStorage() {
  static std::atomic<int> severity{static_cast<int>(InitialSeverity())};
  return severity;
}

const char* SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kDebug: return "D";
    case LogSeverity::kInfo: return "I";
    case LogSeverity::kWarning: return "W";
    case LogSeverity::kError: return "E";
    case LogSeverity::kFatal: return "F";
  }
  return "?";
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  MinSeverityStorage().store(static_cast<int>(severity));
}

LogSeverity MinLogSeverity() {
  return static_cast<LogSeverity>(MinSeverityStorage().load());
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityLetter(severity) << " "
          << absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(),
                              absl::LocalTimeZone())
          << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  if (severity_ == LogSeverity::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace tandem
