// `tandem`: the command-line tool. Subcommands:
//   plan      graph routing / capture plan for a configuration
//   generate  text or tokens for one prompt, local or through a decode worker
//   tokenize / detokenize  the model's tokenizer
//   bench     step-time benchmarks
//   health    gRPC health check of a worker
#include <iostream>
#include <string>
#include <vector>

#include "tools/bench.h"
#include "tools/generate.h"
#include "tools/health.h"
#include "tools/plan.h"

namespace {

constexpr char kUsage[] =
    "Usage: tandem <command> [flags]\n"
    "\n"
    "Commands:\n"
    "  plan      print the CUDA-graph routing and capture plan for a configuration\n"
    "  generate  generate for a prompt (--local, or --address of a decode worker)\n"
    "  tokenize  text to token ids with the model's tokenizer\n"
    "  detokenize  token ids to text\n"
    "  bench     benchmarks: 'bench step' (graph replay vs eager step time), 'bench kv',\n"
    "            'bench serve' (load against a decode worker, vllm bench serve's report)\n"
    "  health    exit 0 only when a worker reports SERVING\n"
    "\n"
    "Run 'tandem <command> --help' for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "plan") return tandem::RunPlanCommand(args);
  if (command == "generate") return tandem::RunGenerateCommand(args);
  if (command == "tokenize") return tandem::RunTokenizeCommand(args, /*detokenize=*/false);
  if (command == "detokenize") return tandem::RunTokenizeCommand(args, /*detokenize=*/true);
  if (command == "bench") return tandem::RunBenchCommand(args);
  if (command == "health") return tandem::RunHealthCommand(args);
  std::cerr << "tandem: unknown command '" << command << "' (see tandem --help)" << std::endl;
  return 2;
}
