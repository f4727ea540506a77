// OpenAI request parsing and response building (see api.h).
#include "serve/api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace lmtune::serve {

using nlohmann::json;

ApiError::ApiError(int status, std::string message, std::string param, std::string code, std::string type)
    : std::runtime_error(std::move(message)),
      status(status),
      param(std::move(param)),
      code(std::move(code)),
      type(std::move(type)) {}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

namespace {

// "messages[].content": where a parse stopped, from the keys and arrays the parser callback has opened.
std::string json_path(const std::vector<std::string>& path) {
  std::string out;
  for (const std::string& p : path) out += (out.empty() || p == "[]" ? "" : ".") + p;
  return out;
}

}  // namespace

json parse_body(const std::string& body, int max_depth) {
  // nlohmann's parser keeps its own stack (no recursion), so the depth check only bounds the work and memory a
  // request can ask for; the callback sees each value's depth as it is parsed.
  std::vector<std::string> path;  // path[d - 1]: the key or "[]" that depth d is in
  json::parser_callback_t limit = [max_depth, &path](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth)
      throw ApiError(400, "request body nests deeper than " + std::to_string(max_depth) + " levels", "",
                     "invalid_json");
    if (event == json::parse_event_t::key && depth > 0) {
      path.resize(size_t(depth));
      path.back() = parsed.get<std::string>();
    } else if (event == json::parse_event_t::array_start) {
      path.resize(size_t(depth) + 1);
      path.back() = "[]";
    }
    return true;
  };
  json j;
  try {
    j = json::parse(body, limit);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), "", "invalid_json");
  } catch (const json::out_of_range& e) {
    // A number beyond double's range (1e400, thousands of digits): nlohmann refuses it with out_of_range.
    const std::string field = json_path(path);
    throw ApiError(400, "number out of range" + (field.empty() ? std::string() : " in '" + field + "'") + ": " +
                            e.what(), field, "invalid_number");
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object", "", "invalid_json");
  return j;
}

std::string ModelNames::resolve(const std::string& requested) const {
  if (requested == base) return "";
  for (const std::string& a : adapters)
    if (requested == a) return a;
  throw ApiError(404, "The model '" + requested + "' does not exist (served: " + base +
                          (adapters.empty() ? "" : " and its adapters; see GET /v1/models") + ")",
                 "model", "model_not_found");
}

namespace {

// Typed field access with 400s that name the field.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* name, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) throw ApiError(400, std::string("'") + name + "' must be a number", name);
  double d = v->get<double>();
  if (!std::isfinite(d)) throw ApiError(400, std::string("'") + name + "' must be finite", name);
  return d;
}

int64_t integer(const json& body, const char* name, int64_t fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  throw ApiError(400, std::string("'") + name + "' must be an integer", name);
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) throw ApiError(400, std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

std::vector<int32_t> completion_prompt(const json& body, const Tokenizer& tok) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "'prompt' is required", "prompt");
  if (p->is_string()) return tok.encode(p->get<std::string>(), true);
  if (p->is_array()) {
    if (p->size() == 1 && (*p)[0].is_string()) return tok.encode((*p)[0].get<std::string>(), true);
    if (!p->empty() && (*p)[0].is_array())
      throw ApiError(400, "one prompt per request (batches of prompts are not supported; send them concurrently)",
                     "prompt");
    std::vector<int32_t> ids;
    for (const json& v : *p) {
      if (!v.is_number_integer())
        throw ApiError(400, "'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= tok.vocab_size())
        throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary (" +
                                std::to_string(tok.vocab_size()) + ")",
                       "prompt");
      ids.push_back(int32_t(id));
    }
    return ids;
  }
  throw ApiError(400, "'prompt' must be a string or an array of token ids", "prompt");
}

