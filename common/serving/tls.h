// TLS and mutual TLS for every gRPC hop: the workers' servers, the decode
// worker's prefill client and the tandem CLI, from PEM files named by flags.
//   server: --tls-cert + --tls-key (TLS); with --tls-ca, clients must present a
//           certificate signed by that CA (mTLS).
//   client: --tls-ca (verify the server; TLS on), plus --tls-cert + --tls-key
//           to present a client certificate.
// No flags: plaintext, as before.
#ifndef TANDEM_COMMON_SERVING_TLS_H_
#define TANDEM_COMMON_SERVING_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

struct TlsFiles {
  std::string cert;  // PEM certificate chain
  std::string key;   // PEM private key
  std::string ca;    // PEM CA bundle

  // Registers --<prefix>tls-cert, --<prefix>tls-key, --<prefix>tls-ca.
  void Register(FlagSet* flags, const std::string& prefix, bool server);
  bool enabled_for_client() const { return !ca.empty(); }
};

// INVALID_ARGUMENT names the flag: a cert without its key (or the reverse), a
// CA without a server cert, a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& files, const std::string& prefix = "");
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, const std::string& prefix = "");

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TLS_H_
