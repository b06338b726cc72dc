// BatchDescriptor: vLLM's dispatch key (vllm/forward_context.py), the minimal
// description of a padded batch that identifies one captured graph.
//
//   num_tokens  padded token count of the step
//   num_reqs    request count; absent in relaxed (mixed-batch) keys
//   uniform     every request has the same query length (uniform decode)
//   has_lora    LoRA adapters are active
//
// Hashable (absl::Hash), a value type.
#ifndef TANDEM_COMMON_GRAPH_BATCH_DESCRIPTOR_H_
#define TANDEM_COMMON_GRAPH_BATCH_DESCRIPTOR_H_

#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace tandem {

struct BatchDescriptor {
  int num_tokens = 0;
  std::optional<int> num_reqs;
  bool uniform = false;
  bool has_lora = false;

  BatchDescriptor() = default;
  // Upstream's BatchDescriptor(num_tokens): no num_reqs, not uniform, no LoRA.
  explicit BatchDescriptor(int tokens) : num_tokens(tokens) {}
  BatchDescriptor(int tokens, std::optional<int> reqs, bool is_uniform,
                  bool lora)
      : num_tokens(tokens), num_reqs(reqs), uniform(is_uniform), has_lora(lora) {}

  // Upstream relax_for_mixed_batch_cudagraphs(): keeps num_tokens and
  // has_lora, drops num_reqs, sets uniform=false. Mixed-batch graphs are keyed
  // on this form so any request split of the same padded size hits them.
  BatchDescriptor Relaxed() const {
    return BatchDescriptor(num_tokens, std::nullopt, false, has_lora);
  }

  // "BatchDescriptor(num_tokens=8, num_reqs=8, uniform=True, has_lora=False)"
  std::string ToString() const;

  friend bool operator==(const BatchDescriptor& a, const BatchDescriptor& b) {
    return a.num_tokens == b.num_tokens && a.num_reqs == b.num_reqs &&
           a.uniform == b.uniform && a.has_lora == b.has_lora;
  }
  friend bool operator!=(const BatchDescriptor& a, const BatchDescriptor& b) {
    return !(a == b);
  }
  template <typename H>
  friend H AbslHashValue(H h, const BatchDescriptor& d) {
    return H::combine(std::move(h), d.num_tokens, d.num_reqs.has_value(),
                      d.num_reqs.value_or(0), d.uniform, d.has_lora);
  }
};

std::ostream& operator<<(std::ostream& os, const BatchDescriptor& d);

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_BATCH_DESCRIPTOR_H_