// Content as a string: a plain string, or the text parts of an array of content parts.
std::string message_content(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (content.is_array()) {
    std::string out;
    for (const json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        throw ApiError(400, "message content parts must be {\"type\": \"text\", \"text\": ...} (no images or audio)",
                       "messages");
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw ApiError(400, "message 'content' must be a string or an array of text parts", "messages");
}

std::vector<int32_t> chat_prompt(const json& body, const ChatTemplate* tmpl) {
  if (!tmpl) throw ApiError(400, "this model has no chat template; use /v1/completions", "messages");
  const json* m = field(body, "messages");
  if (!m || !m->is_array() || m->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
  json messages = json::array();
  for (const json& msg : *m) {
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      throw ApiError(400, "each message must be an object with a string 'role'", "messages");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      throw ApiError(400, "unknown message role '" + role + "'", "messages");
    messages.push_back({{"role", role == "developer" ? "system" : role},
                        {"content", message_content(msg.contains("content") ? msg["content"] : json())}});
  }
  try {
    return tmpl->encode_prompt(messages);
  } catch (const Error& e) {
    throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(), "messages");
  }
}

// completions: "logprobs" is null or an integer in [0, max_logprobs] (OpenAI's legacy API).
int completion_logprobs(const json& body, const ApiLimits& limits) {
  const json* lp = field(body, "logprobs");
  if (!lp) return -1;
  if (lp->is_boolean() || !lp->is_number_integer() || lp->get<int64_t>() < 0 ||
      lp->get<int64_t>() > limits.max_logprobs)
    throw ApiError(400, "'logprobs' must be an integer between 0 and " + std::to_string(limits.max_logprobs),
                   "logprobs");
  return int(lp->get<int64_t>());
}

// chat: "logprobs" is a boolean; "top_logprobs" an integer in [0, max_top_logprobs] that needs logprobs: true.
int chat_logprobs(const json& body, const ApiLimits& limits) {
  const bool on = boolean(body, "logprobs", false);
  const json* top = field(body, "top_logprobs");
  if (!top) return on ? 0 : -1;
  if (!top->is_number_integer() || top->get<int64_t>() < 0 || top->get<int64_t>() > limits.max_top_logprobs)
    throw ApiError(400, "'top_logprobs' must be an integer between 0 and " + std::to_string(limits.max_top_logprobs),
                   "top_logprobs");
  if (!on) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
  return int(top->get<int64_t>());
}

}  // namespace

GenerationRequest parse_request(const json& body, bool chat, const ModelNames& names, const Tokenizer& tok,
                                const ChatTemplate* tmpl, const ApiLimits& limits) {
  GenerationRequest r;
  r.chat = chat;
  const json* model = field(body, "model");
  if (!model || !model->is_string()) throw ApiError(400, "'model' is required (a string)", "model");
  r.model = model->get<std::string>();
  r.adapter = names.resolve(r.model);

  // Sampling: OpenAI's fields plus the common extensions top_k, min_p and repetition_penalty.
  r.sampling.temperature = float(number(body, "temperature", 1.0));
  if (r.sampling.temperature < 0 || r.sampling.temperature > 100)
    throw ApiError(400, "'temperature' must be in [0, 100]", "temperature");
  r.sampling.top_p = float(number(body, "top_p", 1.0));
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) throw ApiError(400, "'top_p' must be in (0, 1]", "top_p");
  int64_t top_k = integer(body, "top_k", 0);
  if (top_k < -1 || top_k > std::numeric_limits<int>::max())
    throw ApiError(400, "'top_k' must be >= 0 (or -1 for off)", "top_k");
  r.sampling.top_k = top_k < 0 ? 0 : int(top_k);
  r.sampling.min_p = float(number(body, "min_p", 0.0));
  if (r.sampling.min_p < 0 || r.sampling.min_p > 1) throw ApiError(400, "'min_p' must be in [0, 1]", "min_p");
  r.sampling.repetition_penalty = float(number(body, "repetition_penalty", 1.0));
  if (!(r.sampling.repetition_penalty > 0))
    throw ApiError(400, "'repetition_penalty' must be > 0", "repetition_penalty");
  for (const char* unsupported : {"presence_penalty", "frequency_penalty"})
    if (number(body, unsupported, 0.0) != 0.0)
      throw ApiError(400, std::string("'") + unsupported + "' is not supported (use repetition_penalty)", unsupported);
  r.logprobs = chat ? chat_logprobs(body, limits) : completion_logprobs(body, limits);
  if (!chat) r.echo = boolean(body, "echo", false);
  if (r.echo && boolean(body, "stream", false))
    throw ApiError(400, "'echo' is not supported with 'stream' on this server", "echo");
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer()) throw ApiError(400, "'seed' must be an integer", "seed");
    r.sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
  try {
    r.sampling.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }

  int64_t n = integer(body, "n", 1);
  if (n < 1 || n > limits.max_n)
    throw ApiError(400, "'n' must be between 1 and " + std::to_string(limits.max_n) + " on this server", "n");
  r.n = int(n);
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    r.include_usage = boolean(*so, "include_usage", false);
  }

  if (const json* stop = field(body, "stop")) {
    std::vector<std::string> stops;
    if (stop->is_string()) {
      stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
        stops.push_back(s.get<std::string>());
      }
    } else {
      throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
    }
    if (stops.size() > limits.max_stop)
      throw ApiError(400, "at most " + std::to_string(limits.max_stop) + " stop strings", "stop");
    for (std::string& s : stops)
      if (!s.empty()) r.stop.stop_strings.push_back(std::move(s));
  }

  r.prompt = chat ? chat_prompt(body, tmpl) : completion_prompt(body, tok);
  if (r.prompt.empty()) throw ApiError(400, "the prompt is empty (no tokens)", chat ? "messages" : "prompt");
  if (int64_t(r.prompt.size()) >= limits.context)
    throw ApiError(400, "the prompt has " + std::to_string(r.prompt.size()) + " tokens; this model's context is " +
                            std::to_string(limits.context),
                   chat ? "messages" : "prompt", "context_length_exceeded");

  const char* mt_name = chat && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  int64_t max_tokens = integer(body, mt_name, limits.default_max_tokens);
  // max_tokens 0 with echo scores the prompt alone (OpenAI's legacy prompt log-probs).
  if (max_tokens < (r.echo ? 0 : 1))
    throw ApiError(400, std::string("'") + mt_name + "' must be at least " + (r.echo ? "0" : "1 (0 only with echo)"),
                   mt_name);
  // Clamped to what the context has left after the prompt.
  r.stop.max_tokens = int(std::min<int64_t>(max_tokens, limits.context - int64_t(r.prompt.size())));

  if (r.echo || r.logprobs >= 0) r.prompt_text = tok.decode(r.prompt);
  r.stop.stop_ids = tok.eos_ids();
  if (chat && tmpl)
    for (int32_t id : tmpl->stop_ids())
      if (std::find(r.stop.stop_ids.begin(), r.stop.stop_ids.end(), id) == r.stop.stop_ids.end())
        r.stop.stop_ids.push_back(id);
  return r;
}

