// The OpenAI-compatible wire format of `lmtune serve`: parsing and validating /v1/completions and
// /v1/chat/completions bodies into a GenerationRequest, and building the response, stream-chunk and error JSON.
// No HTTP here (serve/server.cpp owns the sockets), so all of it is testable as plain functions.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "infer/generator.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::serve {

// A request the server refuses: the HTTP status and the fields of OpenAI's {"error": {...}} body.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error");
  int status;
  std::string param, code, type;
};

// {"error": {"message", "type", "param", "code"}} (param and code are null when empty).
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param = "",
                          const std::string& code = "");
nlohmann::json error_body(const ApiError& e);

struct ApiLimits {
  int max_depth = 32;          // JSON nesting depth of a request body
  int max_n = 4;               // choices per request
  int64_t context = 4096;      // prompt + generated tokens at most (max_tokens is clamped to fit)
  int default_max_tokens = 256;  // when the request gives none (OpenAI's legacy completions default to 16)
  size_t max_stop = 8;         // stop strings per request
  int max_logprobs = 5;        // /v1/completions' integer "logprobs" (OpenAI's limit)
  int max_top_logprobs = 20;   // /v1/chat/completions' "top_logprobs" (OpenAI's limit)
};

// Parses a request body; malformed JSON, a non-object or nesting deeper than max_depth -> ApiError 400.
nlohmann::json parse_body(const std::string& body, int max_depth);

// The model names a server answers to: the base model and the adapters of its start-up allowlist.
struct ModelNames {
  std::string base;
  std::vector<std::string> adapters;
  // The adapter slot for a requested model name ("" = the base model); ApiError 404 for anything else, including
  // paths (adapters are never loaded from a request).
  std::string resolve(const std::string& requested) const;
};

// One validated generation request.
struct GenerationRequest {
  bool chat = false;
  std::string model;    // the name the client asked for (echoed in responses)
  std::string adapter;  // adapter slot, "" = base model
  std::vector<int32_t> prompt;
  infer::SamplingParams sampling;
  infer::StopParams stop;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a final chunk with usage
  // Log-probs: -1 off, else the alternatives per token (completions: "logprobs": N; chat: "logprobs": true with
  // "top_logprobs": N, default 0).
  int logprobs = -1;
  bool echo = false;         // completions: the prompt is part of the text (and of the log-probs)
  std::string prompt_text;   // decode(prompt), when echo or log-probs need it
};

// One token of a response as the wire shows it.
struct TokenLogprob {
  std::string token;              // its text: Tokenizer::decode of the id alone
  std::optional<float> logprob;   // null for the first prompt token (echo): nothing predicts it
  std::vector<std::pair<std::string, float>> top;  // the alternatives, most likely first
};
std::vector<TokenLogprob> wire_logprobs(const Tokenizer& tokenizer, const std::vector<infer::TokenScore>& scores);
// completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; text_offset counts bytes from
// `offset` on (advanced past these tokens).
nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob>& tokens, int64_t& offset);
// chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal"}.
nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& tokens);

// `chat_template` may be null (the model has none: /v1/chat/completions then answers 400).
GenerationRequest parse_request(const nlohmann::json& body, bool chat, const ModelNames& names,
                                const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                const ApiLimits& limits);

// "stop" or "length" (OpenAI's names for our finish reasons).
const char* openai_finish_reason(infer::FinishReason reason);

// One finished choice.
struct ChoiceResult {
  std::string text;
  std::string finish_reason;
  int64_t completion_tokens = 0;
  std::vector<TokenLogprob> logprobs;  // when requested: the prompt's (echo), then each generated token's
};

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// The non-streaming response: "text_completion" or "chat.completion".
nlohmann::json response_json(const GenerationRequest& req, const std::string& id, int64_t created,
                             const std::vector<ChoiceResult>& choices);
// One streaming chunk for choice `index`: text (or the chat delta: role on the first chunk, then content) and an
// optional finish reason ("" = null).
// With log-probs requested, `logprobs` are this chunk's tokens; `offset` is the choice's running text_offset.
nlohmann::json chunk_json(const GenerationRequest& req, const std::string& id, int64_t created, int index,
                          const std::string& text, const std::string& finish_reason, bool first,
                          const std::vector<TokenLogprob>& logprobs = {}, int64_t* offset = nullptr);
// The final usage chunk (stream_options.include_usage): no choices, usage set.
nlohmann::json usage_chunk_json(const GenerationRequest& req, const std::string& id, int64_t created,
                                int64_t prompt_tokens, int64_t completion_tokens);
// "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
// JSON text with invalid UTF-8 replaced (generated text may end inside a character only if the model emits junk).
std::string dump(const nlohmann::json& j);

}  // namespace lmtune::serve
