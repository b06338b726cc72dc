#include "common/graph/cudagraph_wrapper.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/graph/forward_context.h"

namespace tandem {
namespace {

std::string Addresses(const std::vector<const void*>& addresses) {
  return absl::StrCat("[", absl::StrJoin(addresses, ", ", [](std::string* out, const void* p) {
                        char buf[32];
                        std::snprintf(buf, sizeof(buf), "%p", p);
                        out->append(buf);
                      }),
                      "]");
}

}  // namespace

CudaGraphWrapper::CudaGraphWrapper(std::string name, CudaGraphMode mode, Stream* stream,
                                   Runnable runnable, InputAddresses input_addresses,
                                   CudaGraphWrapperOptions options)
    : name_(std::move(name)),
      mode_(mode),
      stream_(stream),
      runnable_(std::move(runnable)),
      input_addresses_(std::move(input_addresses)),
      options_(options) {
  TANDEM_CHECK(mode == CudaGraphMode::kFull || mode == CudaGraphMode::kPiecewise)
      << "a CudaGraphWrapper is bound to FULL or PIECEWISE, got " << mode;
  TANDEM_CHECK(stream != nullptr);
}

absl::Status CudaGraphWrapper::Run() {
  const ForwardContext* ctx = CurrentForwardContext();
  if (ctx == nullptr || ctx->runtime_mode == CudaGraphMode::kNone ||
      ctx->runtime_mode != mode_) {
    ++passthroughs_;
    return runnable_();
  }
  auto it = entries_.find(ctx->descriptor);
  if (it == entries_.end()) return Capture(ctx->descriptor, /*run=*/!ctx->capture_only);
  RETURN_IF_ERROR(CheckAddresses(ctx->descriptor, it->second));
  ++replays_;
  return it->second.graph->Replay();
}

absl::Status CudaGraphWrapper::Capture(const BatchDescriptor& descriptor, bool run) {
  Entry entry;
  if (options_.check_input_addresses && input_addresses_) {
    entry.input_addresses = input_addresses_();
  }
  RETURN_IF_ERROR(stream_->BeginCapture());
  absl::Status recorded = runnable_();
  auto graph = stream_->EndCapture();
  if (!recorded.ok()) return recorded;
  if (!graph.ok()) return graph.status();
  entry.graph = std::move(graph).value();
  ++captures_;
  TANDEM_LOG(DEBUG) << "captured " << mode_ << " graph '" << name_ << "' for "
                    << descriptor << " (" << entry.graph->num_nodes() << " nodes)";
  // Outside a start-up capture pass the caller reads the output: produce it.
  if (run) RETURN_IF_ERROR(entry.graph->Replay());
  entries_.emplace(descriptor, std::move(entry));
  return absl::OkStatus();
}

absl::Status CudaGraphWrapper::CheckAddresses(const BatchDescriptor& descriptor,
                                              const Entry& entry) const {
  if (!options_.check_input_addresses || !input_addresses_) return absl::OkStatus();
  std::vector<const void*> now = input_addresses_();
  if (now == entry.input_addresses) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "input addresses for graph '", name_, "' (", mode_.name(), ", ",
      descriptor.ToString(), ") changed between capture and replay: expected ",
      Addresses(entry.input_addresses), ", got ", Addresses(now)));
}

}  // namespace tandem
