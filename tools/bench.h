// `tandem bench step`: median step time, graph replay against eager, for
// decode batches and prefill token counts; `tandem bench kv`: KV transfer;
// `tandem bench serve`: a load generator against a decode worker.
#ifndef TANDEM_TOOLS_BENCH_H_
#define TANDEM_TOOLS_BENCH_H_

#include <string>
#include <vector>

namespace tandem {

int RunBenchCommand(const std::vector<std::string>& args);
// `tandem bench kv`: KV-stream goodput against a raw loopback socket.
int RunKvBench(const std::vector<std::string>& args);
// `tandem bench serve`: load against a decode worker (tools/bench_serve.cc).
int RunServeBench(const std::vector<std::string>& args);

}  // namespace tandem

#endif  // TANDEM_TOOLS_BENCH_H_
