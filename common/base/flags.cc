#include "common/base/flags.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

std::string Canonical(absl::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

absl::Status BadValue(absl::string_view name, absl::string_view value,
                      absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      "flag --", name, ": invalid value '", value, "' (expected ", expected, ")"));
}

}  // namespace

void FlagSet::AddFlag(const std::string& name, Flag flag) {
  flags_[Canonical(name)] = std::move(flag);
}

void FlagSet::Add(const std::string& name, std::string* target, std::string help) {
  AddFlag(name, {std::move(help), *target, false, [target](absl::string_view v) {
                   *target = std::string(v);
                   return absl::OkStatus();
                 }});
}

void FlagSet::Add(const std::string& name, int* target, std::string help) {
  AddFlag(name, {std::move(help), absl::StrCat(*target), false,
                 [target, name](absl::string_view v) {
                   if (!absl::SimpleAtoi(v, target)) return BadValue(name, v, "an integer");
                   return absl::OkStatus();
                 }});
}

void FlagSet::Add(const std::string& name, int64_t* target, std::string help) {
  AddFlag(name, {std::move(help), absl::StrCat(*target), false,
                 [target, name](absl::string_view v) {
                   if (!absl::SimpleAtoi(v, target)) return BadValue(name, v, "an integer");
                   return absl::OkStatus();
                 }});
}

void FlagSet::Add(const std::string& name, uint64_t* target, std::string help) {
  AddFlag(name, {std::move(help), absl::StrCat(*target), false,
                 [target, name](absl::string_view v) {
                   if (!absl::SimpleAtoi(v, target)) {
                     return BadValue(name, v, "a non-negative integer");
                   }
                   return absl::OkStatus();
                 }});
}

void FlagSet::Add(const std::string& name, double* target, std::string help) {
  AddFlag(name, {std::move(help), absl::StrCat(*target), false,
                 [target, name](absl::string_view v) {
                   if (!absl::SimpleAtod(v, target)) return BadValue(name, v, "a number");
                   return absl::OkStatus();
                 }});
}

void FlagSet::Add(const std::string& name, bool* target, std::string help) {
  AddFlag(name, {std::move(help), *target ? "true" : "false", true,
                 [target, name](absl::string_view v) {
                   if (!absl::SimpleAtob(v, target)) return BadValue(name, v, "true or false");
                   return absl::OkStatus();
                 }});
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return Parse(args);
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(
    const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      positional.emplace_back(arg);
      continue;
    }
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const std::string key = Canonical(name);
    if (key == "help") {
      help_requested_ = true;
      return positional;
    }
    auto it = flags_.find(key);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    if (absl::Status s = it->second.set(value); !s.ok()) return s;
    set_[key] = true;
  }
  return positional;
}

bool FlagSet::IsSet(const std::string& name) const {
  return set_.count(Canonical(name)) > 0;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("Usage: ", program_, " [flags]\n\nFlags:\n");
  for (const auto& [name, flag] : flags_) {
    absl::StrAppend(&out, "  --", name, " (default: ",
                    flag.default_text.empty() ? "\"\"" : flag.default_text, ")\n      ",
                    flag.help, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text,
                                              absl::string_view what) {
  std::vector<int> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", item, "' is not an integer (in '", text, "')"));
    }
    out.push_back(value);
  }
  return out;
}

std::optional<int> ParseCommandLine(FlagSet* flags, const std::vector<std::string>& args) {
  auto positional = flags->Parse(args);
  if (positional.ok() && !positional->empty()) {
    positional = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional->front(), "' (flags are --name=value)"));
  }
  if (!positional.ok()) {
    std::cerr << flags->program() << ": " << positional.status().message() << std::endl;
    return 2;
  }
  if (flags->help_requested()) {
    std::cout << flags->Usage();
    return 0;
  }
  return std::nullopt;
}

}  // namespace tandem
