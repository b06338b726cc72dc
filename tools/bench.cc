#include "tools/bench.h"
#include "tools/compute_probe.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_stream.h"
#include "common/base/flags.h"
#include "common/base/thread_pool.h"
#include "absl/strings/str_format.h"
#include "common/engine/engine.h"
#include "common/kernels/cpu/cpu_kernels.h"
#include "common/serving/engine_flags.h"

namespace tandem {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "tandem bench: " << s.message() << std::endl;
  return 2;
}

struct Timing {
  CudaGraphMode mode;
  double median_ms = 0;
};

// The median wall time in ms of `iters` runs of `run` after `warmup` untimed
// ones; stops at the first error `run` returns.
template <typename Fn>
absl::StatusOr<double> MedianMs(int warmup, int iters, Fn run) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = run(); !s.ok()) return s;
    const double took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i >= warmup) ms.push_back(took);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median wall time of `iters` runs of one step (after 2 warm-up runs).
absl::StatusOr<Timing> TimeStep(ModelRunner& runner, const std::vector<ScheduledSeq>& batch,
                                bool eager, int iters) {
  Timing t;
  auto ms = MedianMs(2, iters, [&]() -> absl::Status {
    auto r = runner.Execute(batch, eager);
    if (!r.ok()) return r.status();
    t.mode = r->runtime_mode;
    return absl::OkStatus();
  });
  if (!ms.ok()) return ms.status();
  t.median_ms = *ms;
  return t;
}

// The floor of a memory-bound decode step: the median time to read the
// weights a decode step streams (StreamedWeights) once, with `threads`
// threads over 1 MiB spans, as the CPU kernels read them. A model with
// experts streams as many of them as one token is routed to (each sparse
// layer's first top_k, standing in for a token's): the batch-1 floor.
struct ReadProbe {
  double bytes = 0;
  double median_ms = 0;
};
ReadProbe MeasureWeightRead(const LlamaModel& model, int threads, int iters) {
  struct Span {
    const float* p;
    int64_t n;
  };
  std::vector<Span> spans;
  ReadProbe probe;
  std::vector<Tensor> streamed = model.StreamedWeights();
  for (const Tensor& t : model.RoutedExpertsOfOneToken()) streamed.push_back(t);
  for (const Tensor& t : streamed) {
    const int64_t n = static_cast<int64_t>(t.nbytes() / sizeof(float));
    probe.bytes += static_cast<double>(t.nbytes());
    for (int64_t i = 0; i < n; i += int64_t{1} << 18) {
      spans.push_back({t.f32() + i, std::min<int64_t>(int64_t{1} << 18, n - i)});
    }
  }
  ThreadPool pool(threads);
  std::vector<float> sums(spans.size());
  // The first run warms the TLB.
  probe.median_ms = *MedianMs(1, iters, [&] {
    pool.ParallelFor(static_cast<int64_t>(spans.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sums[i] = cpu::Dot(spans[i].p, spans[i].p, spans[i].n);
    });
    return absl::OkStatus();
  });
  return probe;
}

// The machine's BLAS as a yardstick: the median time of OpenBLAS sgemm
// (f32, split over `threads` by output columns as the engine splits its
// matmuls) for `rows` rows against an [N, K] weight shaped like the model's
// largest layer matmul.
struct SgemmProbe {
  int64_t m = 0, n = 0, k = 0;
  double gflops = 0;
};
SgemmProbe MeasureSgemm(int threads, int64_t rows, int64_t big_n, int64_t k, int iters) {
  std::vector<float> x(rows * k), w(big_n * k), out(rows * big_n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.01f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.01f;
  ThreadPool pool(threads);
  openblas_set_num_threads(1);
  const double ms = *MedianMs(1, iters, [&] {
    pool.ParallelFor(big_n, 16, [&](int64_t j0, int64_t j1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, j1 - j0, k, 1.f, x.data(), k,
                  w.data() + j0 * k, k, 0.f, out.data() + j0, big_n);
    });
    return absl::OkStatus();
  });
  return {rows, big_n, k, 2.0 * rows * big_n * k / (ms * 1e6)};
}

// FLOPs of one step's matmuls: every token through every layer, and the
// LM head for the `sampled` rows only.
double MatmulFlops(const LlamaConfig& c, int tokens, int sampled) {
  const double h = c.hidden_size, q = double(c.num_attention_heads) * c.head_dim;
  const double attention = h * c.qkv_size() + q * h;
  // A sparse layer: its router, the experts each token is routed to and the
  // shared expert it always takes.
  const double sparse_mlp = h * c.num_experts + 3.0 * h *
                                                    (double(c.num_experts_per_tok) *
                                                         c.moe_intermediate_size +
                                                     c.shared_expert_intermediate_size);
  double layers = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    layers += attention + (c.IsSparseLayer(i) ? sparse_mlp : 3.0 * h * c.intermediate_size);
  }
  return 2.0 * tokens * layers + 2.0 * sampled * h * c.vocab_size;
}

