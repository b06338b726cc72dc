// `tandem generate`: run one prompt, in-process (--local) or against a
// decode worker (--address). With --prompt-token-ids it prints the token ids
// as they come on one line, comma separated, then a summary line; with
// --prompt (text) it prints the text as it streams and the summary on stderr.
//
// `tandem tokenize` / `tandem detokenize`: the model's tokenizer, for
// debugging prompts.
#ifndef TANDEM_TOOLS_GENERATE_H_
#define TANDEM_TOOLS_GENERATE_H_

#include <string>
#include <vector>

namespace tandem {

int RunGenerateCommand(const std::vector<std::string>& args);
int RunTokenizeCommand(const std::vector<std::string>& args, bool detokenize);

}  // namespace tandem

#endif  // TANDEM_TOOLS_GENERATE_H_
