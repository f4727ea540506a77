// The HTTP side of `lmtune serve` (see server.h): routes, authentication, limits, streaming and disconnects.
// The only file that includes cpp-httplib.
#include "serve/server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <regex>

#include "core/error.h"
#include "infer/adapters.h"
#include "infer/model_checks.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/weights.h"
#include "serve/conn_gate.h"

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
  const int64_t model = infer::model_context(this->decoder.config());
  context = model > 0 ? model : 4096;
}

std::unique_ptr<ServedModel> load_served_model(const std::filesystem::path& model_dir,
                                               const std::vector<AdapterEntry>& adapters, DType weights,
                                               DType compute, std::optional<quant::Format> quantize) {
  ModelNames names;
  std::filesystem::path dir = model_dir;
  names.base = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
  // Before the slow weight load: every tokenizer id needs an embedding row.
  Tokenizer tokenizer = Tokenizer::load(model_dir);
  infer::check_tokenizer_fits(tokenizer, load_model_config(model_dir), model_dir.string());
  models::Decoder decoder = models::load_decoder(model_dir, weights, compute, default_device(), quantize);
  for (const AdapterEntry& a : adapters) {
    if (a.name == names.base || std::find(names.adapters.begin(), names.adapters.end(), a.name) != names.adapters.end())
      throw ConfigError("--adapter " + a.name + ": the name is already taken (by the base model or another adapter)");
    PeftAdapter peft = load_peft_adapter(a.dir);
    infer::validate_adapter(peft, decoder.weights(), "adapter " + a.name + " (" + a.dir.string() + ")");
    models::attach_peft(decoder.weights(), peft, a.name, a.multiplier);
    names.adapters.push_back(a.name);
  }
  // q, k, v and gate, up as one product each in decode steps (each row's adapter deltas added by id).
  models::fuse_projections(decoder.weights());
  return std::make_unique<ServedModel>(std::move(decoder), std::move(tokenizer), std::move(names));
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

namespace {

std::string lowercase(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_ip_literal(const std::string& name) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, name.c_str(), &a4) == 1) return true;
  return name.size() > 2 && name.front() == '[' && name.back() == ']' &&
         inet_pton(AF_INET6, name.substr(1, name.size() - 2).c_str(), &a6) == 1;
}

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace

bool host_allowed(const std::string& host_header, const ServeOptions& options) {
  if (host_header.empty()) return true;
  std::string name = lowercase(host_header);
  if (name.front() == '[') {
    size_t close = name.find(']');
    if (close == std::string::npos) return false;
    name.resize(close + 1);
  } else if (size_t colon = name.rfind(':'); colon != std::string::npos) {
    name.resize(colon);
  }
  if (!name.empty() && name.back() == '.') name.pop_back();
  // A rebinding attack needs a name the attacker controls; a literal address cannot be rebound.
  if (is_ip_literal(name) || name == "localhost" || name == lowercase(options.host)) return true;
  if (options.allowed_hosts.empty()) return is_wildcard(options.host);
  for (const std::string& allowed : options.allowed_hosts)
    if (allowed == "*" || lowercase(allowed) == name) return true;
  return false;
}

