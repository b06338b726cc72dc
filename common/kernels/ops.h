// Ops: the model's operations, issued on the device's stream.
//
// Every op is asynchronous with respect to the host: it is issued on
// device()->stream() and, while that stream is capturing, recorded into the
// graph instead of run. An op must therefore read its data-dependent inputs
// (token ids, positions, attention metadata) from buffers when it runs, never
// from host values computed when it was issued; only shapes are fixed at
// issue time. This is what lets a replayed graph serve new inputs.
//
// Shapes are checked when an op is issued (TANDEM_CHECK: a mismatch is a
// programming error in the model, not a user error).
//
// Implementations: CPU (BLAS) in kernels/cpu, CUDA (cuBLAS) in kernels/cuda.
// Used from the engine thread only.
#ifndef TANDEM_COMMON_KERNELS_OPS_H_
#define TANDEM_COMMON_KERNELS_OPS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"

#include "common/backend/device.h"
#include "common/backend/tensor.h"
#include "common/base/logging.h"
#include "common/graph/attention_support.h"

namespace tandem {

// One weight's LoRA adapters, stacked (LoraSet in common/model/lora.h): S
// adapters, each with `rank` rows of A and B per module of the weight (a
// fused weight has several: q, k, v of qkv), R = rank x modules.
struct LoraWeights {
  Tensor a;   // bf16[S, R, in]: module m's A in rows [m * rank, (m + 1) * rank)
  Tensor bt;  // bf16[S, R, out]: B transposed, its scale folded in; row m * rank + t
              // is zero outside module m's output columns
  int64_t rank = 0;
  std::vector<int64_t> splits;  // module m's output columns [splits[m], splits[m + 1])
  // Host memory, [S, modules]: the rank adapter s has on module m (0: it does
  // not target it), its rows past that being zero, which LoraAdd skips; read
  // when the op runs (a replay sees slots loaded since). Null: `rank` for all.
  const int32_t* slot_ranks = nullptr;
};

// Attention metadata in persistent buffers, read by the attention op when it
// runs (so a FULL graph that contains attention stays valid as they change).
struct AttentionMetadata {
  Tensor num_reqs;         // i32[1]: requests in the step (unpadded)
  Tensor query_start_loc;  // i32[max_num_seqs + 1]: token offset of each request
  Tensor seq_lens;         // i32[max_num_seqs]: context + query length
  Tensor block_tables;     // i32[max_num_seqs, max_blocks_per_seq]
  Tensor slot_mapping;     // i32[max_num_tokens]: KV slot per token, -1 = padding
  Tensor workspace;        // Ops::AttentionWorkspaceBytes() of scratch
  int block_size = 16;
  // Issue-time: every request of the step has exactly one query token
  // (uniform decode). A backend may pick a decode-only kernel; a FULL graph
  // captured that way is replayed only for uniform-decode batches.
  bool decode_only = false;
};

// One layer's paged KV cache: dtype()[num_blocks, block_size, num_kv_heads, head_dim].
struct KvLayer {
  Tensor k;
  Tensor v;
};

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.f;
  // Sliding-window attention: a query sees only the last `sliding_window`
  // keys, itself included (transformers' kv_idx > q_idx - sliding_window,
  // vLLM's window of sliding_window - 1 keys to the left); 0: every key.
  int sliding_window = 0;
};

// A sparse layer's experts (Qwen2-MoE, Qwen3-MoE), in the layout the model
// loads.
struct MoeWeights {
  Tensor router;   // [E, H], activation dtype
  Tensor gate_up;  // [E * 2 * I, H]: expert e's gate rows, then its up rows, at row e * 2I
  Tensor down;     // [E * H, I]: expert e's rows at e * H
  int top_k = 0;
  bool renormalize = false;  // the chosen experts' scores divided by their sum
  // The shared expert every token takes (Qwen2-MoE), or none (data null).
  Tensor shared_gate_up;  // [2 * S, H]
  Tensor shared_down;     // [H, S]
  Tensor shared_gate;     // [1, H], activation dtype: sigmoid(x . shared_gate) weighs it
};

// MoeMlp's scratch in the runner's persistent buffers, T = the step's rows,
// W = the wider of the experts' width I and the shared expert's S.
struct MoeBuffers {
  Tensor router_logits;  // f32[T, E]
  Tensor x;              // [T, H]: the rows routed to one expert
  Tensor gate_up;        // [T, 2 * W]
  Tensor act;            // [T, W]
  Tensor y;              // [T, H]: that expert's output rows
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device* device() = 0;
  // Storage dtype of weights, activations and the KV cache (f32, f16 or
  // bf16); arithmetic accumulates in f32 and logits are always f32.
  virtual DType dtype() const = 0;
  // Dtype of the matmul weights (and the embedding table they may share): the
  // storage dtype, or kQ8_0 on a CPU backend asked for weight-only 8-bit
  // (see also keeps_file_blocks()).
  virtual DType weight_dtype() const { return dtype(); }
  // Dtype of the KV cache: the storage dtype, or bf16 on a CPU backend that
  // computes in f32 over bf16 weights and KV.
  virtual DType kv_dtype() const { return dtype(); }
  // Whether matmul weights a model file holds in a block type the ops
  // multiply directly (GGUF Q4_0, Q4_1, Q8_0) stay in it, whatever
  // weight_dtype() says for the others.
  virtual bool keeps_file_blocks() const { return false; }
  // How much of PagedAttention a graph may contain (declared honestly: the
  // mode resolution at start-up trusts it).
  virtual AttentionCgSupport attention_cg_support() const = 0;
  // Scratch PagedAttention needs in AttentionMetadata::workspace for up to
  // `max_num_seqs` requests of up to `max_seq_len` tokens (allocated once, at
  // start-up, with the runner's buffers).
  virtual size_t AttentionWorkspaceBytes(const AttentionShape& shape, int max_num_seqs,
                                         int max_seq_len) const = 0;

