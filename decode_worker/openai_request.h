// An OpenAI API request body, checked field by field before anything runs:
// the decode worker's HTTP front door (openai_frontend.cc) hands it the
// route and the bytes a client sent and gets back an error naming the field,
// an answer (/tokenize, /detokenize), or the tandem.v1.GenerateRequest to
// run with what the reply needs to know.
//
// The bytes are anyone's: no input may throw, crash or recurse without
// bound (fuzz/openai_request_fuzzer.cc). JSON nested deeper than
// kMaxJsonDepth is refused as it is parsed (common/base/json.h), so nothing
// after it (copies, dump(), the chat template) recurses deeply. No gRPC here.
#ifndef TANDEM_DECODE_WORKER_OPENAI_REQUEST_H_
#define TANDEM_DECODE_WORKER_OPENAI_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/json.h"
#include "common/chat/chat_template.h"
#include "common/engine/sampling.h"
#include "common/serving/tokenizer_loader.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

// The HTTP status of an error inside (absl and gRPC share the codes): 400 bad
// input, 404 not found, 409 an id in flight, 429 queue full, 499 cancelled,
// 501, 503 unavailable or draining, 504 deadline, 500 otherwise.
int HttpStatusFor(absl::StatusCode code);

struct HttpError {
  int status;
  std::string message;
  std::string param;  // the field at fault, or ""
  std::string code = "";  // OpenAI's error code ("context_length_exceeded"); "": the status
};

// kResponses: OpenAI's Responses API (/v1/responses), read as the chat
// completion it asks for (ResponsesToChat) and answered in its own shape.
enum class OpenAiRoute { kChatCompletions, kCompletions, kTokenize, kDetokenize, kResponses };

// Completions a request may ask for: n for each prompt of a batch (OpenAI's
// own bound on n).
inline constexpr size_t kMaxChoices = 128;

// What the reply to a completion needs beside its GenerateRequests.
struct CompletionSpec {
  std::string model;  // the name the request gave (one of the served names), else the first
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool tools = false;     // the request offered tools: look for calls in the reply
  bool responses = false;  // a Responses API request: a response object, its events
  // Each offered tool's parameters' "properties" by its name (Qwen3-Coder's
  // calls are typed by them).
  nlohmann::ordered_json tool_properties = nlohmann::ordered_json::object();
  bool return_token_ids = false;  // vLLM's extension: token ids in each choice
  // vLLM's return_tokens_as_token_ids: logprobs name each token
  // "token_id:N" (a token that is not whole UTF-8 stays identifiable).
  bool tokens_as_ids = false;
  // vLLM's stop_reason: null for a stop on `eos_token_id` (unless
  // ignore_eos), the stop string or the other stop id that ended a choice.
  int32_t eos_token_id = -1;
  bool ignore_eos = false;
  bool logprobs = false;          // the request set sampling.logprobs
  bool prompt_logprobs = false;   // vLLM's prompt_logprobs: the response carries them
  bool echo_logprobs = false;     // completions' echo with logprobs: the prompt's lead them
  bool echo_only = false;         // completions' echo with max_tokens 0: the reply is the prompt
  bool thinking = true;           // chat_template_kwargs.enable_thinking (Qwen3's switch)
  // tool_choice forced a call: a named function (the reply is its
  // arguments) or "required" (the reply is a list of {"name", "parameters"}).
  std::string forced_function;
  bool tool_choice_required = false;
  // OpenAI's parallel_tool_calls: false keeps a reply's first call only (as
  // vLLM: what the model generates is not cut short).
  bool parallel_tool_calls = true;
};

// One choice of the reply: a Generate call of its own.
struct OpenAiChoice {
  v1::GenerateRequest generate;  // without request_id
  std::string echo;              // completions with echo: the prompt text, sent first
  bool counts_prompt = false;    // the first choice of its prompt: usage counts its prompt
};

// What the server knows when a request comes: `tokenizer` and
// `chat_template` may be null (the model has none); max_model_len 0 while
// the engine is loading.
struct OpenAiContext {
  std::string served_model_name;
  int max_model_len = 0;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  // Other names requests may give (--served-model-name's after the first).
  std::vector<std::string> model_aliases;
  // LoRA adapters (--lora-modules names): a request whose model is one runs
  // with that adapter (vLLM's multi-LoRA serving), and is answered under it.
  std::vector<std::string> lora_adapters;
  // The model's recommended sampling (--generation-config): what a request
  // that leaves a field out gets.
  GenerationDefaults generation_defaults;
  // What a request that leaves return_tokens_as_token_ids out gets.
  bool return_tokens_as_token_ids = false;
  int32_t eos_token_id = -1;  // OpenAiOptions::eos_token_id
  // The engine's --max-logprobs (-1: the vocabulary): the most top_logprobs,
  // logprobs and prompt_logprobs a request may ask for.
  int max_logprobs = kDefaultMaxLogprobs;
  // A request's chat_template replaces the model's (vLLM's
  // --trust-request-chat-template); otherwise it is refused.
  bool trust_request_chat_template = false;
  // The vocabulary's longest token in bytes (0: unknown): a text longer
  // than max_model_len of them cannot fit, and is refused untokenized.
  size_t max_token_bytes = 0;
};

// Exactly one of error, reply, or (choices, spec) holds. Choice p * n + j
// is sample j of prompt p (a batch of prompts for completions; n samples
// each, seed + j with a seed), as vLLM numbers them.
struct OpenAiRequest {
  std::optional<HttpError> error;
  std::optional<nlohmann::ordered_json> reply;  // /tokenize, /detokenize: the answer
  std::vector<OpenAiChoice> choices;
  size_t n = 1;  // samples of each prompt
  CompletionSpec spec;
};

// A Responses API body as the chat completion body it asks for: `input` (a
// string, or items: messages with text parts, function_call and
// function_call_output) after `instructions` as the system message,
// `max_output_tokens`, function `tools` and `tool_choice` in chat's shape,
// `text.format` as response_format. What it cannot serve is refused naming
// the field: other item, part and tool types, `previous_response_id` (no
// response is stored), `background`.
std::optional<HttpError> ResponsesToChat(const nlohmann::ordered_json& body, nlohmann::ordered_json* chat);

OpenAiRequest ParseOpenAiRequest(OpenAiRoute route, const std::string& body,
                                 const OpenAiContext& context);

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_OPENAI_REQUEST_H_
