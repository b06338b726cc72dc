// TLS and mutual TLS on every hop, with certificates made by openssl at test
// time: client -> decode worker (TLS), decode -> prefill worker (mTLS), the
// tandem CLI; a plaintext client, and a TLS client without a certificate on
// an mTLS port, fail cleanly.
#include <signal.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tandem::testing {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "tandem_tls_" + std::to_string(getpid()));
    const std::string d = *dir_;
    const std::string script =
        "set -e; mkdir -p " + d + " && cd " + d +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1"
        " -subj /CN=tandem-test-ca 2>/dev/null"
        " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.cnf"
        " && for n in server client; do"
        "   openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=$n 2>/dev/null;"
        "   openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem"
        "     -days 1 -extfile san.cnf 2>/dev/null;"
        " done";
    ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed";
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *dir_).c_str());
    delete dir_;
  }
  static std::string F(const std::string& name) { return *dir_ + "/" + name; }
  static std::shared_ptr<grpc::ChannelCredentials> Client(bool with_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(F("ca.pem"));
    if (with_cert) {
      o.pem_cert_chain = Read(F("client.pem"));
      o.pem_private_key = Read(F("client.key"));
    }
    return grpc::SslCredentials(o);
  }
  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

GenerateResult GenerateWith(const std::string& address,
                            std::shared_ptr<grpc::ChannelCredentials> creds) {
  auto stub = v1::Decode::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub->Generate(&ctx, MakeRequest("", {1, 2, 3, 4}, 4));
  GenerateResult r;
  v1::GenerateResponse m;
  while (reader->Read(&m)) r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
  r.status = reader->Finish();
  return r;
}

TEST_F(TlsTest, EveryHopEncryptedAndPlaintextRefused) {
  // Prefill: mTLS (a CA given: client certificates required).
  Worker prefill = StartWorker("prefill_worker",
                               {"--tls-cert=" + F("server.pem"), "--tls-key=" + F("server.key"),
                                "--tls-ca=" + F("ca.pem")},
                               0, Client(/*with_cert=*/true));
  // Decode: TLS for its clients, a client certificate towards the prefill worker.
  Worker decode = StartWorker(
      "decode_worker",
      {"--tls-cert=" + F("server.pem"), "--tls-key=" + F("server.key"),
       "--prefill-address=" + prefill.address(), "--prefill-tls-ca=" + F("ca.pem"),
       "--prefill-tls-cert=" + F("client.pem"), "--prefill-tls-key=" + F("client.key")},
      0, Client(/*with_cert=*/false));
  GenerateResult ok = GenerateWith(decode.address(), Client(false));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 4u);

  // Plaintext against TLS: a clean UNAVAILABLE, and the worker keeps serving.
  GenerateResult plain = GenerateWith(decode.address(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(plain.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  // No client certificate on the mTLS port: refused in the handshake.
  auto stub = v1::Prefill::NewStub(grpc::CreateChannel(prefill.address(), Client(false)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PrefillRequest req;
  req.add_prompt_token_ids(1);
  req.mutable_sampling()->set_max_tokens(1);
  auto reader = stub->Prefill(&ctx, req);
  v1::PrefillResponse resp;
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(GenerateWith(decode.address(), Client(false)).status.ok());

  // The CLI over TLS.
  const std::string cli = BinDir() + "/tandem generate --address=" + decode.address() +
                          " --prompt-token-ids=1,2,3 --max-tokens=3 --tls-ca=" + F("ca.pem") +
                          " > /dev/null";
  EXPECT_EQ(std::system(cli.c_str()), 0);
  const std::string health = BinDir() + "/tandem health --address=" + prefill.address() +
                             " --tls-ca=" + F("ca.pem") + " --tls-cert=" + F("client.pem") +
                             " --tls-key=" + F("client.key");
  EXPECT_EQ(std::system(health.c_str()), 0);

  for (Worker* w : {&decode, &prefill}) {
    w->process->Signal(SIGTERM);
    EXPECT_EQ(w->process->Wait(std::chrono::seconds(20)), 0) << w->process->Log();
  }
}

TEST_F(TlsTest, BadTlsFlagsFailStartUpNamingTheFlag) {
  Process half({BinDir() + "/prefill_worker", "--grpc-address=127.0.0.1:0",
                "--metrics-address=127.0.0.1:0", "--tls-cert=" + F("server.pem")},
               ::testing::TempDir() + "tls_half_" + std::to_string(getpid()) + ".log");
  EXPECT_EQ(half.Wait(std::chrono::seconds(20)), 1);
  EXPECT_NE(half.Log().find("--tls-cert and --tls-key go together"), std::string::npos)
      << half.Log();
  Process missing({BinDir() + "/prefill_worker", "--grpc-address=127.0.0.1:0",
                   "--metrics-address=127.0.0.1:0", "--tls-cert=/nonexistent.pem",
                   "--tls-key=" + F("server.key")},
                  ::testing::TempDir() + "tls_missing_" + std::to_string(getpid()) + ".log");
  EXPECT_EQ(missing.Wait(std::chrono::seconds(20)), 1);
  EXPECT_NE(missing.Log().find("--tls-cert=/nonexistent.pem: cannot read the file"),
            std::string::npos)
      << missing.Log();
}

}  // namespace
}  // namespace tandem::testing
