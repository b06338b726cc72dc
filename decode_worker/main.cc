// decode_worker: the Decode gRPC service, Tandem's front door
// (FULL_DECODE_ONLY graphs by default).
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/serving/engine_flags.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/tokenizer_loader.h"
#include "common/serving/worker.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/openai_frontend.h"
#include "decode_worker/prefill_pool.h"

int main(int argc, char** argv) {
  tandem::BlockTerminationSignals();  // before any thread exists
  tandem::FlagSet flags("decode_worker");
  tandem::EngineFlags engine_flags("FULL_DECODE_ONLY");
  engine_flags.Register(&flags);
  tandem::WorkerOptions options;
  options.role = "decode";
  options.grpc_address = "0.0.0.0:50051";
  options.metrics_address = "0.0.0.0:9400";
  std::string prefill_address;
  std::string prefill_mode = "auto", prefill_fallback = "none";
  tandem::DecodeOptions decode;
  int queue_timeout_ms = 30000;
  double prefill_timeout_s = 60, prefill_timeout_per_token_ms = 10, first_message_timeout_s = 5;
  int kv_streams = 2;  // docs/benchmarking.md, "Two streams per request"
  int kv_receive_window = tandem::kKvReceiveWindowBytes;
  tandem::RegisterWorkerFlags(&flags, &options);
  flags.Add("prefill-address", &prefill_address,
            "gRPC target of the prefill workers: HOST:PORT, dns:///name:port (one endpoint, "
            "balanced round_robin over what it resolves to), or a list, one endpoint each: "
            "ipv4:h1:p1,h2:p2 or targets separated by commas (h1:p,dns:///h2:p); empty: "
            "prefill locally");
  std::string prefill_routing = "prefix";
  flags.Add("prefill-routing", &prefill_routing,
            "how a prompt's prefill worker is chosen among --prefill-address's endpoints: "
            "prefix (the one its earlier prompts with the same prefix went to, loads bounded "
            "at 1.25x the mean) or round_robin");
  flags.Add("prefill", &prefill_mode,
            "where prompts are prefilled: remote (prefill workers), local (this worker: "
            "aggregated serving) or auto (remote when --prefill-address is set)");
  flags.Add("local-prefill-max-tokens", &decode.local_prefill_max_tokens,
            "remote prefill: prompts of at most this many tokens are prefilled here (0 = none)");
  flags.Add("prefill-fallback", &prefill_fallback,
            "none, or local: prefill here when no prefill worker delivers complete KV in "
            "time (unreachable, stalled, over its budget, an incomplete stream)");
  flags.Add("max-waiting", &decode.max_waiting, "requests that may wait for KV blocks");
  flags.Add("queue-timeout-ms", &queue_timeout_ms,
            "how long a request waits for KV blocks before RESOURCE_EXHAUSTED");
  flags.Add("prefill-timeout-seconds", &prefill_timeout_s,
            "a prefill's budget (every attempt, queue, compute and transfer): this plus "
            "--prefill-timeout-per-token-ms per prompt token");
  flags.Add("prefill-timeout-per-token-ms", &prefill_timeout_per_token_ms,
            "what each prompt token adds to a prefill's budget");
  flags.Add("prefill-first-message-timeout-seconds", &first_message_timeout_s,
            "a prefill worker that sends nothing for this long after a call (it answers "
            "at admission) is set aside for 10 s and the prefill retried on another one");
  flags.Add("kv-streams", &kv_streams,
            "Prefill streams per request, each on its own connection, its layers split "
            "between them (1-16): one connection's reader and writer threads were the limit "
            "of a request's KV stream on loopback and on a 10 Gbit/s link");
  int64_t kv_bytes_per_stream = tandem::kKvBytesPerStream;
  flags.Add("kv-bytes-per-stream", &kv_bytes_per_stream,
            "a request's KV takes one stream, and one more per this many bytes of it, up to "
            "--kv-streams (0: always --kv-streams): a short prompt's KV is not worth a "
            "second stream's attach round trip");
  flags.Add("kv-receive-window-bytes", &kv_receive_window,
            "HTTP/2 receive window of each KV stream (64 KiB - 1 GiB): how much KV may be in "
            "flight to this worker unread; cover the link's bandwidth-delay product");
  tandem::OpenAiOptions openai;
  std::string chat_template_path;
  flags.Add("http-address", &openai.http_address,
            "HOST:PORT of the OpenAI-compatible HTTP API (/v1/chat/completions, "
            "/v1/completions, /v1/responses, /v1/models, /health); empty: off");
  flags.Add("served-model-name", &openai.served_model_name,
            "the model's name in the OpenAI API (default: the --model file or directory name); "
            "NAME,ALIAS,... also accepts the aliases in requests and lists them (the first is the "
            "name in metrics and gRPC's ModelInfo)");
  flags.Add("chat-template", &chat_template_path,
            "a Jinja2 chat template file, instead of the model's own");
  std::string generation_config = "auto";
  flags.Add("generation-config", &generation_config,
            "default sampling for OpenAI requests that leave fields out (vLLM's): auto (the "
            "model's recommendation: a Hugging Face directory's generation_config.json, a GGUF's "
            "general.sampling.* keys), vllm (the API's neutral defaults), or a directory holding "
            "a generation_config.json");
  flags.Add("return-tokens-as-token-ids", &openai.return_tokens_as_token_ids,
            "logprobs name each token \"token_id:N\" (vLLM's flag; a request's "
            "return_tokens_as_token_ids overrides it): tokens that are not whole UTF-8 stay "
            "identifiable");
  std::string reasoning_parser;
  flags.Add("reasoning-parser", &reasoning_parser,
            "return chat replies' reasoning (<think>...</think>) in `reasoning`, apart from "
            "the answer: qwen3 or deepseek_r1 (vLLM's names); empty: all of a reply is content");
  std::string api_key;
  flags.Add("api-key", &api_key,
            "require `Authorization: Bearer KEY` on the OpenAI API's /v1/ routes (several "
            "keys: comma-separated; default: $TANDEM_API_KEY, which keeps the key out of the "
            "process list); empty: no key asked");
  tandem::HttpServer::Options& limits = openai.http_limits;
  flags.Add("http-max-body-bytes", &limits.max_body_bytes, "the largest request body (413 past it)");
  flags.Add("http-max-header-bytes", &limits.max_header_bytes,
            "the largest request line and headers together (refused and closed past it)");
  flags.Add("http-max-headers", &limits.max_headers, "header lines a request may have (431 past it)");
  flags.Add("http-request-timeout-seconds", &limits.request_timeout_seconds,
            "time a client has to send a request's headers and body, from its first byte "
            "(408 and closed past it: a client trickling bytes cannot hold a connection)");
  flags.Add("http-keepalive-timeout-seconds", &limits.keepalive_timeout_seconds,
            "a kept-alive connection with no request under way is closed after this long");
  flags.Add("http-max-read-bytes-per-second", &limits.max_read_bytes_per_second,
            "what the HTTP loop reads from all clients together per second (0: no bound): a "
            "burst of large bodies arrives at this pace instead of taking a core from the engine "
            "(ordinary requests arrive in one read)");
  flags.Add("http-max-write-bytes-per-second", &limits.max_write_bytes_per_second,
            "what the HTTP loop writes to all clients together per second (0: no bound): a reply "
            "of megabytes (a /tokenize of a long prompt) leaves at this pace instead of taking a "
            "core from the engine (streamed tokens are a small fraction of it)");
  flags.Add("http-max-connections", &limits.max_connections,
            "open HTTP connections at once (one more is answered 503 and closed)");
  flags.Add("api-threads", &openai.api_threads,
            "threads that parse requests, render chat templates and tokenize, off the HTTP "
            "event loop (0: one per available CPU, at most 4)");
  flags.Add("api-queue", &openai.api_queue,
            "requests that may wait for those threads (429 with Retry-After past it)");
  std::string api_priority = "idle";
  flags.Add("api-priority", &api_priority,
            "how those threads share the CPU with the engine: idle (SCHED_IDLE: in what the "
            "engine leaves, so a large request never stalls the streams), low (nice 10) or normal");
  flags.Add("max-tokenize-bytes", &openai.max_tokenize_bytes,
            "the largest /tokenize or /detokenize body (413 past it)");
  flags.Add("trust-request-chat-template", &openai.trust_request_chat_template,
            "let a request's chat_template replace the model's (vLLM's flag; off: such a "
            "request is refused with 400)");
  std::string prefiller_allow;
  tandem::PrefillPool::Trust trust;
  flags.Add("trusted-prefiller-header", &trust.any,
            "honour x-prefiller-host-port (llm-d's P/D routing header) naming any HOST:PORT; "
            "only where every client is a trusted gateway (llm-d's sidecar)");
  flags.Add("prefiller-allow", &prefiller_allow,
            "prefill endpoints x-prefiller-host-port may name beside --prefill-address's: "
            "HOST:PORT or IP networks (10.0.0.0/8), comma-separated; others get 403 and are "
            "never dialled");
  double prefiller_idle_s = 60;
  flags.Add("prefiller-idle-seconds", &prefiller_idle_s,
            "a header-named prefill endpoint unused for this long is closed");
  tandem::TlsFiles prefill_tls;  // the client side of the decode -> prefill hop
  prefill_tls.Register(&flags, "prefill-", /*server=*/false);
  tandem::EngineConfig config;
  if (int code = tandem::ParseWorkerCommandLine("decode_worker", &flags, engine_flags, argc, argv, &config);
      code >= 0) {
    return code;
  }
  if (prefill_mode == "auto") prefill_mode = prefill_address.empty() ? "local" : "remote";
  if (prefill_mode != "remote" && prefill_mode != "local") {
    std::cerr << "decode_worker: --prefill='" << prefill_mode
              << "': expected remote, local or auto" << std::endl;
    return 2;
  }
  if (prefill_mode == "remote" && prefill_address.empty()) {
    std::cerr << "decode_worker: --prefill=remote needs --prefill-address" << std::endl;
    return 2;
  }
  if (prefill_fallback != "none" && prefill_fallback != "local") {
    std::cerr << "decode_worker: --prefill-fallback='" << prefill_fallback
              << "': expected none or local" << std::endl;
    return 2;
  }
  if (decode.local_prefill_max_tokens < 0) {
    std::cerr << "decode_worker: --local-prefill-max-tokens=" << decode.local_prefill_max_tokens
              << " must be >= 0" << std::endl;
    return 2;
  }
  decode.prefill_remote = prefill_mode == "remote";
  decode.fallback_local = prefill_fallback == "local";
  if (decode.prefill_remote) {
    TANDEM_LOG(INFO) << "prefill: remote (" << prefill_address << ")"
                     << (decode.local_prefill_max_tokens > 0
                             ? absl::StrCat(", prompts of <= ", decode.local_prefill_max_tokens,
                                            " tokens locally")
                             : "")
                     << (decode.fallback_local ? ", local when unreachable" : "");
  } else {
    TANDEM_LOG(INFO) << "prefill: local (aggregated: this worker prefills every prompt)";
  }
  // The model's tokenizer, if it has one: text prompts and text outputs.
  auto tokenizer = tandem::LoadTokenizer(config.model);
  if (!tokenizer.ok()) {
    std::cerr << "decode_worker: " << tokenizer.status().message() << std::endl;
    return 1;
  }
  if (*tokenizer != nullptr) config.vocabulary = tandem::TokenVocabularyOf(**tokenizer);
  auto special = tandem::LoadSpecialTokens(config.model);
  if (!special.ok()) {
    std::cerr << "decode_worker: " << special.status().message() << std::endl;
    return 1;
  }
  if (*tokenizer != nullptr && !special->eos.empty()) {
    openai.eos_token_id = (*tokenizer)->TokenToId(special->eos);
  }
  auto chat_template = tandem::LoadChatTemplate(config.model, chat_template_path, *special);
  if (!chat_template.ok()) {
    std::cerr << "decode_worker: " << chat_template.status().message() << std::endl;
    return 1;
  }
  openai.max_logprobs = config.max_logprobs;
  auto defaults = tandem::LoadGenerationDefaults(config.model, generation_config);
  if (!defaults.ok()) {
    std::cerr << "decode_worker: --generation-config=" << generation_config << ": "
              << defaults.status().message() << std::endl;
    return 1;
  }
  openai.generation_defaults = *defaults;
  if (!defaults->empty()) {
    TANDEM_LOG(INFO) << "default sampling from the model's generation config: "
                     << defaults->ToString()
                     << " (requests that set a field keep theirs; --generation-config=vllm: the "
                        "API's neutral defaults)";
  }
  auto parser = tandem::ReasoningParserByName(reasoning_parser);
  if (!parser.ok()) {
    std::cerr << "decode_worker: " << parser.status().message() << std::endl;
    return 2;
  }
  openai.reasoning_parser = *parser;
  if (api_key.empty()) {
    if (const char* env = std::getenv("TANDEM_API_KEY"); env != nullptr) api_key = env;
  }
  // Lists as people write them ("k1, k2"): each item without its spaces.
  auto split_list = [](const std::string& text) {
    std::vector<std::string> out;
    for (absl::string_view item : absl::StrSplit(text, ',')) {
      item = absl::StripAsciiWhitespace(item);
      if (!item.empty()) out.emplace_back(item);
    }
    return out;
  };
  openai.api_keys = split_list(api_key);
  trust.allow = split_list(prefiller_allow);
  if (!(prefiller_idle_s > 0)) {
    std::cerr << "decode_worker: --prefiller-idle-seconds must be > 0, got " << prefiller_idle_s << std::endl;
    return 2;
  }
  trust.idle_close = absl::Seconds(prefiller_idle_s);
  if (absl::Status s = tandem::PrefillPool::CheckTrust(trust); !s.ok()) {
    std::cerr << "decode_worker: " << s.message() << std::endl;
    return 2;
  }
  for (const auto& [name, value] : {std::pair<const char*, int>{"http-max-headers", limits.max_headers},
                                    {"http-request-timeout-seconds", limits.request_timeout_seconds},
                                    {"http-keepalive-timeout-seconds", limits.keepalive_timeout_seconds},
                                    {"http-max-connections", limits.max_connections},
                                    {"api-queue", openai.api_queue}}) {
    if (value < 1) {
      std::cerr << "decode_worker: --" << name << " must be >= 1, got " << value << std::endl;
      return 2;
    }
  }
  if (api_priority == "idle") {
    openai.api_priority = tandem::WorkQueue::Priority::kIdle;
  } else if (api_priority == "low") {
    openai.api_priority = tandem::WorkQueue::Priority::kLow;
  } else if (api_priority == "normal") {
    openai.api_priority = tandem::WorkQueue::Priority::kNormal;
  } else {
    std::cerr << "decode_worker: --api-priority='" << api_priority << "': expected idle, low or normal"
              << std::endl;
    return 2;
  }
  if (openai.api_threads < 0 || openai.api_threads > 64) {
    std::cerr << "decode_worker: --api-threads must be in [0, 64], got " << openai.api_threads << std::endl;
    return 2;
  }
  if (const std::vector<std::string> names = split_list(openai.served_model_name); names.size() > 1) {
    openai.served_model_name = names[0];
    openai.model_aliases.assign(names.begin() + 1, names.end());
  }
  if (openai.served_model_name.empty()) {
    std::string name = config.model;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    openai.served_model_name = name.substr(name.rfind('/') + 1);
  }
  config.waiting_timeout = absl::Milliseconds(queue_timeout_ms);
  for (double v : {prefill_timeout_s, prefill_timeout_per_token_ms, first_message_timeout_s}) {
    if (!(v >= 0)) {
      std::cerr << "decode_worker: prefill timeouts must be >= 0, got " << v << std::endl;
      return 2;
    }
  }
  if (kv_streams < 1 || kv_streams > 16) {
    std::cerr << "decode_worker: --kv-streams must be in [1, 16], got " << kv_streams << std::endl;
    return 2;
  }
  if (kv_bytes_per_stream < 0) {
    std::cerr << "decode_worker: --kv-bytes-per-stream must be >= 0, got " << kv_bytes_per_stream
              << std::endl;
    return 2;
  }
  decode.kv_bytes_per_stream = kv_bytes_per_stream;
  if (kv_receive_window < tandem::kMinKvReceiveWindowBytes ||
      kv_receive_window > tandem::kMaxKvReceiveWindowBytes) {
    std::cerr << "decode_worker: --kv-receive-window-bytes must be in ["
              << tandem::kMinKvReceiveWindowBytes << ", " << tandem::kMaxKvReceiveWindowBytes
              << "], got " << kv_receive_window << std::endl;
    return 2;
  }
  decode.prefill_timeout = absl::Seconds(prefill_timeout_s);
  decode.prefill_timeout_per_token = absl::Milliseconds(prefill_timeout_per_token_ms);
  decode.first_message_timeout = absl::Seconds(first_message_timeout_s);
  grpc::ChannelArguments args;
  // A Prefill call that fails UNAVAILABLE before its first response (a
  // connection still being made, a handshake cut short) is retried by gRPC,
  // twice, 0.1-0.2 s apart; one that fails after its KV began to arrive is not
  // (the call is committed). The PrefillClient then tries another endpoint.
  args.SetServiceConfigJSON(R"({"methodConfig": [{
      "name": [{"service": "tandem.v1.Prefill"}],
      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "0.5s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})");
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetMaxReceiveMessageSize(8 << 20);
  tandem::SetKvReceiveWindow(&args, kv_receive_window);
  // Reconnect to a restarted prefill worker within ~2 s, not gRPC's default 2 min.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Keepalive: a frozen prefill worker's connection fails within ~4 s (the
  // workers' servers accept a ping a second), so it leaves the rotation.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto prefill_credentials = tandem::ChannelCredentials(prefill_tls, "prefill-");
  if (!prefill_credentials.ok()) {
    std::cerr << "decode_worker: " << prefill_credentials.status().message() << std::endl;
    return 2;
  }
  std::unique_ptr<tandem::PrefillPool> pool;
  if (decode.prefill_remote) {
    pool = std::make_unique<tandem::PrefillPool>(prefill_address, *prefill_credentials, args,
                                                 absl::Seconds(10), kv_streams);
    pool->set_trust(trust);
    if (prefill_routing != "prefix" && prefill_routing != "round_robin") {
      std::cerr << "decode_worker: --prefill-routing is '" << prefill_routing
                << "'; prefix or round_robin" << std::endl;
      return 2;
    }
    pool->set_routing(prefill_routing == "prefix" ? tandem::PrefillPool::Routing::kPrefix
                                                  : tandem::PrefillPool::Routing::kRoundRobin);
    TANDEM_LOG(INFO) << "x-prefiller-host-port: "
                     << (trust.any ? "any HOST:PORT (--trusted-prefiller-header)"
                         : trust.allow.empty()
                             ? "only --prefill-address's endpoints"
                             : absl::StrCat("--prefill-address's endpoints and ", prefiller_allow));
    TANDEM_LOG(INFO) << "prefill: " << pool->size() << " endpoint(s) in " << prefill_address
                     << " (--prefill-routing=" << prefill_routing << "), up to " << kv_streams << " KV stream(s) per request (one more per "
                     << kv_bytes_per_stream << " bytes of KV)";
  }
  tandem::WorkerState state;
  tandem::WorkerMetrics metrics("decode");
  metrics.ExportGatewayMetrics(openai.served_model_name);
  openai.metrics_text = [&metrics] { return metrics.Text(); };
  decode.served_model_name = openai.served_model_name;
  tandem::DecodeServiceImpl service(&state, &metrics, std::move(pool), decode, tokenizer->get());
  openai.lora_adapters = [&service] { return service.LoraAdapters(); };
  std::unique_ptr<tandem::OpenAiFrontend> http;
  if (!openai.http_address.empty()) {
    http = std::make_unique<tandem::OpenAiFrontend>(openai, &state, tokenizer->get(),
                                                    chat_template->get());
  }
  return tandem::RunWorker(
      options, config, &state, &metrics, {&service},
      [&](tandem::EngineClient* client) {
        // Runs on the engine thread once the engine is ready.
        service.SetEngine(client);
        if (http != nullptr) {
          http->SetModelInfo(client->max_model_len(),
                             static_cast<int>(client->model_config().vocab_size));
        }
      },
      http.get(), [&] { service.StopPrefillStreams(); });
}