  // out[i, :] = table[ids[i], :]
  virtual void Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // out = x / rms(x) * weight, per row.
  virtual void RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) = 0;
  // residual += x; out = rmsnorm(residual) * weight (vLLM fused_add_rms_norm).
  virtual void AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          float eps, const Tensor& out) = 0;
  // Rotates, in place, the q and k heads of packed qkv rows
  // [q (num_heads * head_dim) | k (num_kv_heads * head_dim) | v ...] at
  // positions[i], with rotate-half (Llama/NeoX) layout and inv_freq[head_dim/2].
  virtual void Rope(const Tensor& positions, const Tensor& qkv, const Tensor& inv_freq,
                    const AttentionShape& shape) = 0;
  // out[n, N] = x[n, K] * w[N, K]^T
  virtual void Matmul(const Tensor& x, const Tensor& w, const Tensor& out) = 0;
  // x[i, :] += bias for every row of x (Qwen2's q/k/v projection biases).
  virtual void AddBias(const Tensor& x, const Tensor& bias) = 0;
  // RMSNorm over each head of packed qkv rows, in place: the q heads with
  // q_weight[head_dim], the k heads with k_weight (Qwen3's q_norm/k_norm,
  // taken before RoPE); v is left as it is.
  virtual void HeadRmsNorm(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                           const AttentionShape& shape, float eps) = 0;
  // out[n, I] = silu(gate_up[n, :I]) * gate_up[n, I:]
  virtual void SiluMul(const Tensor& gate_up, const Tensor& out) = 0;
  // act = SiluMul(gate_up) with gate_up = x . w^T (w: the gate rows, then the
  // up rows), in one call so that a backend may leave the gate_up scratch
  // unwritten (the CUDA backend does at decode sizes).
  virtual void MatmulSiluMul(const Tensor& x, const Tensor& w, const Tensor& gate_up,
                             const Tensor& act) {
    Matmul(x, w, gate_up);
    SiluMul(gate_up, act);
  }
  // Whether MoeMlp is implemented (the model refuses experts otherwise).
  virtual bool supports_experts() const { return false; }
  // out[n, H] = sum over the top_k experts e of softmax(x . router^T) of
  // score_e * down_e(silu(gate_e x) * up_e x), per row (Qwen3-MoE's sparse
  // block), + sigmoid(x . shared_gate) * the shared expert's MLP of x where
  // there is one (Qwen2-MoE's). Routing is computed when the op runs, from x;
  // rows past query_start_loc[num_reqs] of `meta` are padding: not routed
  // (a graph's padding would send its rows to experts no token asked for),
  // their output zero.
  virtual void MoeMlp(const Tensor& x, const MoeWeights& w, const MoeBuffers& scratch,
                      const AttentionMetadata& meta, const Tensor& out) {
    TANDEM_CHECK(false) << "MoeMlp on a backend without experts";  // Load() refuses first
  }
  // Whether LoraAdd is implemented (the engine refuses LoRA adapters otherwise).
  virtual bool supports_lora() const { return false; }
  // out[t, :] += (w.a[s - 1] . x[t, :]) . w.bt[s - 1] for each row t of x
  // whose slot s = slots[t] (read when the op runs) is not 0; rows of slot 0
  // (the base model, and padding) are left as they are. scratch: at least
  // rows x R floats.
  virtual void LoraAdd(const Tensor& x, const Tensor& slots, const LoraWeights& w,
                       const Tensor& scratch, const Tensor& out) {
    TANDEM_CHECK(false) << "LoraAdd on a backend without LoRA";  // the engine refuses first
  }
  // out[i, :] = src[indices[i], :] for the first `rows` rows of out.
  virtual void GatherRows(const Tensor& src, const Tensor& indices, const Tensor& out) = 0;
  // Writes the k and v of packed qkv rows into the paged cache at
  // slot_mapping, then causal grouped-query attention of each request's query
  // tokens over its cached context. Rows past query_start_loc[num_reqs] are
  // padding: their output is zero.
  virtual void PagedAttention(const Tensor& qkv, const KvLayer& cache,
                              const AttentionMetadata& meta, const AttentionShape& shape,
                              const Tensor& out) = 0;
};

// CPU ops on the device's CpuStream, each split over a pool of `threads`
// threads (<= 0: every CPU this process may use); activations in f32, matmul
// weights in `weight_dtype` (kF32, kBF16 or kQ8_0) unless `keep_file_blocks`
// keeps a file's own block types, the KV cache in `kv_dtype` (kF32 or kBF16).
// The kernels run on the best Highway target the CPU supports, or on the one
// TANDEM_CPU_TARGET names (benchmarks); InvalidArgument for a target the CPU
// cannot run.
absl::StatusOr<std::unique_ptr<Ops>> CreateCpuOps(Device* cpu_device, int threads,
                                                  DType weight_dtype = DType::kF32,
                                                  DType kv_dtype = DType::kF32,
                                                  bool keep_file_blocks = false);

}  // namespace tandem

#endif  // TANDEM_COMMON_KERNELS_OPS_H_