std::string media_type(const std::string& content_type) {
  std::string t = lowercase(content_type.substr(0, content_type.find(';')));
  size_t b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
  return b == std::string::npos ? "" : t.substr(b, e - b + 1);
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

// Set by a handler that answers before reading the body: the unread body must not be parsed as a next request.
thread_local bool close_after_response = false;

// httplib's Stream over a gated connection: the request bytes the gate buffered first, then the socket, with every
// read bounded by the connection's deadline (a body the gate did not buffer is still read against the clock).
class GatedStream : public httplib::Stream {
 public:
  GatedStream(Connection& c, int io_timeout_ms) : c_(c), io_timeout_ms_(io_timeout_ms) {}
  ~GatedStream() override { c_.buffered.erase(0, pos_); }

  bool is_readable() const override { return pos_ < c_.buffered.size() || wait(POLLIN) > 0; }
  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, io_timeout_ms_) > 0 && (p.revents & (POLLERR | POLLHUP)) == 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < c_.buffered.size()) {
      size_t n = std::min(size, c_.buffered.size() - pos_);
      std::memcpy(ptr, c_.buffered.data() + pos_, n);
      pos_ += n;
      return ssize_t(n);
    }
    if (wait(POLLIN) <= 0) return -1;
    return ::recv(c_.fd, ptr, size, 0);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  socket_t socket() const override { return c_.fd; }

 private:
  int wait(short events) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c_.deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{c_.fd, events, 0};
    return ::poll(&p, 1, int(std::min<int64_t>(left, io_timeout_ms_)));
  }
  void address(bool local, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if ((local ? getsockname : getpeername)(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {};
    const bool v4 = a.ss_family == AF_INET;
    const void* addr = v4 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&a)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr);
    if (inet_ntop(a.ss_family, addr, buf, sizeof(buf))) ip = buf;
    port = ntohs(v4 ? reinterpret_cast<sockaddr_in*>(&a)->sin_port : reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  }

  Connection& c_;
  int io_timeout_ms_;
  size_t pos_ = 0;
};

// Runs each accepted socket's task on the accept thread: the task only hands the socket to the gate.
struct InlineQueue : httplib::TaskQueue {
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// httplib's server with connections owned by the gate: httplib accepts and parses, the gate reads.
class GatedServer : public httplib::Server {
 public:
  ConnectionGate* gate = nullptr;
  int io_timeout_ms = 60000;
  size_t max_requests = 100;  // per connection

  bool serve(Connection& c) {
    GatedStream stream(c, io_timeout_ms);
    const bool last = c.requests + 1 >= max_requests;
    bool closed = false;
    close_after_response = false;
    bool ok = process_request(stream, last, closed, nullptr);
    return ok && !closed && !last && !close_after_response;
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    gate->add(sock);
    return true;
  }
};

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
  GatedServer http;
  std::unique_ptr<ConnectionGate> gate;
  int64_t started = std::time(nullptr);
  int listen_fd = -1;  // captured from the socket options hook, to raise httplib's listen backlog

  Impl(ServedModel& m, ServeOptions o)
      : model(m), options(std::move(o)), scheduler(m.decoder, {options.max_batch, options.queue}) {}

  void routes();
  void start_gate();
  bool refuse_early(const httplib::Request& req, httplib::Response& res);
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void stream(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created);
  void answer_when_done(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created);
};

Server::Server(ServedModel& model, ServeOptions options) {
  if (!is_loopback(options.host) && options.api_key.empty())
    throw ConfigError("serve: refusing to listen on " + options.host +
                      " without --api-key (anyone who can reach it could use the model); bind 127.0.0.1 or set a key");
  if (options.max_batch <= 0 || options.queue == 0 || options.max_body == 0 || options.timeout_s <= 0 ||
      options.head_timeout_ms <= 0 || options.body_timeout_ms <= 0 || options.idle_timeout_s <= 0 ||
      options.max_connections == 0)
    throw ConfigError("serve: --max-batch, --queue, --max-body, --max-connections and the timeouts must be positive");
  options.limits.context = model.context;
  impl_ = std::make_unique<Impl>(model, std::move(options));
  impl_->routes();
  impl_->start_gate();
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
  impl_->scheduler.stop();  // fails unfinished jobs, so that the workers waiting on them return
  impl_->gate->stop();
}

SchedulerStats Server::stats() const { return impl_->scheduler.stats(); }

void Server::Impl::start_gate() {
  GateOptions g;
  g.max_connections = options.max_connections;
  // One worker per request that waits on a job: a full batch plus a full queue, and a few for cheap routes.
  // Requests reach them whole, so slow clients occupy none.
  g.workers = size_t(options.max_batch) + options.queue + 8;
  g.head_timeout = std::chrono::milliseconds(options.head_timeout_ms);
  g.body_timeout = std::chrono::milliseconds(options.body_timeout_ms);
  g.idle_timeout = std::chrono::seconds(options.idle_timeout_s);
  g.max_body = options.max_body;
  gate = std::make_unique<ConnectionGate>(g, [this](Connection& c) { return http.serve(c); });
  http.gate = gate.get();
  http.io_timeout_ms = options.timeout_s * 1000;
  http.new_task_queue = [] { return new InlineQueue; };
}

