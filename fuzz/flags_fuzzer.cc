// Engine flags as both workers and the CLI parse them, then the graph policy
// resolved from the result: NUL-separated arguments. Any command line must end
// in a Status (a usage error), never a crash, a hang or a huge allocation.
// Each argument is also read as `tandem bench serve`'s --mix and --slo and
// as a --speculative-config JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/flags.h"
#include "common/engine/speculative.h"
#include "common/graph/graph_policy.h"
#include "common/serving/engine_flags.h"
#include "tools/serve_stats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  for (const std::string& a : args) {
    (void)tandem::ParseMix(a);
    (void)tandem::ParseSlo(a);
    (void)tandem::ParseSpeculativeConfig(a);
  }
  tandem::FlagSet flags("fuzz");
  tandem::EngineFlags engine_flags("PIECEWISE");
  engine_flags.Register(&flags);
  auto positional = flags.Parse(args);
  if (!positional.ok()) return 0;
  auto config = engine_flags.ToConfig(flags);
  if (!config.ok()) return 0;
  auto policy = tandem::ResolveGraphPolicy(
      config->runner.graph,
      tandem::BatchLimits{config->runner.max_num_seqs, config->runner.max_num_batched_tokens},
      tandem::AttentionCgSupport::kAlways, /*piecewise_split=*/true);
  if (!policy.ok()) return 0;
  tandem::CudaGraphDispatcher d(std::move(policy->dispatcher));
  (void)d.InitializeKeys(policy->resolution.mode);
  (void)d.Dispatch(7, true);
  return 0;
}
