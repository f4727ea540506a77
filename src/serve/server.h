// `lmtune serve`: an OpenAI-compatible HTTP server for a base model and the LoRA adapters of a start-up allowlist.
//
//   GET  /health                 liveness and load (no authentication)
//   GET  /v1/models              the base model and each adapter, by name
//   POST /v1/completions         raw prompts
//   POST /v1/chat/completions    messages through the model's chat template
// Both POST routes stream (server-sent events, OpenAI's chunk format, ending with "data: [DONE]") or answer
// once. The request's "model" picks the base or one adapter; the scheduler (serve/scheduler.h) batches all
// requests together whatever adapter they use. cpp-httplib is confined to server.cpp.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/quant.h"
#include "models/decoder.h"
#include "serve/api.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::serve {

// --adapter NAME=DIR[:scale]
struct AdapterEntry {
  std::string name;
  std::filesystem::path dir;
  float multiplier = 1;
};
// Parses NAME=DIR[:scale]. Names are [A-Za-z0-9._-]+ (they are what clients send as "model"). ConfigError else.
AdapterEntry parse_adapter_entry(const std::string& spec);

// The model a server serves: decoder with every allowed adapter attached, tokenizer, chat template, names.
// Not movable (the chat template refers to the tokenizer): held by unique_ptr.
struct ServedModel {
  ServedModel(models::Decoder decoder, Tokenizer tokenizer, ModelNames names);
  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;

  models::Decoder decoder;
  Tokenizer tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;  // null when the model has none
  ModelNames names;
  int64_t context = 0;  // infer::model_context: prompt + generation
};

// Loads the base model (on the default device) and attaches each adapter under its name after checking that it
// fits the model. The base model's name is the directory's name. quantize: the decoder layers' projections in
// this block format (models::load_weights).
std::unique_ptr<ServedModel> load_served_model(const std::filesystem::path& model_dir,
                                               const std::vector<AdapterEntry>& adapters, DType weights = DType::f32,
                                               DType compute = DType::f32,
                                               std::optional<quant::Format> quantize = std::nullopt);

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: an ephemeral port (tests)
  std::string api_key;         // required for a non-loopback host
  int64_t max_batch = 8;
  size_t queue = 64;
  size_t max_body = 1 << 20;   // bytes
  int timeout_s = 60;          // socket write timeout, and the longest wait for one read
  // Total time allowed to send a request's head and its body: a client that trickles bytes is cut off (408)
  // however steadily it sends.
  int head_timeout_ms = 10000;
  int body_timeout_ms = 30000;
  int idle_timeout_s = 5;          // keep-alive connections waiting for their next request
  size_t max_connections = 512;    // open at once, slow ones included; beyond it 503
  // Host header names accepted besides loopback names, IP literals and --host itself; "*" accepts any. Empty on a
  // wildcard --host (0.0.0.0, ::) also accepts any: such a server is reached by names it cannot know.
  std::vector<std::string> allowed_hosts;
  ApiLimits limits;            // context is taken from the model
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

// Whether a request's Host header (name[:port], [v6][:port]) may reach a server with these options: the defence
// against DNS rebinding, where a web page's own name resolves to this server. A missing Host passes (browsers
// always send one).
bool host_allowed(const std::string& host_header, const ServeOptions& options);

// The media type of a Content-Type value, lowercased, without parameters ("application/json; charset=utf-8" ->
// "application/json").
std::string media_type(const std::string& content_type);

class Server {
 public:
  // Throws ConfigError for a non-loopback host without an API key, or bad options.
  Server(ServedModel& model, ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and returns the port (the chosen one when options.port == 0). Throws ConfigError on failure.
  int bind();
  // Serves until stop() (from another thread or a signal watcher).
  void run();
  void stop();
  SchedulerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmtune::serve
