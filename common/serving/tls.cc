#include "common/serving/tls.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read the file"));
  }
  std::string pem((std::istreambuf_iterator<char>(in)), {});
  if (pem.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": not a PEM file"));
  }
  return pem;
}

absl::Status CheckPair(const TlsFiles& f, const std::string& prefix) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", prefix, "tls-cert and --", prefix,
                                                   "tls-key go together: give both or neither"));
  }
  return absl::OkStatus();
}

}  // namespace

void TlsFiles::Register(FlagSet* flags, const std::string& prefix, bool server) {
  flags->Add(prefix + "tls-cert", &cert,
             server ? "PEM certificate chain: serve gRPC over TLS (with --" + prefix + "tls-key)"
                    : "PEM client certificate for mutual TLS (with --" + prefix + "tls-key)");
  flags->Add(prefix + "tls-key", &key, "PEM private key of --" + prefix + "tls-cert");
  flags->Add(prefix + "tls-ca", &ca,
             server ? "PEM CA bundle: require client certificates signed by it (mTLS)"
                    : "PEM CA bundle to verify the server: connect over TLS");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& f, const std::string& prefix) {
  if (auto s = CheckPair(f, prefix); !s.ok()) return s;
  if (f.cert.empty()) {
    if (!f.ca.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", prefix, "tls-ca needs --", prefix,
                                                     "tls-cert and --", prefix, "tls-key"));
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions opts(
      f.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPem(f.cert, prefix + "tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(f.key, prefix + "tls-key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *cert;
  pair.private_key = *key;
  opts.pem_key_cert_pairs.push_back(pair);
  if (!f.ca.empty()) {
    auto ca = ReadPem(f.ca, prefix + "tls-ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& f, const std::string& prefix) {
  if (auto s = CheckPair(f, prefix); !s.ok()) return s;
  if (f.ca.empty()) {
    if (!f.cert.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", prefix, "tls-cert needs --", prefix,
                                                     "tls-ca (the server's CA)"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions opts;
  auto ca = ReadPem(f.ca, prefix + "tls-ca");
  if (!ca.ok()) return ca.status();
  opts.pem_root_certs = *ca;
  if (!f.cert.empty()) {
    auto cert = ReadPem(f.cert, prefix + "tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(f.key, prefix + "tls-key");
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *cert;
    opts.pem_private_key = *key;
  }
  return grpc::SslCredentials(opts);
}

}  // namespace tandem
