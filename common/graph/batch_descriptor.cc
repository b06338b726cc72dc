#include "common/graph/batch_descriptor.h"

#include "absl/strings/str_cat.h"

namespace tandem {

std::string BatchDescriptor::ToString() const {
  return absl::StrCat("BatchDescriptor(num_tokens=", num_tokens, ", num_reqs=",
                      num_reqs ? absl::StrCat(*num_reqs) : "None",
                      ", uniform=", uniform ? "True" : "False",
                      ", has_lora=", has_lora ? "True" : "False", ")");
}

std::ostream& operator<<(std::ostream& os, const BatchDescriptor& d) {
  return os << d.ToString();
}

}  // namespace tandem