const char* openai_finish_reason(infer::FinishReason reason) {
  switch (reason) {
    case infer::FinishReason::length: return "length";
    case infer::FinishReason::stop_id:
    case infer::FinishReason::stop_string: return "stop";
    case infer::FinishReason::running: break;
  }
  return "stop";
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json response_json(const GenerationRequest& req, const std::string& id, int64_t created,
                   const std::vector<ChoiceResult>& choices) {
  json out{{"id", id},
           {"object", req.chat ? "chat.completion" : "text_completion"},
           {"created", created},
           {"model", req.model}};
  json list = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    json c{{"index", i}, {"logprobs", nullptr}, {"finish_reason", choices[i].finish_reason}};
    if (req.logprobs >= 0) {
      int64_t offset = req.echo ? 0 : int64_t(req.prompt_text.size());
      c["logprobs"] = req.chat ? chat_logprobs_json(choices[i].logprobs)
                               : completion_logprobs_json(choices[i].logprobs, offset);
    }
    if (req.chat)
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    else
      c["text"] = choices[i].text;
    list.push_back(std::move(c));
    completion += choices[i].completion_tokens;
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(int64_t(req.prompt.size()), completion);  // the prompt counts once for n choices
  return out;
}

json chunk_json(const GenerationRequest& req, const std::string& id, int64_t created, int index,
                const std::string& text, const std::string& finish_reason, bool first,
                const std::vector<TokenLogprob>& logprobs, int64_t* offset) {
  json c{{"index", index}, {"logprobs", nullptr},
         {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (req.logprobs >= 0 && !logprobs.empty()) {
    int64_t local = 0;
    c["logprobs"] = req.chat ? chat_logprobs_json(logprobs)
                             : completion_logprobs_json(logprobs, offset ? *offset : local);
  }
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  return json{{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", json::array({std::move(c)})}};
}

json usage_chunk_json(const GenerationRequest& req, const std::string& id, int64_t created, int64_t prompt_tokens,
                      int64_t completion_tokens) {
  return json{{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", json::array()},
              {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace lmtune::serve

namespace lmtune::serve {

std::vector<TokenLogprob> wire_logprobs(const Tokenizer& tok, const std::vector<infer::TokenScore>& scores) {
  std::vector<TokenLogprob> out;
  out.reserve(scores.size());
  for (const infer::TokenScore& t : scores) {
    TokenLogprob w{tok.decode({t.id}), t.logprob, {}};
    for (const infer::TopLogprob& alt : t.top) w.top.emplace_back(tok.decode({alt.id}), alt.logprob);
    out.push_back(std::move(w));
  }
  return out;
}

json completion_logprobs_json(const std::vector<TokenLogprob>& tokens, int64_t& offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : tokens) {
    toks.push_back(t.token);
    lps.push_back(t.logprob ? json(*t.logprob) : json(nullptr));
    if (!t.logprob) {
      tops.push_back(nullptr);
    } else {
      // A dict, as OpenAI's: alternatives that decode to the same text keep the most likely one.
      json top = json::object();
      for (const auto& [text, lp] : t.top)
        if (!top.contains(text)) top[text] = lp;
      tops.push_back(std::move(top));
    }
    offsets.push_back(offset);
    offset += int64_t(t.token.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

namespace {
json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob>& tokens) {
  json content = json::array();
  for (const TokenLogprob& t : tokens) {
    json top = json::array();
    for (const auto& [text, lp] : t.top)
      top.push_back({{"token", text}, {"logprob", lp}, {"bytes", utf8_bytes(text)}});
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob ? json(*t.logprob) : json(nullptr)},
                       {"bytes", utf8_bytes(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace lmtune::serve
