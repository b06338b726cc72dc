// Minimal leveled logging to stderr, one line per message, with a timestamp and
// the source location. Thread-safe: each message is formatted into a buffer and
// written with one call.
//
//   TANDEM_LOG(INFO) << "captured " << n << " graphs";
//   TANDEM_CHECK(ptr != nullptr) << "why it cannot be null";
//
// TANDEM_CHECK is for broken invariants (programming errors) only; everything
// a user or a peer can cause is an absl::Status.
#ifndef TANDEM_COMMON_BASE_LOGGING_H_
#define TANDEM_COMMON_BASE_LOGGING_H_

#include <sstream>

namespace tandem {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this severity are dropped. Default kInfo; TANDEM_LOG_LEVEL
// (DEBUG|INFO|WARNING|ERROR) in the environment overrides it at start-up.
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts the process for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows the stream of a disabled log statement.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem

#define TANDEM_LOG_SEVERITY_DEBUG ::tandem::LogSeverity::kDebug
#define TANDEM_LOG_SEVERITY_INFO ::tandem::LogSeverity::kInfo
#define TANDEM_LOG_SEVERITY_WARNING ::tandem::LogSeverity::kWarning
#define TANDEM_LOG_SEVERITY_ERROR ::tandem::LogSeverity::kError
#define TANDEM_LOG_SEVERITY_FATAL ::tandem::LogSeverity::kFatal

#define TANDEM_LOG(level)                                                  \
  !(TANDEM_LOG_SEVERITY_##level >= ::tandem::MinLogSeverity())             \
      ? (void)0                                                            \
      : ::tandem::LogVoidify() &                                           \
            ::tandem::LogMessage(TANDEM_LOG_SEVERITY_##level, __FILE__,    \
                                 __LINE__)                                 \
                .stream()

#define TANDEM_CHECK(cond)                                                   \
  (cond) ? (void)0                                                           \
         : ::tandem::LogVoidify() &                                          \
               ::tandem::LogMessage(::tandem::LogSeverity::kFatal, __FILE__, \
                                    __LINE__)                                \
                       .stream()                                             \
                   << "Check failed: " #cond " "

#endif  // TANDEM_COMMON_BASE_LOGGING_H_
