// The HTTP side of `lmtune serve` (see server.h): routes, authentication, limits, streaming and disconnects.
// The only file that includes cpp-httplib.
#include "serve/server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <random>
#include <regex>

#include "core/error.h"
#include "infer/adapters.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/weights.h"

namespace lmtune::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------------------------------------------
// Model and options

AdapterEntry parse_adapter_entry(const std::string& spec) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw ConfigError("--adapter '" + spec + "': expected NAME=DIR (the name clients send as \"model\")");
  AdapterEntry e;
  e.name = spec.substr(0, eq);
  for (char c : e.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      throw ConfigError("--adapter '" + spec + "': the name may only hold letters, digits, '.', '_' and '-'");
  infer::AdapterSpec dir = infer::parse_adapter_spec(spec.substr(eq + 1));  // DIR or DIR:scale
  e.dir = dir.dir;
  e.multiplier = dir.multiplier;
  return e;
}

ServedModel::ServedModel(models::Decoder decoder, Tokenizer tokenizer, ModelNames names)
    : decoder(std::move(decoder)), tokenizer(std::move(tokenizer)), names(std::move(names)) {
  if (!this->tokenizer.chat_template().empty()) chat_template = std::make_unique<ChatTemplate>(this->tokenizer);
  context = this->decoder.config().max_position_embeddings > 0 ? this->decoder.config().max_position_embeddings : 4096;
}

std::unique_ptr<ServedModel> load_served_model(const std::filesystem::path& model_dir,
                                               const std::vector<AdapterEntry>& adapters, DType weights,
                                               DType compute) {
  ModelNames names;
  std::filesystem::path dir = model_dir;
  names.base = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
  models::Decoder decoder = models::load_decoder(model_dir, weights, compute, default_device());
  for (const AdapterEntry& a : adapters) {
    if (a.name == names.base || std::find(names.adapters.begin(), names.adapters.end(), a.name) != names.adapters.end())
      throw ConfigError("--adapter " + a.name + ": the name is already taken (by the base model or another adapter)");
    PeftAdapter peft = load_peft_adapter(a.dir);
    infer::validate_adapter(peft, decoder.weights(), "adapter " + a.name + " (" + a.dir.string() + ")");
    models::attach_peft(decoder.weights(), peft, a.name, a.multiplier);
    names.adapters.push_back(a.name);
  }
  return std::make_unique<ServedModel>(std::move(decoder), Tokenizer::load(model_dir), std::move(names));
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// ---------------------------------------------------------------------------------------------------------------
// Server

namespace {

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_body(e));
}

const char* error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

}  // namespace

struct Server::Impl {
  ServedModel& model;
  ServeOptions options;
  Scheduler scheduler;
  httplib::Server http;
  int64_t started = std::time(nullptr);
  int listen_fd = -1;  // captured from the socket options hook, to raise httplib's listen backlog

  Impl(ServedModel& m, ServeOptions o)
      : model(m), options(std::move(o)), scheduler(m.decoder, {options.max_batch, options.queue}) {}

  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void stream(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created);
  void answer_when_done(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created);
};

