// `tandem generate`: run one prompt, in-process (--local) or against a
// decode worker (--address), printing the token ids as they come on one line,
// comma separated, then a summary line.
#ifndef TANDEM_TOOLS_GENERATE_H_
#define TANDEM_TOOLS_GENERATE_H_

#include <string>
#include <vector>

namespace tandem {

int RunGenerateCommand(const std::vector<std::string>& args);

}  // namespace tandem

#endif  // TANDEM_TOOLS_GENERATE_H_
