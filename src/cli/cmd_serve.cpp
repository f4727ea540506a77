// `lmtune serve --model DIR --adapter NAME=DIR ...`: the OpenAI-compatible server (src/serve/). Runs until
// SIGINT or SIGTERM, which a watcher thread turns into a clean stop: the signal handler only writes the signal's
// number into a pipe that the watcher reads. (Blocking the signals for sigwait is not enough: libraries start
// threads before main, OpenBLAS's pool among them, and a signal delivered to one of those killed the process.)
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "core/error.h"
#include "serve/server.h"

namespace lmtune::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::vector<std::string> adapters;  // NAME=DIR[:scale]
  std::string dtype = "f32", compute_dtype = "f32";
  std::string quantize = "none";  // the decoder layers' projections (cli/infer_options.h)
  serve::ServeOptions options;
  int max_n = 4, default_max_tokens = 256;
};

// The write end of the stop pipe, for the signal handler (write() is async-signal-safe).
int g_stop_fd = -1;
extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_stop_fd >= 0) (void)!write(g_stop_fd, &b, 1);
  errno = saved;
}

// Installs the handlers for SIGINT and SIGTERM (also where a shell started the server with SIGINT ignored) and
// returns the pipe's read end.
int install_stop_signals() {
  int fds[2];
  if (pipe(fds) != 0) throw Error("serve: cannot create the signal pipe");
  g_stop_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return fds[0];
}

// Byte 0 in the pipe: the server stopped on its own (the watcher just exits).
void wake_watcher() {
  const unsigned char b = 0;
  (void)!write(g_stop_fd, &b, 1);
}

void run_serve(const std::string& device, ServeArgs a) {
  apply_device_option(device);
  if (a.options.api_key.empty())
    if (const char* key = std::getenv("LMTUNE_API_KEY")) a.options.api_key = key;
  if (!serve::is_loopback(a.options.host) && a.options.api_key.empty())
    throw ConfigError("serve: refusing to listen on " + a.options.host +
                      " without --api-key (or LMTUNE_API_KEY); bind 127.0.0.1 or set a key");
  a.options.limits.max_n = a.max_n;
  a.options.limits.default_max_tokens = a.default_max_tokens;
  std::vector<serve::AdapterEntry> adapters;
  for (const std::string& spec : a.adapters) adapters.push_back(serve::parse_adapter_entry(spec));
  DType weights = parse_dtype(a.dtype), compute = parse_dtype(a.compute_dtype);
  if (!is_float(weights) || !is_float(compute)) throw ConfigError("--dtype / --compute-dtype must be f32, f16 or bf16");

  const int stop_fd = install_stop_signals();
  std::unique_ptr<serve::ServedModel> model =
      serve::load_served_model(a.model, adapters, weights, compute, quantize_option(a.quantize));
  serve::Server server(*model, a.options);
  int port = server.bind();
  std::string names = model->names.base;
  for (const auto& n : model->names.adapters) names += ", " + n;
  spdlog::info("serving {} on http://{}:{}/v1 (models: {}; batch {}, queue {}{})", a.model, a.options.host, port,
               names, a.options.max_batch, a.options.queue, a.options.api_key.empty() ? "" : ", API key required");
  std::thread watcher([&] {
    unsigned char sig = 0;
    ssize_t n;
    while ((n = read(stop_fd, &sig, 1)) < 0 && errno == EINTR) {
    }
    if (n == 1 && sig != 0) {
      spdlog::info("signal {}: stopping", int(sig));
      server.stop();
    }
  });
  server.run();
  wake_watcher();  // run() also returns when the server stops on its own
  watcher.join();
}

}  // namespace

void add_serve_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server for a model and its LoRA adapters");
  auto a = std::make_shared<ServeArgs>();
  cmd->add_option("--model", a->model, "model directory (config.json, safetensors, tokenizer files) or GGUF file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--adapter", a->adapters,
                  "PEFT LoRA adapter that clients may select as \"model\": NAME=DIR[:scale] (repeatable)");
  cmd->add_option("--dtype", a->dtype, "weight dtype: f32 | f16 | bf16")->default_val("f32");
  cmd->add_option("--compute-dtype", a->compute_dtype, "activation dtype: f32 | f16 | bf16")->default_val("f32");
  cmd->add_option("--quantize", a->quantize,
                  "quantize the decoder layers' projections at load: none | nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0")
      ->check(CLI::IsMember({"none", "nf4", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"}));
  cmd->add_option("--host", a->options.host, "address to listen on (non-loopback needs --api-key)")
      ->default_val("127.0.0.1");
  cmd->add_option("--port", a->options.port, "TCP port")->default_val(8080)->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->options.api_key, "require Authorization: Bearer KEY (also LMTUNE_API_KEY)");
  cmd->add_option("--max-batch", a->options.max_batch, "sequences decoded together")
      ->default_val(8)
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--queue", a->options.queue, "requests waiting for a batch slot before 503")
      ->default_val(64)
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-body", a->options.max_body, "largest request body in bytes (413 above)")
      ->default_val(1 << 20)
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--timeout", a->options.timeout_s, "socket write timeout and longest wait for one read (seconds)")
      ->default_val(60)
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--header-timeout", a->options.head_timeout_ms, "total time to send request line + headers (ms)")
      ->default_val(10000)
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--body-timeout", a->options.body_timeout_ms, "total time to send a request body (ms)")
      ->default_val(30000)
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--keep-alive-timeout", a->options.idle_timeout_s, "idle keep-alive connections close after (s)")
      ->default_val(5)
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--max-connections", a->options.max_connections, "open connections at once (503 beyond)")
      ->default_val(512)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--allowed-host", a->options.allowed_hosts,
                  "Host header name accepted besides localhost, IP literals and --host ('*': any; repeatable)");
  cmd->add_option("--max-n", a->max_n, "most choices (n) per request")->default_val(4)->check(CLI::Range(1, 64));
  cmd->add_option("--default-max-tokens", a->default_max_tokens, "max_tokens when a request gives none")
      ->default_val(256)
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([&device, a] { run_serve(device, *a); });
}

}  // namespace lmtune::cli