void Server::Impl::routes() {
  http.set_payload_max_length(options.max_body);
  http.set_read_timeout(options.timeout_s, 0);  // SO_RCVTIMEO / SO_SNDTIMEO of accepted sockets
  http.set_write_timeout(options.timeout_s, 0);
  http.set_keep_alive_timeout(options.idle_timeout_s);
  http.set_keep_alive_max_count(http.max_requests);
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server share (and split) the port.
  http.set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (refuse_early(req, res)) {
      close_after_response = true;  // the body, if any, was not read
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
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
    // httplib's own refusals (a malformed request, an unread body): what follows on the connection is no request.
    close_after_response = true;
    res.set_header("Connection", "close");
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

// Refusals decided from the head alone, before httplib reads a body: a foreign Host (DNS rebinding), a POST body
// without a sane length (httplib would read a chunked or unframed body without limit, and would wait for a body
// over the limit to arrive only to skip it), or one that is not JSON (a web page can POST text/plain across sites
// without a CORS preflight; application/json needs one).
bool Server::Impl::refuse_early(const httplib::Request& req, httplib::Response& res) {
  if (!host_allowed(req.get_header_value("Host"), options)) {
    const std::string message =
        "Host '" + req.get_header_value("Host") + "' is not allowed on this server (see --allowed-host)";
    send_error(res, ApiError(403, message, "", "host_not_allowed"));
    return true;
  }
  if (req.method != "POST") return false;
  if (req.has_header("Transfer-Encoding") || !req.has_header("Content-Length")) {
    send_error(res, ApiError(411, "a request body needs a Content-Length (chunked bodies are not accepted)", "",
                             "length_required"));
    return true;
  }
  const std::string length = req.get_header_value("Content-Length");
  const bool digits =
      !length.empty() && std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || req.get_header_value_count("Content-Length") != 1) {
    send_error(res, ApiError(400, "malformed Content-Length '" + length + "'", "", "invalid_content_length"));
    return true;
  }
  if (length.size() > 18 || std::stoull(length) > options.max_body) {
    send_error(res, ApiError(413, "request body too large (" + length + " bytes; this server accepts " +
                                      std::to_string(options.max_body) + ")", "", "body_too_large"));
    return true;
  }
  if (media_type(req.get_header_value("Content-Type")) != "application/json") {
    send_error(res, ApiError(415, "Content-Type must be application/json (got '" +
                                      req.get_header_value("Content-Type") + "')", "", "unsupported_media_type"));
    return true;
  }
  return false;
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
  } catch (const nlohmann::json::exception& e) {
    send_error(res, ApiError(400, std::string("request body: ") + e.what()));  // a value nlohmann cannot convert
  }
}

void Server::Impl::stream(httplib::Response& res, std::shared_ptr<Job> job, const std::string& id, int64_t created) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, id, created](size_t, httplib::DataSink& sink) {
        const GenerationRequest& r = job->request();
        std::vector<bool> first(size_t(r.n), true);
        std::vector<int64_t> offsets(size_t(r.n), int64_t(r.prompt_text.size()));  // completions' text_offset
        auto send = [&](const std::string& s) { return sink.is_writable() && sink.write(s.data(), s.size()); };
        auto last_write = Clock::now();
        for (bool done = false; !done;) {
          std::vector<Job::Update> updates;
          done = job->wait(updates, 250ms);
          for (const Job::Update& u : updates) {
            const size_t i = size_t(u.index);
            if (!send(sse_event(chunk_json(r, id, created, u.index, u.text, u.finish_reason, first[i], u.logprobs,
                                           &offsets[i]))))
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
