#include "common/kernels/cuda/cuda_ops.h"

#include <cublas_v2.h>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_check.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/kernels/cuda/kernels.h"

namespace tandem {
namespace {

namespace k = cuda_kernels;

// cuBLAS's workspace, set once so that captured GEMMs never allocate.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

k::Storage StorageOf(DType dtype) {
  switch (dtype) {
    case DType::kF16: return k::Storage::kF16;
    case DType::kBF16: return k::Storage::kBF16;
    default: return k::Storage::kF32;
  }
}

cudaDataType_t CudaTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

class CudaOps : public Ops {
 public:
  CudaOps(CudaDevice* device, DType dtype)
      : device_(device), stream_(device->cuda_stream()), dtype_(dtype), s_(StorageOf(dtype)) {}
  ~CudaOps() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }

  absl::Status Init() {
    TANDEM_CUDA_CHECK(k::PrepareKernels());
    TANDEM_CUDA_CHECK(cublasCreate(&handle_));
    TANDEM_CUDA_CHECK(cublasSetStream(handle_, stream_->raw()));
    ASSIGN_OR_RETURN(void* workspace, device_->Allocate(kCublasWorkspaceBytes));
    TANDEM_CUDA_CHECK(cublasSetWorkspace(handle_, workspace, kCublasWorkspaceBytes));
    // f32 stays f32 (no TF32), so an f32 model matches the CPU backend.
    TANDEM_CUDA_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    return absl::OkStatus();
  }

  Device* device() override { return device_; }
  DType dtype() const override { return dtype_; }
  // Both attention kernels read the number of requests, offsets, lengths and
  // block tables from buffers when they run; the mixed kernel serves any
  // batch and the decode kernel is only baked into uniform-decode graphs.
  AttentionCgSupport attention_cg_support() const override { return AttentionCgSupport::kAlways; }
  size_t AttentionWorkspaceBytes(const AttentionShape& shape, int max_num_seqs,
                                 int max_seq_len) const override {
    TANDEM_CHECK(shape.head_dim <= k::kMaxHeadDim)
        << "head_dim " << shape.head_dim << " exceeds the CUDA attention kernels' limit "
        << k::kMaxHeadDim;
    return k::DecodeWorkspaceFloats(max_num_seqs, shape.num_heads, shape.head_dim, max_seq_len) *
           sizeof(float);
  }

  void Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    TANDEM_CHECK(out.dim(0) <= ids.dim(0) && out.dim(1) == table.dim(1));
    CheckDType(table);
    CheckDType(out);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::Embedding(s_, ids.i32(), table.data, table.dim(0), table.dim(1),
                                     out.data, out.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    TANDEM_CHECK(x.dim(1) == out.dim(1) && weight.dim(0) == out.dim(1));
    CheckDType(x);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::RmsNorm(s_, x.data, nullptr, weight.data, eps, out.dim(1), out.data,
                                   out.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) override {
    TANDEM_CHECK(x.dim(1) == out.dim(1) && residual.dim(1) == out.dim(1) &&
                 weight.dim(0) == out.dim(1));
    CheckDType(x);
    CheckDType(residual);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::RmsNorm(s_, x.data, residual.data, weight.data, eps, out.dim(1),
                                   out.data, out.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void Rope(const Tensor& positions, const Tensor& qkv, const Tensor& inv_freq,
            const AttentionShape& shape) override {
    TANDEM_CHECK(inv_freq.dim(0) == shape.head_dim / 2 && inv_freq.dtype == DType::kF32);
    CheckDType(qkv);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::Rope(s_, positions.i32(), qkv.data, qkv.dim(1), inv_freq.f32(),
                                shape.num_heads + shape.num_kv_heads, shape.head_dim, qkv.dim(0),
                                raw()));
      return absl::OkStatus();
    }());
  }

