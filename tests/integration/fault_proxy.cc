#include "tests/integration/fault_proxy.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace tandem::testing {

FaultProxy::FaultProxy(const std::string& upstream)
    : upstream_(v1::Prefill::NewStub(
          grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()))) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
}

FaultProxy::~FaultProxy() { server_->Shutdown(std::chrono::system_clock::now()); }

void FaultProxy::Inject(Fault fault, int streams) {
  fault_streams_ = streams;
  fault_ = fault;
}

grpc::Status FaultProxy::Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                 grpc::ServerWriter<v1::PrefillResponse>* writer) {
  ++calls_;
  Fault fault = fault_.load();
  if (fault != Fault::kNone && fault_streams_.fetch_sub(1) == 0) {
    fault_streams_ = 0;
    fault = Fault::kNone;
  }
  auto stall = [&] {  // until the caller gives up (bounded)
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!context->IsCancelled() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
  };
  if (fault == Fault::kStallBeforeHeader) return stall();
  grpc::ClientContext up;
  up.set_deadline(context->deadline());
  auto reader = upstream_->Prefill(&up, *request);
  v1::PrefillResponse header;
  if (!reader->Read(&header)) return reader->Finish();
  writer->Write(header);
  if (fault == Fault::kStallAfterHeader) {
    up.TryCancel();
    return stall();
  }
  std::vector<v1::PrefillResponse> chunks;
  v1::PrefillResponse msg, done;
  bool got_done = false;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) chunks.push_back(msg);
    if (msg.has_done()) {
      done = msg;
      got_done = true;
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return status;
  switch (fault) {
    case Fault::kDropLayersAboveZero:
      chunks.erase(std::remove_if(chunks.begin(), chunks.end(),
                                  [](const v1::PrefillResponse& c) { return c.chunk().layer() >= 1; }),
                   chunks.end());
      break;
    case Fault::kDuplicateChunk:
      chunks.insert(chunks.begin() + 1, chunks.front());
      break;
    case Fault::kReorder:
      std::reverse(chunks.begin(), chunks.end());
      break;
    case Fault::kDropLastChunk:
    case Fault::kEndWithoutDone:
      chunks.pop_back();
      got_done = got_done && fault == Fault::kDropLastChunk;
      break;
    case Fault::kCorruptChecksum:
      chunks.front().mutable_chunk()->set_crc32c(chunks.front().chunk().crc32c() ^ 1u);
      break;
    case Fault::kStallMidStream:
      writer->Write(chunks.front());
      return stall();
    default:
      break;
  }
  for (const v1::PrefillResponse& c : chunks) {
    if (!writer->Write(c)) return grpc::Status(grpc::StatusCode::CANCELLED, "reader gone");
  }
  if (got_done) writer->Write(done);
  if (fault == Fault::kHoldAfterDone) return stall();
  return grpc::Status::OK;
}

}  // namespace tandem::testing
