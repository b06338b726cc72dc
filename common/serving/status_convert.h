// The one mapping from absl::Status (inside) to grpc::Status (the edge).
#ifndef TANDEM_COMMON_SERVING_STATUS_CONVERT_H_
#define TANDEM_COMMON_SERVING_STATUS_CONVERT_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem {

grpc::Status ToGrpcStatus(const absl::Status& status);
// The canonical upper-case name of a gRPC code ("RESOURCE_EXHAUSTED").
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_STATUS_CONVERT_H_
