#include "common/graph/attention_support.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::string_view AttentionCgSupportName(AttentionCgSupport support) {
  switch (support) {
    case AttentionCgSupport::kNever: return "NEVER";
    case AttentionCgSupport::kUniformSingleTokenDecode: return "UNIFORM_SINGLE_TOKEN_DECODE";
    case AttentionCgSupport::kUniformBatch: return "UNIFORM_BATCH";
    case AttentionCgSupport::kAlways: return "ALWAYS";
  }
  return "UNKNOWN";
}

absl::StatusOr<AttentionCgSupport> ParseAttentionCgSupport(absl::string_view text) {
  const std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  for (AttentionCgSupport s :
       {AttentionCgSupport::kNever, AttentionCgSupport::kUniformSingleTokenDecode,
        AttentionCgSupport::kUniformBatch, AttentionCgSupport::kAlways}) {
    if (AttentionCgSupportName(s) == upper) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "attention support '", text,
      "' is not one of ALWAYS, UNIFORM_BATCH, UNIFORM_SINGLE_TOKEN_DECODE, NEVER"));
}

absl::StatusOr<ModeResolution> ResolveCudaGraphMode(CudaGraphMode requested,
                                                    AttentionCgSupport support,
                                                    bool piecewise_split,
                                                    int uniform_decode_query_len) {
  ModeResolution r{requested, {}};
  const std::string support_name(AttentionCgSupportName(support));
  auto change = [&r](CudaGraphMode to, const std::string& why) {
    r.notes.push_back(absl::StrCat(r.mode.name(), " -> ", to.name(), ": ", why));
    r.mode = to;
  };

  // (a) PIECEWISE graphs need the forward split at attention.
  if (!piecewise_split) {
    if (r.mode == CudaGraphMode::kPiecewise) {
      change(CudaGraphMode::kNone,
             "the model is not split at attention, so there are no pieces to capture");
    } else if (r.mode == CudaGraphMode::kFullAndPiecewise) {
      change(CudaGraphMode::kFull,
             "the model is not split at attention, so mixed batches cannot use "
             "PIECEWISE graphs");
    }
  }

  // (b) FULL captures attention for every batch: only ALWAYS allows that.
  if (r.mode == CudaGraphMode::kFull && support != AttentionCgSupport::kAlways) {
    if (support == AttentionCgSupport::kNever) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cudagraph mode FULL needs attention that supports CUDA graphs, but the "
          "attention backend declares support NEVER; use cudagraph_mode=PIECEWISE "
          "(or NONE)"));
    }
    change(piecewise_split ? CudaGraphMode::kFullAndPiecewise
                           : CudaGraphMode::kFullDecodeOnly,
           absl::StrCat("attention support is ", support_name,
                        ", so FULL graphs are kept for uniform decode batches only"));
  }

  // (c) A FULL decode routine with attention that never supports graphs.
  if (r.mode.decode_mode() == CudaGraphMode::kFull &&
      support == AttentionCgSupport::kNever) {
    change(piecewise_split ? CudaGraphMode::kPiecewise : CudaGraphMode::kNone,
           "attention support is NEVER, so no graph may contain attention");
  }

  // (d) Uniform decode with q > 1 needs UNIFORM_BATCH or better.
  if (r.mode.decode_mode() == CudaGraphMode::kFull && uniform_decode_query_len > 1 &&
      support < AttentionCgSupport::kUniformBatch) {
    change(piecewise_split ? CudaGraphMode::kPiecewise : CudaGraphMode::kNone,
           absl::StrCat("attention support is ", support_name,
                        ", which cannot capture uniform decode batches with query "
                        "length ",
                        uniform_decode_query_len, " > 1"));
  }

  // (e) Nothing FULL may remain over attention that never supports graphs.
  if (r.mode.has_full_cudagraphs() && support == AttentionCgSupport::kNever) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cudagraph mode ", r.mode.name(),
        " keeps FULL graphs but the attention backend declares support NEVER; use "
        "cudagraph_mode=PIECEWISE or NONE"));
  }
  return r;
}

}  // namespace tandem
