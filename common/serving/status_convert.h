// The one mapping from absl::Status (inside) to grpc::Status (the edge).
#ifndef TANDEM_COMMON_SERVING_STATUS_CONVERT_H_
#define TANDEM_COMMON_SERVING_STATUS_CONVERT_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem {

grpc::Status ToGrpcStatus(const absl::Status& status);
// The HTTP status for a gRPC code (the OpenAI API's errors): 400 bad input,
// 404 not found, 409 an id in flight, 429 queue full, 499 cancelled, 501,
// 503 unavailable or draining, 504 deadline, 500 otherwise.
int HttpStatusFor(grpc::StatusCode code);
// The canonical upper-case name of a gRPC code ("RESOURCE_EXHAUSTED").
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_STATUS_CONVERT_H_
