#include "tools/health.h"

#include <chrono>
#include <iostream>

#include "common/base/flags.h"
#include "common/serving/tls.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace tandem {

int RunHealthCommand(const std::vector<std::string>& args) {
  FlagSet flags("tandem health");
  std::string address;
  std::string service;
  double timeout_s = 2;
  flags.Add("address", &address, "worker HOST:PORT");
  flags.Add("service", &service, "service name to check (empty: the whole server)");
  flags.Add("timeout-seconds", &timeout_s, "deadline of the check");
  TlsFiles tls;
  tls.Register(&flags, "", /*server=*/false);
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  if (address.empty()) {
    std::cerr << "tandem health: --address is required" << std::endl;
    return 2;
  }
  auto credentials = ChannelCredentials(tls);
  if (!credentials.ok()) {
    std::cerr << "tandem health: " << credentials.status().message() << std::endl;
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, *credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::cout << "UNREACHABLE: " << status.error_message() << std::endl;
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
            << std::endl;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace tandem
