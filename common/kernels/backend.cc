#include "common/kernels/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

std::string ExecutableDir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  std::string path(buf.data(), static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Opens the CUDA module once per process; never closed (the objects it
// creates live as long as the process may use them).
absl::StatusOr<CreateCudaBackendFn> LoadCudaModule() {
  static std::once_flag once;
  static absl::StatusOr<CreateCudaBackendFn> entry = absl::UnknownError("not loaded");
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("TANDEM_CUDA_MODULE"); env != nullptr && *env != '\0') {
      candidates.push_back(env);
    } else {
      const std::string dir = ExecutableDir();
      candidates = {dir + "/../lib/" + kCudaModuleName, dir + "/" + kCudaModuleName,
                    kCudaModuleName};
    }
    std::vector<std::string> errors;
    for (const std::string& path : candidates) {
      const bool explicit_path = path.find('/') != std::string::npos;
      if (explicit_path && access(path.c_str(), F_OK) != 0) {
        errors.push_back(absl::StrCat(path, ": not found"));
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        errors.push_back(dlerror());
        if (explicit_path) break;  // the module exists but cannot load: say why
        continue;
      }
      auto fn = reinterpret_cast<CreateCudaBackendFn>(dlsym(handle, kCudaModuleEntry));
      if (fn == nullptr) {
        errors.push_back(absl::StrCat(path, ": no symbol ", kCudaModuleEntry));
        break;
      }
      TANDEM_LOG(INFO) << "loaded the CUDA backend from " << path;
      entry = fn;
      return;
    }
    entry = absl::FailedPreconditionError(absl::StrCat(
        "device=cuda: cannot load the CUDA backend module (", absl::StrJoin(errors, "; "),
        "); build with the CUDA toolkit (TANDEM_ENABLE_CUDA=ON) or use device=cpu"));
  });
  return entry;
}

}  // namespace

absl::StatusOr<DType> ParseStorageDType(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype must be auto, f32, bf16 or f16, got '", name, "'"));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, got '", options.device, "'"));
  }
  const bool cpu = options.device == "cpu";
  DType dtype = cpu ? DType::kF32 : DType::kBF16;
  if (options.dtype != "auto") {
    auto parsed = ParseStorageDType(options.dtype);
    if (!parsed.ok()) return parsed.status();
    dtype = *parsed;
  }
  if (options.weight_dtype != "auto" && options.weight_dtype != "dense" &&
      options.weight_dtype != "q8_0" && options.weight_dtype != "gguf") {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_dtype must be auto, dense, q8_0 or gguf, got '", options.weight_dtype, "'"));
  }
  const bool q8 = options.weight_dtype == "q8_0";
  // A file runs as stored by default: widening a Q4 GGUF to f32 would make
  // every decode step stream 6x its bytes.
  const bool keep_blocks =
      options.weight_dtype == "gguf" || (cpu && options.weight_dtype == "auto");
  if ((q8 || keep_blocks) && !cpu) {
    return absl::InvalidArgumentError(absl::StrCat("weight_dtype=", options.weight_dtype,
                                                   " is implemented on device=cpu only; use "
                                                   "weight_dtype=auto"));
  }
  auto backend = std::make_unique<Backend>();
  if (cpu) {
    // The CPU computes in f32; bf16 is the storage of weights and KV.
    if (dtype == DType::kF16) {
      return absl::InvalidArgumentError(
          "dtype=f16 is not supported by device=cpu (use f32, bf16 or auto)");
    }
    const DType weights = q8 ? DType::kQ8_0 : dtype;
    backend->device = CreateCpuDevice(options.debug_async_kv_reads);
    auto ops = CreateCpuOps(backend->device.get(), options.threads, weights, dtype, keep_blocks);
    if (!ops.ok()) return ops.status();
    backend->ops = std::move(*ops);
    return backend;
  }
  auto create = LoadCudaModule();
  if (!create.ok()) return create.status();
  absl::Status status;
  (*create)(dtype, backend.get(), &status);
  if (!status.ok()) return status;
  return backend;
}

}  // namespace tandem
