// FaultProxy: a tandem.v1.Prefill server in the test process that forwards
// each call to a real prefill worker and damages the stream as told, the way
// a buggy or hostile peer, or a proxy, could: drop, repeat or reorder chunks,
// end early with or without `done`, corrupt a checksum, or stall. The decode
// worker under test points --prefill-address at it.
#ifndef TANDEM_TESTS_INTEGRATION_FAULT_PROXY_H_
#define TANDEM_TESTS_INTEGRATION_FAULT_PROXY_H_

#include <atomic>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem::testing {

enum class Fault {
  kNone,
  kDropLayersAboveZero,  // every chunk of layers >= 1
  kDuplicateChunk,       // the first chunk twice
  kReorder,              // the chunks in reverse order (complete: accepted)
  kDropLastChunk,        // ends early, `done` still sent
  kEndWithoutDone,       // the last chunk and `done` dropped, status OK
  kCorruptChecksum,      // one chunk's CRC flipped
  kStallBeforeHeader,    // nothing at all until cancelled (a frozen peer's
                         // connection stays up: only a timeout notices)
  kStallAfterHeader,     // the header, then nothing until cancelled
  kStallMidStream,       // the header and one chunk, then nothing
  kHoldAfterDone,        // every message, `done` included, then the stream
                         // held open (no status) until cancelled
};

class FaultProxy final : public v1::Prefill::Service {
 public:
  // Forwards to the prefill worker at `upstream`; listens on a free port.
  explicit FaultProxy(const std::string& upstream);
  ~FaultProxy() override;
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // The fault for the next `streams` calls (then none); streams < 0: all.
  void Inject(Fault fault, int streams = -1);
  int calls() const { return calls_.load(); }

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       grpc::ServerWriter<v1::PrefillResponse>* writer) override;

 private:
  std::unique_ptr<v1::Prefill::Stub> upstream_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<int> fault_streams_{0};
  std::atomic<int> calls_{0};
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_FAULT_PROXY_H_
