// `tandem health --address=HOST:PORT`: exits 0 only when the worker reports
// SERVING on the standard gRPC health protocol (container health checks).
#ifndef TANDEM_TOOLS_HEALTH_H_
#define TANDEM_TOOLS_HEALTH_H_

#include <string>
#include <vector>

namespace tandem {

int RunHealthCommand(const std::vector<std::string>& args);

}  // namespace tandem

#endif  // TANDEM_TOOLS_HEALTH_H_