  void AddBias(const Tensor& x, const Tensor& bias) override {
    TANDEM_CHECK(bias.numel() == x.dim(1)) << x.ShapeString() << " + " << bias.ShapeString();
    CheckDType(x);
    CheckDType(bias);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::AddBias(s_, x.data, bias.data, x.dim(1), x.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void HeadRmsNorm(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                   const AttentionShape& shape, float eps) override {
    TANDEM_CHECK(q_weight.numel() == shape.head_dim && k_weight.numel() == shape.head_dim);
    CheckDType(qkv);
    CheckDType(q_weight);
    CheckDType(k_weight);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::HeadRmsNorm(s_, qkv.data, qkv.dim(1), q_weight.data, k_weight.data,
                                       shape.num_heads, shape.num_kv_heads, shape.head_dim, eps,
                                       qkv.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void Matmul(const Tensor& x, const Tensor& w, const Tensor& out) override {
    const int64_t n = out.dim(0), big_n = w.dim(0), kdim = w.dim(1);
    TANDEM_CHECK(x.dim(1) == kdim && out.dim(1) == big_n && x.dim(0) >= n)
        << "matmul " << x.ShapeString() << " x " << w.ShapeString() << " -> "
        << out.ShapeString();
    CheckDType(x);
    CheckDType(w);
    if (n == 0) return;
    if (k::GemvFits(s_, x.data, w.data, n, kdim)) {
      TANDEM_CHECK(out.dtype == dtype_ || out.dtype == DType::kF32) << out.ShapeString();
      Record([&]() -> absl::Status {
        TANDEM_CUDA_CHECK(k::Gemv(s_, x.data, w.data, out.data, out.dtype != dtype_, n, big_n,
                                  kdim, raw()));
        return absl::OkStatus();
      }());
      return;
    }
    // Row-major out[n, N] = x[n, K] w[N, K]^T is column-major
    // out^T[N, n] = w^T[N, K] x^T[K, n]: A = w (transposed), B = x.
    const float alpha = 1.f, beta = 0.f;
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(big_n),
                                     static_cast<int>(n), static_cast<int>(kdim), &alpha, w.data,
                                     CudaTypeOf(w.dtype), static_cast<int>(kdim), x.data,
                                     CudaTypeOf(x.dtype), static_cast<int>(kdim), &beta, out.data,
                                     CudaTypeOf(out.dtype), static_cast<int>(big_n),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return absl::OkStatus();
    }());
  }

  void MatmulSiluMul(const Tensor& x, const Tensor& w, const Tensor& gate_up,
                     const Tensor& act) override {
    const int64_t n = act.dim(0), big_n = w.dim(0), kdim = w.dim(1);
    if (n == 0 || !k::GemvFits(s_, x.data, w.data, n, kdim) || big_n != 2 * act.dim(1) ||
        x.dim(1) != kdim || x.dtype != dtype_ || w.dtype != dtype_ || act.dtype != dtype_) {
      Ops::MatmulSiluMul(x, w, gate_up, act);
      return;
    }
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::GemvSiluMul(s_, x.data, w.data, act.data, n, big_n, kdim, raw()));
      return absl::OkStatus();
    }());
  }

  void SiluMul(const Tensor& gate_up, const Tensor& out) override {
    TANDEM_CHECK(gate_up.dim(1) == 2 * out.dim(1));
    CheckDType(gate_up);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::SiluMul(s_, gate_up.data, out.dim(1), out.data, out.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void GatherRows(const Tensor& src, const Tensor& indices, const Tensor& out) override {
    TANDEM_CHECK(src.dim(1) == out.dim(1));
    CheckDType(src);
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::GatherRows(s_, src.data, indices.i32(), out.dim(1), out.data,
                                      out.dim(0), raw()));
      return absl::OkStatus();
    }());
  }

  void PagedAttention(const Tensor& qkv, const KvLayer& cache, const AttentionMetadata& meta,
                      const AttentionShape& shape, const Tensor& out) override {
    const int nh = shape.num_heads, nkv = shape.num_kv_heads, hd = shape.head_dim;
    TANDEM_CHECK(out.dim(1) == nh * hd && qkv.dim(1) == (nh + 2 * nkv) * hd && nh % nkv == 0 &&
                 hd <= k::kMaxHeadDim);
    CheckDType(qkv);
    CheckDType(cache.k);
    k::PagedAttentionArgs a;
    a.qkv = qkv.data;
    a.k_cache = cache.k.data;
    a.v_cache = cache.v.data;
    a.out = out.data;
    a.num_reqs = meta.num_reqs.i32();
    a.query_start_loc = meta.query_start_loc.i32();
    a.seq_lens = meta.seq_lens.i32();
    a.block_tables = meta.block_tables.i32();
    a.slot_mapping = meta.slot_mapping.i32();
    a.workspace = static_cast<float*>(meta.workspace.data);
    a.n = qkv.dim(0);
    a.max_num_seqs = static_cast<int>(meta.seq_lens.dim(0));
    a.table_width = static_cast<int>(meta.block_tables.dim(1));
    a.block_size = meta.block_size;
    a.num_heads = nh;
    a.num_kv_heads = nkv;
    a.head_dim = hd;
    a.scale = shape.scale;
    a.sliding_window = shape.sliding_window;
    const int max_seq_len = a.table_width * meta.block_size;
    Record([&]() -> absl::Status {
      TANDEM_CUDA_CHECK(k::WriteKvCache(s_, a, raw()));
      if (meta.decode_only) {
        TANDEM_CHECK(a.workspace != nullptr) << "decode attention needs the runner's workspace";
        TANDEM_CUDA_CHECK(k::DecodeAttention(s_, a, max_seq_len, raw()));
      } else {
        TANDEM_CUDA_CHECK(k::MixedAttention(s_, a, raw()));
      }
      return absl::OkStatus();
    }());
  }

 private:
  cudaStream_t raw() const { return stream_->raw(); }
  void Record(absl::Status status) { stream_->RecordError(std::move(status)); }
  void CheckDType(const Tensor& t) const {
    TANDEM_CHECK(t.dtype == dtype_) << t.ShapeString() << " on a " << DTypeName(dtype_)
                                    << " CUDA backend";
  }

  CudaDevice* device_;
  CudaStream* stream_;
  DType dtype_;
  k::Storage s_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Ops>> CreateCudaOps(CudaDevice* device, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend stores f32, f16 or bf16, not ", DTypeName(dtype)));
  }
  auto ops = std::make_unique<CudaOps>(device, dtype);
  RETURN_IF_ERROR(ops->Init());
  return std::unique_ptr<Ops>(std::move(ops));
}

}  // namespace tandem