Server::Server(ServedModel& model, ServeOptions options) {
  if (!is_loopback(options.host) && options.api_key.empty())
    throw ConfigError("serve: refusing to listen on " + options.host +
                      " without --api-key (anyone who can reach it could use the model); bind 127.0.0.1 or set a key");
  if (options.max_batch <= 0 || options.queue == 0 || options.max_body == 0 || options.timeout_s <= 0)
    throw ConfigError("serve: --max-batch, --queue, --max-body and --timeout must be positive");
  options.limits.context = model.context;
  impl_ = std::make_unique<Impl>(model, std::move(options));
  impl_->routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& s = *impl_;
  int port = s.options.port == 0 ? s.http.bind_to_any_port(s.options.host)
                                 : (s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  if (port <= 0)
    throw ConfigError("serve: cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                      " (address in use or not available)");
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of concurrent clients overflows it and some connections
  // are reset. Calling listen() again on a listening socket raises the backlog.
  if (s.listen_fd >= 0) ::listen(s.listen_fd, SOMAXCONN);
  return port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (!impl_) return;
  impl_->http.stop();
  impl_->scheduler.stop();
}

SchedulerStats Server::stats() const { return impl_->scheduler.stats(); }

void Server::Impl::routes() {
  // One thread per connection that waits on a job: enough for a full batch plus a full queue, and a few more
  // for cheap routes and refusals.
  const size_t threads = size_t(options.max_batch) + options.queue + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options.max_body);
  http.set_read_timeout(options.timeout_s, 0);
  http.set_write_timeout(options.timeout_s, 0);
  http.set_keep_alive_timeout(5);
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server share (and split) the port.
  http.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && constant_time_equal(auth.substr(prefix.size()), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, ApiError(401, auth.empty() ? "missing API key (Authorization: Bearer KEY)" : "invalid API key", "",
                             "invalid_api_key", "authentication_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (413 payload too large, 404 no route, 400 bad request) get OpenAI error bodies too.
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP error " + std::to_string(res.status);
    if (res.status == 400) message = "malformed HTTP request";
    if (res.status == 404) message = "no such route";
    if (res.status == 413) message = "request body too large";
    if (res.status == 414) message = "request URI too long";
    send_json(res, res.status, error_body(message, error_type(res.status)));
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    SchedulerStats st = scheduler.stats();
    send_json(res, 200, {{"status", "ok"}, {"running", st.running}, {"queued", st.queued}});
  });
  auto model_json = [this](const std::string& id, const std::string& parent) {
    json m{{"id", id}, {"object", "model"}, {"created", started}, {"owned_by", "lmtune"}};
    if (!parent.empty()) m["parent"] = parent;
    return m;
  };
  http.Get("/v1/models", [this, model_json](const httplib::Request&, httplib::Response& res) {
    json data = json::array({model_json(model.names.base, "")});
    for (const std::string& a : model.names.adapters) data.push_back(model_json(a, model.names.base));
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });
  http.Get(R"(/v1/models/([A-Za-z0-9._-]+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    try {
      std::string adapter = model.names.resolve(req.matches[1]);
      send_json(res, 200, model_json(req.matches[1], adapter.empty() ? "" : model.names.base));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  try {
    json body = parse_body(req.body, options.limits.max_depth);
    GenerationRequest g = parse_request(body, chat, model.names, model.tokenizer, model.chat_template.get(),
                                        options.limits);
    const bool streaming = g.stream;
    auto job = std::make_shared<Job>(std::move(g), model.tokenizer);
    if (!scheduler.submit(job))
      throw ApiError(503, "the server is busy (request queue full); retry later", "", "server_busy", "server_error");
    const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
    const int64_t created = std::time(nullptr);
    if (streaming)
      stream(res, job, id, created);
    else
      answer_when_done(res, job, id, created);
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.what()));
  }
}

void Server::Impl::stream(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, id, created](size_t, httplib::DataSink& sink) {
        const GenerationRequest& r = job->request();
        std::vector<bool> first(size_t(r.n), true);
        auto send = [&](const std::string& s) { return sink.is_writable() && sink.write(s.data(), s.size()); };
        auto last_write = Clock::now();
        for (bool done = false; !done;) {
          std::vector<Job::Update> updates;
          done = job->wait(updates, 250ms);
          for (const Job::Update& u : updates) {
            if (!send(sse_event(chunk_json(r, id, created, u.index, u.text, u.finish_reason, first[size_t(u.index)]))))
              return job->cancel(), false;  // the client went away: stop generating for it
            first[size_t(u.index)] = false;
            last_write = Clock::now();
          }
          // While queued or prefilling, an SSE comment now and then notices a client that left.
          if (updates.empty() && !done && Clock::now() - last_write > 1s) {
            if (!send(": keep-alive\n\n")) return job->cancel(), false;
            last_write = Clock::now();
          }
        }
        if (std::string err = job->error(); !err.empty()) {
          send(sse_event(error_body(err, "server_error")));
        } else if (r.include_usage) {
          int64_t completion = 0;
          for (const ChoiceResult& c : job->results()) completion += c.completion_tokens;
          send(sse_event(usage_chunk_json(r, id, created, int64_t(r.prompt.size()), completion)));
        }
        send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [job](bool) { job->cancel(); });  // no-op once finished; cancels when the response was cut short
}

void Server::Impl::answer_when_done(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id,
                                    int64_t created) {
  auto body = [job, id, created](int& status) {
    if (std::string err = job->error(); !err.empty()) {
      status = 500;
      return dump(error_body("generation failed: " + err, "server_error"));
    }
    status = 200;
    return dump(response_json(job->request(), id, created, job->results()));
  };
  // Short generations answer at once with a Content-Length.
  std::vector<Job::Update> ignored;
  auto deadline = Clock::now() + 2s;
  bool done = false;
  while (!done && Clock::now() < deadline) {
    done = job->wait(ignored, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    ignored.clear();
  }
  if (done) {
    int status = 200;
    std::string text = body(status);
    res.status = status;
    res.set_content(text, "application/json");
    return;
  }
  // Longer ones: a chunked body that starts with whitespace (valid leading JSON whitespace) written every second,
  // so that a client that disconnected is noticed and its generation cancelled.
  res.set_chunked_content_provider(
      "application/json",
      [job, body](size_t, httplib::DataSink& sink) {
        std::vector<Job::Update> updates;
        while (!job->wait(updates, 1000ms)) {
          updates.clear();
          if (!sink.is_writable() || !sink.write(" ", 1)) return job->cancel(), false;
        }
        int status = 200;
        std::string text = body(status);  // an engine failure this late still reads as an error object
        sink.write(text.data(), text.size());
        sink.done();
        return true;
      },
      [job](bool) { job->cancel(); });
}

}  // namespace lmtune::serve
