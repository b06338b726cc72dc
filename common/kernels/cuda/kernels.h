// Launchers of the CUDA kernels of the model's ops (kernels.cu). Host-side
// declarations only, free of CUDA and Abseil types beyond cudaStream_t so both
// nvcc and the host compiler read them.
//
// Storage is f32, f16 or bf16 (`Storage`); every kernel accumulates in f32.
// Data-dependent inputs (token ids, positions, slots, attention metadata) are
// read from device buffers when the kernel runs, never passed by value, so a
// captured graph serves new inputs. Each launcher returns cudaGetLastError().
#ifndef TANDEM_COMMON_KERNELS_CUDA_KERNELS_H_
#define TANDEM_COMMON_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem {
namespace cuda_kernels {

enum class Storage { kF32, kF16, kBF16 };

// Sets the kernels' launch attributes for the current device (shared-memory
// opt-ins of the tensor-core kernels, which need sm_80 or later); called once
// by the backend before any launch, never while a stream captures.
cudaError_t PrepareKernels();

// out[i, :] = table[clamp(ids[i]), :] for i < n.
cudaError_t Embedding(Storage s, const int32_t* ids, const void* table, int64_t vocab,
                      int64_t hidden, void* out, int64_t n, cudaStream_t stream);

// Per row: out = x * rsqrt(mean(x^2) + eps) * weight. With `residual`
// (fused add): residual += x first and the norm is taken of the sum.
cudaError_t RmsNorm(Storage s, const void* x, void* residual, const void* weight, float eps,
                    int64_t hidden, void* out, int64_t n, cudaStream_t stream);

// Rotate-half RoPE of the q and k heads of packed qkv rows, in place.
cudaError_t Rope(Storage s, const int32_t* positions, void* qkv, int64_t row_stride,
                 const float* inv_freq, int num_rotated_heads, int head_dim, int64_t n,
                 cudaStream_t stream);

// x[i, j] += bias[j] for i < n, j < width.
cudaError_t AddBias(Storage s, void* x, const void* bias, int64_t width, int64_t n,
                    cudaStream_t stream);

// In place, per head of packed qkv rows: RMSNorm of each of the first
// `q_heads` heads with q_weight[head_dim], of the next `k_heads` with
// k_weight.
cudaError_t HeadRmsNorm(Storage s, void* qkv, int64_t row_stride, const void* q_weight,
                        const void* k_weight, int q_heads, int k_heads, int head_dim, float eps,
                        int64_t n, cudaStream_t stream);

// out[i, j] = silu(gate_up[i, j]) * gate_up[i, inter + j].
cudaError_t SiluMul(Storage s, const void* gate_up, int64_t inter, void* out, int64_t n,
                    cudaStream_t stream);

// out[i, :] = src[indices[i], :] for i < rows.
cudaError_t GatherRows(Storage s, const void* src, const int32_t* indices, int64_t width,
                       void* out, int64_t rows, cudaStream_t stream);

// Small-batch matmul, out[m, n] = x[m, k] . w[n, k]^T for 1 <= m <=
// kMaxGemvRows: each weight row is streamed once with 16-byte loads and
// multiplied against every row of x in registers (cuBLAS picks GEMM tiles
// for these shapes that read the weights at well under the memory's rate).
// Measured on an H100 (docs/benchmarks.md): a whole decode step of
// llama-3.2-1b at batch 1 1.78 -> 1.41 ms, equal at 2 and 4, slower than
// cuBLAS at 8 (2.26 -> 2.74 ms: eight rows of x per weight vector make the
// CUDA cores, not memory, the limit), hence at most 4 rows.
// `out` is the storage type or f32 (`out_f32`, the logits). Needs k a
// multiple of 16 bytes' elements and 16-byte aligned rows (GemvFits).
inline constexpr int kMaxGemvRows = 4;
bool GemvFits(Storage s, const void* x, const void* w, int64_t m, int64_t k);
cudaError_t Gemv(Storage s, const void* x, const void* w, void* out, bool out_f32, int64_t m,
                 int64_t n, int64_t k, cudaStream_t stream);

// act[m, n/2] = SiluMul(x . w^T) for w of gate rows then up rows (n in
// all), the same bounds as Gemv and bit for bit what Gemv then SiluMul give;
// the gate_up product never goes through memory.
cudaError_t GemvSiluMul(Storage s, const void* x, const void* w, void* act, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream);

struct PagedAttentionArgs {
  const void* qkv;  // [n, (heads + 2 * kv_heads) * head_dim]
  void* k_cache;    // [blocks, block_size, kv_heads, head_dim]
  void* v_cache;
  void* out;        // [n, heads * head_dim]
  const int32_t* num_reqs;
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;  // [max_num_seqs, table_width]
  const int32_t* slot_mapping;
  float* workspace;  // decode: DecodeWorkspaceFloats(...) floats
  int64_t n = 0;     // rows (tokens, padded)
  int max_num_seqs = 0;  // rows of block_tables and seq_lens
  int table_width = 0;
  int block_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.f;
  int sliding_window = 0;  // keys a query sees, itself included; 0: all
};

// Largest head_dim the attention kernels support.
inline constexpr int kMaxHeadDim = 256;
// The decode kernel splits each request's context over at most
// kDecodeSplits blocks per head, of at least kMinDecodePartition keys.
inline constexpr int kDecodeSplits = 16;
inline constexpr int kMinDecodePartition = 32;

// Writes the step's k and v into the cache at slot_mapping (-1: skipped).
cudaError_t WriteKvCache(Storage s, const PagedAttentionArgs& a, cudaStream_t stream);

// Mixed batches: each query token attends causally over its request's cached
// context. On sm_80 and later with 16-bit storage and head_dim 64 or 128, 64
// query rows of one request and one head run as FlashAttention-2 on tensor
// cores; other tiles take blocks of 16 rows on CUDA cores. Rows past
// query_start_loc[num_reqs] get zeros.
cudaError_t MixedAttention(Storage s, const PagedAttentionArgs& a, cudaStream_t stream);

// Uniform decode (one query token per request, row r = request r): each
// request's context is split into up to kDecodeSplits parts sized to its
// length, one block per (head, request, part), then a reduction kernel
// merges the parts. The grid is fixed by `max_seq_len` (graph-safe); parts
// past a request's length exit at once.
cudaError_t DecodeAttention(Storage s, const PagedAttentionArgs& a, int max_seq_len,
                            cudaStream_t stream);
size_t DecodeWorkspaceFloats(int max_num_seqs, int num_heads, int head_dim, int max_seq_len);

}  // namespace cuda_kernels
}  // namespace tandem

#endif  // TANDEM_COMMON_KERNELS_CUDA_KERNELS_H_