int RunStep(const std::vector<std::string>& args) {
  FlagSet flags("tandem bench step");
  EngineFlags engine_flags("FULL_AND_PIECEWISE");
  engine_flags.Register(&flags);
  std::string batch_sizes = "1,8,32";
  std::string prefill_tokens = "128,512";
  int context = 64;
  int iters = 20;
  flags.Add("batch-sizes", &batch_sizes, "decode batch sizes");
  flags.Add("prefill-tokens", &prefill_tokens, "prefill token counts");
  flags.Add("context", &context, "tokens already cached per decoding request");
  flags.Add("iters", &iters, "timed runs per figure (median reported)");
  std::string lora_name;
  flags.Add("lora-name", &lora_name,
            "every sequence runs with this --lora-modules adapter (empty: the base model)");
  if (auto code = ParseCommandLine(&flags, args)) return *code;
  auto batches = ParseIntList(batch_sizes, "--batch-sizes");
  if (!batches.ok()) return Fail(batches.status());
  auto prefills = ParseIntList(prefill_tokens, "--prefill-tokens");
  if (!prefills.ok()) return Fail(prefills.status());
  auto config = engine_flags.ToConfig(flags);
  if (!config.ok()) return Fail(config.status());
  int max_batch = 1, max_prefill = 1;
  for (int b : *batches) max_batch = std::max(max_batch, b);
  for (int p : *prefills) max_prefill = std::max(max_prefill, p);
  const int q = config->speculative.query_len();  // 1 without --speculative-config
  if (!flags.IsSet("max-num-seqs")) config->runner.max_num_seqs = std::max(max_batch, 1);
  if (!flags.IsSet("max-num-batched-tokens")) {
    config->runner.max_num_batched_tokens = std::max({max_prefill, max_batch * q, 2048});
  }
  if (!flags.IsSet("capture-sizes") && !flags.IsSet("max-capture-size")) {
    // Cover the measured shapes with graphs.
    config->runner.graph.max_capture_size = std::max({max_prefill, 2 * max_batch, max_batch * q});
  }
  if (!flags.IsSet("max-model-len")) config->runner.max_model_len = std::max(max_prefill, context + q) + 16;
  if (!flags.IsSet("num-kv-blocks") && !flags.IsSet("kv-cache-mb")) {
    // Exactly the blocks the largest decode batch or the longest prefill holds.
    const int bs = config->block_size;
    config->num_kv_blocks = std::max(max_batch * ((context + q + bs - 1) / bs),
                                     (max_prefill + bs - 1) / bs);
  }
  auto engine = LlmEngine::Create(*config);
  if (!engine.ok()) return Fail(engine.status());
  ModelRunner& runner = (*engine)->runner();
  KvCache& kv = (*engine)->kv_cache();
  const absl::StatusOr<LoraRef> lora = (*engine)->lora().Find(lora_name);
  if (!lora.ok()) return Fail(lora.status());
  const int lora_slot = lora->slot;

  const int threads =
      config->backend.threads > 0 ? config->backend.threads : ThreadPool::AvailableCpus();
  std::printf("model %s | device %s | weights %s | KV %s | mode %s | threads %d | median of %d\n",
              config->model.c_str(), (*engine)->device_name().c_str(),
              runner.model().WeightDTypes().c_str(),
              std::string(DTypeName(kv.dtype())).c_str(),
              std::string(runner.resolved_mode().name()).c_str(), threads, iters);
  ReadProbe probe;
  SgemmProbe sgemm;
  double fma_peak = 0;  // the compute probe's f32 FMA rate, GFLOP/s
  const bool cpu = config->backend.device == "cpu";
  const LlamaConfig& mc = (*engine)->model_config();
  if (cpu) {
    probe = MeasureWeightRead(runner.model(), threads, std::max(iters, 5));
    std::printf("read probe: a decode step streams %.1f MB of weights%s; reading them once takes "
                "%.3f ms (%.1f GB/s, %d threads)\n",
                probe.bytes / 1e6,
                mc.num_experts > 0
                    ? absl::StrFormat(" (one token's %d of %d experts a sparse layer)",
                                      mc.num_experts_per_tok, mc.num_experts)
                          .c_str()
                    : "",
                probe.median_ms, probe.bytes / probe.median_ms / 1e6, threads);
    sgemm = MeasureSgemm(threads, max_prefill, 2 * mc.intermediate_size, mc.hidden_size,
                         std::max(iters, 3));
    std::printf("sgemm probe: OpenBLAS (%s kernels) [%ld x %ld] x [%ld x %ld]^T at %.1f GFLOP/s "
                "(%d threads)\n",
                openblas_get_corename(),
                static_cast<long>(sgemm.m), static_cast<long>(sgemm.k),
                static_cast<long>(sgemm.n), static_cast<long>(sgemm.k), sgemm.gflops, threads);
    for (const ComputePeak& p : MeasureComputePeaks(threads, 0.3)) {
      std::printf("compute probe: %s, %s: %.1f %s (%d threads)\n", p.form.c_str(),
                  p.instruction.c_str(), p.gops, p.form == "int8 dot" ? "GOP/s" : "GFLOP/s",
                  threads);
      if (p.form == "f32 FMA") fma_peak = p.gops;
    }
  }
  std::printf("%-8s %7s %6s %-10s %10s %10s %8s %8s %8s %8s %7s %6s\n", "step", "tokens", "batch",
              "graph", "graph_ms", "eager_ms", "speedup", "x_probe", "GFLOP/s", "x_sgemm", "x_fma",
              "attn");
  std::vector<int32_t> tokens(std::max(max_prefill, max_batch * q), 7);
  CpuStream* stream = cpu ? static_cast<CpuStream*>((*engine)->backend().device->stream()) : nullptr;
  auto report = [&](const char* kind, int n_tokens, int batch,
                    const std::vector<ScheduledSeq>& seqs) -> absl::Status {
    auto graph = TimeStep(runner, seqs, false, iters);
    if (!graph.ok()) return graph.status();
    auto eager = TimeStep(runner, seqs, true, iters);
    if (!eager.ok()) return eager.status();
    const bool decode = std::string(kind) != "prefill";  // decode or verify
    const int sampled = std::string(kind) == "verify" ? n_tokens : batch;
    const double gflops = MatmulFlops(mc, n_tokens, sampled) / (graph->median_ms * 1e6);
    std::string attn = "-";
    if (stream != nullptr) {
      // One more run with the op profile on: attention's share of the ops' time.
      stream->ClearOpTimes();
      stream->set_profiling(true);
      auto r = runner.Execute(seqs, false);
      stream->set_profiling(false);
      if (!r.ok()) return r.status();
      double total = 0, attention = 0;
      for (const CpuStream::OpTime& t : stream->op_times()) {
        total += t.seconds;
        if (std::string(t.kind) == "attention") attention += t.seconds;
      }
      if (total > 0) attn = absl::StrFormat("%.0f%%", 100 * attention / total);
    }
    std::printf("%-8s %7d %6d %-10s %10.3f %10.3f %7.2fx %8s %8.1f %8s %7s %6s\n", kind, n_tokens,
                batch, std::string(graph->mode.name()).c_str(), graph->median_ms,
                eager->median_ms, eager->median_ms / graph->median_ms,
                decode && probe.median_ms > 0
                    ? absl::StrFormat("%.2fx", graph->median_ms / probe.median_ms).c_str()
                    : "-",
                gflops,
                !decode && sgemm.gflops > 0 ? absl::StrFormat("%.2f", gflops / sgemm.gflops).c_str()
                                            : "-",
                fma_peak > 0 ? absl::StrFormat("%.2f", gflops / fma_peak).c_str() : "-",
                attn.c_str());
    std::fflush(stdout);
    return absl::OkStatus();
  };
  // With --speculative-config, each batch also as a verification step: 1 + k
  // tokens per request, all of them sampled (what a step with drafts costs).
  std::vector<int> query_lens = {1};
  if (q > 1) query_lens.push_back(q);
  for (int b : *batches) {
    for (int len : query_lens) {
      std::vector<ScheduledSeq> seqs;
      for (int i = 0; i < b; ++i) {
        const std::string id = absl::StrCat("bench-decode-", i);
        if (auto s = kv.EnsureCapacity(id, context + len); !s.ok()) return Fail(s);
        seqs.push_back({tokens.data(), len, context, kv.BlockTable(id), true, len, lora_slot});
      }
      if (auto s = report(len == 1 ? "decode" : "verify", b * len, b, seqs); !s.ok()) return Fail(s);
      for (int i = 0; i < b; ++i) kv.Free(absl::StrCat("bench-decode-", i));
    }
  }
  for (int p : *prefills) {
    if (auto s = kv.EnsureCapacity("bench-prefill", p); !s.ok()) return Fail(s);
    std::vector<ScheduledSeq> seqs = {
        {tokens.data(), p, 0, kv.BlockTable("bench-prefill"), true, 1, lora_slot}};
    if (auto s = report("prefill", p, 1, seqs); !s.ok()) return Fail(s);
    kv.Free("bench-prefill");
  }
  return 0;
}

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help") {
    std::cout << "Usage: tandem bench step|kv|serve [flags]   (see tandem bench serve --help)\n";
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "step") return RunStep(rest);
  if (args[0] == "kv") return RunKvBench(rest);
  if (args[0] == "serve") return RunServeBench(rest);
  std::cerr << "tandem bench: unknown benchmark '" << args[0] << "' (step, kv, serve)" << std::endl;
  return 2;
}

}  // namespace tandem
