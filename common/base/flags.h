// FlagSet: the command-line parser every Tandem binary uses.
//
// Flags are `--name=value` (or `--name value`; a bare `--name` sets a bool to
// true). Unknown flags and malformed values are errors returned as a Status,
// so each binary decides its own exit code (the CLI exits 2 on a usage error).
// Both `--max-num-seqs` and `--max_num_seqs` spell the same flag.
//
// Not thread-safe; use from main() before starting threads.
#ifndef TANDEM_COMMON_BASE_FLAGS_H_
#define TANDEM_COMMON_BASE_FLAGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

class FlagSet {
 public:
  explicit FlagSet(std::string program) : program_(std::move(program)) {}

  // Registers a flag bound to `*target`; the target's current value is the
  // default shown in Usage().
  void Add(const std::string& name, std::string* target, std::string help);
  void Add(const std::string& name, int* target, std::string help);
  void Add(const std::string& name, int64_t* target, std::string help);
  void Add(const std::string& name, uint64_t* target, std::string help);
  void Add(const std::string& name, double* target, std::string help);
  void Add(const std::string& name, bool* target, std::string help);

  // Parses argv[1..argc). Returns the positional arguments in order.
  // INVALID_ARGUMENT names the flag and the bad value. `--help` sets
  // help_requested() and stops parsing.
  absl::StatusOr<std::vector<std::string>> Parse(int argc, char** argv);
  absl::StatusOr<std::vector<std::string>> Parse(
      const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  const std::string& program() const { return program_; }
  // True when the flag was given on the command line (not left at default).
  bool IsSet(const std::string& name) const;
  std::string Usage() const;

 private:
  struct Flag {
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<absl::Status(absl::string_view)> set;
  };
  void AddFlag(const std::string& name, Flag flag);

  std::string program_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, bool> set_;
  bool help_requested_ = false;
};

// For a command-line tool: parses `args`, which must all be flags. Returns
// the exit code to stop with - 0 after printing the usage for --help, 2 after
// printing "<program>: <error>" to stderr - or nullopt to go on.
std::optional<int> ParseCommandLine(FlagSet* flags, const std::vector<std::string>& args);

// Parses "1,2,3" into integers; INVALID_ARGUMENT names `what` and the bad item.
absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text,
                                              absl::string_view what);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FLAGS_H_
