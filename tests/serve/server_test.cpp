// `lmtune serve` over real sockets on loopback (ephemeral ports, httplib clients): every endpoint, streaming and
// not, checked against the OpenAI response schema; 32 concurrent greedy requests over the base model and three
// adapters, each equal to the same request sent alone; bad requests answered with the right status while the
// server keeps serving; API keys; a full queue; client disconnects cancelling generation; a short soak with
// bounded memory.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "core/error.h"
#include "serve/server.h"
#include "serve_test_util.h"

namespace lmtune::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A served model shared by the whole binary: the tiny qwen3 with adapters alpha, beta, gamma.
ServedModel& served() {
  static std::unique_ptr<ServedModel> m = [] {
    std::vector<AdapterEntry> adapters;
    for (const auto& a : test::test_adapters()) adapters.push_back(parse_adapter_entry(a.name + "=" + test::adapter_dir(a.name).string()));
    return load_served_model(test::tiny_model_dir(), adapters);
  }();
  return *m;
}

// A server of the shared model on an ephemeral loopback port.
struct Running : test::RunningServer {
  explicit Running(ServeOptions o) : RunningServer(served(), std::move(o)) {}
  httplib::Client client(int timeout_s = 60) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(timeout_s, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }
};

ServeOptions default_options() {
  ServeOptions o;
  o.max_batch = 16;
  o.queue = 64;
  o.max_body = 64 * 1024;
  o.limits.default_max_tokens = 16;
  return o;
}

Running& server() {
  static Running r(default_options());
  return r;
}

const std::string& base_name() { return served().names.base; }

// ---- the OpenAI response schema (required fields and their types) ----

void check_usage(const json& u) {
  ASSERT_TRUE(u.is_object()) << u;
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) ASSERT_TRUE(u[k].is_number_integer()) << k;
  EXPECT_EQ(u["total_tokens"].get<int64_t>(), u["prompt_tokens"].get<int64_t>() + u["completion_tokens"].get<int64_t>());
}

void check_envelope(const json& j, const std::string& object) {
  ASSERT_TRUE(j.is_object()) << j;
  ASSERT_TRUE(j["id"].is_string()) << j;
  EXPECT_FALSE(j["id"].get<std::string>().empty());
  ASSERT_TRUE(j["object"].is_string()) << j;
  EXPECT_EQ(j["object"], object);
  ASSERT_TRUE(j["created"].is_number_integer()) << j;
  ASSERT_TRUE(j["model"].is_string()) << j;
  ASSERT_TRUE(j["choices"].is_array()) << j;
}

void check_response(const json& j, bool chat) {
  check_envelope(j, chat ? "chat.completion" : "text_completion");
  ASSERT_FALSE(j["choices"].empty());
  for (size_t i = 0; i < j["choices"].size(); ++i) {
    const json& c = j["choices"][i];
    ASSERT_TRUE(c["index"].is_number_integer());
    EXPECT_EQ(c["index"].get<size_t>(), i);
    ASSERT_TRUE(c["finish_reason"].is_string()) << c;
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << c;
    if (chat) {
      ASSERT_TRUE(c["message"].is_object()) << c;
      EXPECT_EQ(c["message"]["role"], "assistant");
      ASSERT_TRUE(c["message"]["content"].is_string());
    } else {
      ASSERT_TRUE(c["text"].is_string()) << c;
    }
  }
  check_usage(j["usage"]);
}

void check_chunk(const json& j, bool chat) {
  check_envelope(j, chat ? "chat.completion.chunk" : "text_completion");
  if (j["choices"].empty()) {  // the usage chunk
    check_usage(j["usage"]);
    return;
  }
  for (const json& c : j["choices"]) {
    ASSERT_TRUE(c["index"].is_number_integer());
    ASSERT_TRUE(c["finish_reason"].is_null() || c["finish_reason"].is_string()) << c;
    if (chat)
      ASSERT_TRUE(c["delta"].is_object()) << c;
    else
      ASSERT_TRUE(c["text"].is_string()) << c;
  }
}

std::string text_of(const json& j, bool chat, size_t i = 0) {
  return chat ? j["choices"][i]["message"]["content"].get<std::string>() : j["choices"][i]["text"].get<std::string>();
}

// ---- requests ----

json completion_body(const std::string& model, const std::string& prompt, int max_tokens) {
  return {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}
json chat_body(const std::string& model, const std::string& content, int max_tokens) {
  return {{"model", model},
          {"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

struct Reply {
  int status = 0;
  json body;
};

Reply post(httplib::Client& c, const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
  auto r = c.Post(path.c_str(), h, body, "application/json");
  if (!r) return {-int(r.error()), json()};
  json j = json::parse(r->body, nullptr, false);
  return {r->status, j};
}
Reply post(const std::string& path, const json& body, const httplib::Headers& h = {}) {
  httplib::Client c = server().client();
  return post(c, path, body.dump(), h);
}

void expect_error(const Reply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.body.is_object()) << "status " << r.status;
  const json& e = r.body["error"];
  ASSERT_TRUE(e.is_object()) << r.body;
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param") && e.contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r.body;
  }
}

// Streams a request; returns the data events (JSON) and whether "[DONE]" ended them.
struct Streamed {
  int status = 0;
  std::vector<json> events;
  bool done = false;
};
Streamed stream(const std::string& path, json body, const httplib::Headers& h = {}) {
  body["stream"] = true;
  httplib::Client c = server().client();
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = h;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    return true;
  };
  auto r = c.send(req);
  Streamed out;
  out.status = r ? r->status : -1;
  for (size_t pos = 0;;) {
    size_t end = buffer.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = buffer.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;  // comments (keep-alive)
    std::string data = event.substr(6);
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    out.events.push_back(json::parse(data));
  }
  return out;
}

// ---- tests ----

// A tokenizer with more ids than config.json's vocab_size is refused before the weights load, naming both sizes.
TEST(Serve, TokenizerBeyondTheEmbeddingIsRefused) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  const fs::path model = dir.path / "small_vocab";
  fs::create_directories(model);
  for (const auto& e : fs::directory_iterator(test::tiny_model_dir())) fs::copy(e.path(), model / e.path().filename());
  json config = json::parse(std::ifstream(model / "config.json"));
  config["vocab_size"] = 1000;
  config.erase("eos_token_id");
  config.erase("bos_token_id");
  std::ofstream(model / "config.json") << config.dump();
  try {
    load_served_model(model, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json's vocab_size is 1000"), std::string::npos) << e.what();
  }
}

TEST(Serve, HealthAndModels) {
  httplib::Client c = server().client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  std::vector<std::string> ids;
  for (const json& d : j["data"]) {
    EXPECT_EQ(d["object"], "model");
    EXPECT_TRUE(d["created"].is_number_integer());
    EXPECT_TRUE(d["owned_by"].is_string());
    ids.push_back(d["id"]);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{base_name(), "alpha", "beta", "gamma"}));
  auto one = c.Get("/v1/models/beta");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto none = c.Get("/v1/models/nope");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
}

TEST(Serve, CompletionsAndChatFollowTheSchema) {
  for (bool chat : {false, true}) {
    for (const std::string& model : {base_name(), std::string("beta")}) {
      json body = chat ? chat_body(model, "Hello there", 12) : completion_body(model, "Once upon a time", 12);
      Reply r = post(chat ? "/v1/chat/completions" : "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      check_response(r.body, chat);
      EXPECT_EQ(r.body["model"], model);
      EXPECT_GT(r.body["usage"]["prompt_tokens"].get<int>(), 0);
      EXPECT_LE(r.body["usage"]["completion_tokens"].get<int>(), 12);
      if (r.body["choices"][0]["finish_reason"] == "length") {
        EXPECT_EQ(r.body["usage"]["completion_tokens"], 12);
      }
    }
  }
}

TEST(Serve, StreamingEqualsNonStreaming) {
  for (bool chat : {false, true}) {
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = chat ? chat_body("alpha", "Tell me a story", 14) : completion_body("alpha", "The capital of", 14);
    Reply whole = post(path, body);
    ASSERT_EQ(whole.status, 200);
    json sbody = body;
    sbody["stream_options"] = {{"include_usage", true}};
    Streamed s = stream(path, sbody);
    ASSERT_EQ(s.status, 200);
    EXPECT_TRUE(s.done);
    ASSERT_GE(s.events.size(), 2u);
    std::string text, finish;
    for (size_t i = 0; i < s.events.size(); ++i) {
      check_chunk(s.events[i], chat);
      if (s.events[i]["choices"].empty()) {
        EXPECT_EQ(i + 1, s.events.size()) << "the usage chunk comes last";
        EXPECT_EQ(s.events[i]["usage"], whole.body["usage"]);
        continue;
      }
      const json& c = s.events[i]["choices"][0];
      if (chat) {
        if (i == 0) {
          EXPECT_EQ(c["delta"]["role"], "assistant");
        }
        text += c["delta"].value("content", "");
      } else {
        text += c["text"].get<std::string>();
      }
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
    }
    EXPECT_EQ(text, text_of(whole.body, chat));
    EXPECT_EQ(finish, whole.body["choices"][0]["finish_reason"]);
  }
}

TEST(Serve, SamplingFieldsStopStringsAndN) {
  // Seeded sampling reproduces itself; n choices are indexed; a stop string cuts the text before it.
  json body{{"model", "gamma"}, {"prompt", "Numbers:"}, {"max_tokens", 10}, {"temperature", 0.8}, {"top_p", 0.9},
            {"top_k", 40},      {"min_p", 0.01},        {"seed", 1234},      {"n", 3}};
  Reply a = post("/v1/completions", body), b = post("/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  check_response(a.body, false);
  ASSERT_EQ(a.body["choices"].size(), 3u);
  EXPECT_EQ(a.body["choices"], b.body["choices"]);

  Reply greedy = post("/v1/completions", completion_body(base_name(), "Once upon a time", 16));
  std::string full = text_of(greedy.body, false);
  ASSERT_GE(full.size(), 4u);
  // One or two whole UTF-8 characters from the middle of the text.
  auto boundary = [&](size_t i) {
    while (i < full.size() && (static_cast<unsigned char>(full[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  size_t from = boundary(full.size() / 2), to = boundary(boundary(from + 1) + 1);
  ASSERT_LT(from, to);
  std::string stop = full.substr(from, to - from);
  json sb = completion_body(base_name(), "Once upon a time", 16);
  sb["stop"] = json::array({stop, "zzzz-never"});
  Reply cut = post("/v1/completions", sb);
  ASSERT_EQ(cut.status, 200);
  EXPECT_EQ(text_of(cut.body, false), full.substr(0, full.find(stop)));
  EXPECT_EQ(cut.body["choices"][0]["finish_reason"], "stop");
  sb["stop"] = stop;  // a plain string works too
  EXPECT_EQ(text_of(post("/v1/completions", sb).body, false), full.substr(0, full.find(stop)));

  // max_tokens beyond the context is clamped, not refused.
  json big = completion_body(base_name(), "Hi", 1 << 30);
  big["stop"] = json::array();
  big["max_tokens"] = 3;  // keep the run short; the clamp itself is checked in api_test
  EXPECT_EQ(post("/v1/completions", big).status, 200);
}

TEST(Serve, ConcurrentMixedAdapterRequestsEqualEachAlone) {
  const std::vector<std::string> models = {base_name(), "alpha", "beta", "gamma"};
  const std::vector<std::string> prompts = {"Once upon a time", "The quick brown fox", "In the beginning",
                                            "Hello, my name is", "1, 2, 3,", "Write a poem about", "Q: What is",
                                            "The weather today"};
  struct Req {
    bool chat;
    json body;
  };
  std::vector<Req> reqs;
  for (int i = 0; i < 32; ++i) {
    bool chat = i % 3 == 1;
    const std::string& m = models[size_t(i) % models.size()];
    const std::string& p = prompts[size_t(i * 5) % prompts.size()];
    int max_tokens = 6 + (i * 7) % 11;
    reqs.push_back({chat, chat ? chat_body(m, p, max_tokens) : completion_body(m, p, max_tokens)});
  }
  auto path = [](const Req& r) { return r.chat ? "/v1/chat/completions" : "/v1/completions"; };
  std::vector<json> alone(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    Reply r = post(path(reqs[i]), reqs[i].body);
    ASSERT_EQ(r.status, 200) << r.body;
    alone[i] = r.body;
  }
  std::vector<json> together(reqs.size());
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] {
      httplib::Client c = server().client();
      ++ready;
      while (ready < int(reqs.size())) std::this_thread::yield();
      Reply r = post(c, path(reqs[i]), reqs[i].body.dump());
      together[i] = r.status == 200 ? r.body : json{{"status", r.status}, {"body", r.body}};
    });
  for (auto& t : threads) t.join();
  std::set<std::string> texts;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(together[i].contains("choices")) << together[i];
    check_response(together[i], reqs[i].chat);
    EXPECT_EQ(text_of(together[i], reqs[i].chat), text_of(alone[i], reqs[i].chat)) << "request " << i;
    EXPECT_EQ(together[i]["usage"], alone[i]["usage"]) << "request " << i;
    EXPECT_EQ(together[i]["choices"][0]["finish_reason"], alone[i]["choices"][0]["finish_reason"]);
    texts.insert(text_of(alone[i], reqs[i].chat));
  }
  EXPECT_GT(texts.size(), 8u) << "the adapters and prompts should give many different outputs";
}

TEST(Serve, BadRequestsGetTheRightStatusAndTheServerKeepsServing) {
  httplib::Client c = server().client();
  // Oversized body (the test server caps bodies at 64 KiB).
  json huge = completion_body(base_name(), std::string(100 * 1024, 'a'), 4);
  expect_error(post(c, "/v1/completions", huge.dump()), 413);
  expect_error(post(c, "/v1/completions", "{\"model\": \"x\", \"prompt\": "), 400);          // malformed JSON
  expect_error(post(c, "/v1/completions", "[1, 2, 3]"), 400);                               // not an object
  expect_error(post(c, "/v1/completions", std::string(200, '[') + std::string(200, ']')), 400);  // too deep
  json deep = completion_body(base_name(), "x", 2);
  json* p = &deep["extra"];
  for (int i = 0; i < 100; ++i) p = &((*p)["a"] = json::object());
  expect_error(post(c, "/v1/completions", deep.dump()), 400);
  expect_error(post("/v1/completions", completion_body("no-such-model", "x", 2)), 404, "model");
  for (const char* path_model : {"/tmp/alpha", "../alpha", "./alpha", "alpha/../beta"})
    expect_error(post("/v1/completions", completion_body(path_model, "x", 2)), 404, "model");
  expect_error(post("/v1/completions", completion_body(base_name(), "x", -5)), 400, "max_tokens");
  expect_error(post("/v1/completions", completion_body(base_name(), "x", 0)), 400, "max_tokens");
  json bad = completion_body(base_name(), "x", 2);
  bad["temperature"] = -1;
  expect_error(post("/v1/completions", bad), 400, "temperature");
  bad = completion_body(base_name(), "x", 2);
  bad["top_p"] = 1.5;
  expect_error(post("/v1/completions", bad), 400, "top_p");
  bad = completion_body(base_name(), "x", 2);
  bad["n"] = 99;
  expect_error(post("/v1/completions", bad), 400, "n");
  bad = completion_body(base_name(), "x", 2);
  bad["max_tokens"] = "ten";
  expect_error(post("/v1/completions", bad), 400, "max_tokens");
  bad = completion_body(base_name(), "x", 2);
  bad.erase("prompt");
  expect_error(post("/v1/completions", bad), 400, "prompt");
  bad = chat_body(base_name(), "x", 2);
  bad["messages"] = json::array({{{"role", 3}}});
  expect_error(post("/v1/chat/completions", bad), 400, "messages");
  auto missing = c.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  // Still serving.
  Reply ok = post("/v1/completions", completion_body("alpha", "Still alive?", 4));
  EXPECT_EQ(ok.status, 200);
  check_response(ok.body, false);
}

TEST(Serve, ApiKeyIsRequiredEverywhereButHealth) {
  ServeOptions o = default_options();
  o.api_key = "sekrit-key";
  Running keyed(o);
  httplib::Client c = keyed.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 401);
  expect_error({m->status, json::parse(m->body)}, 401);
  const std::string body = completion_body(base_name(), "x", 2).dump();
  expect_error(post(c, "/v1/completions", body), 401);
  expect_error(post(c, "/v1/completions", body, {{"Authorization", "Bearer wrong"}}), 401);
  expect_error(post(c, "/v1/completions", body, {{"Authorization", "sekrit-key"}}), 401);
  Reply ok = post(c, "/v1/completions", body, {{"Authorization", "Bearer sekrit-key"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  auto models = c.Get("/v1/models", {{"Authorization", "Bearer sekrit-key"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
}

TEST(Serve, RefusesNonLoopbackWithoutKey) {
  ServeOptions o = default_options();
  o.host = "0.0.0.0";
  EXPECT_THROW({ Server s(served(), o); }, ConfigError);
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.1.2.3"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
}

int health_field(const Running& r, const char* key) {
  httplib::Client c = r.client();
  auto h = c.Get("/health");
  return h ? json::parse(h->body)[key].get<int>() : -1;
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds limit = 10s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

TEST(Serve, FullQueueAnswers503AndDisconnectsCancel) {
  ServeOptions o = default_options();
  o.max_batch = 1;
  o.queue = 1;
  Running small(o);
  // 1. A long streaming request occupies the only batch slot; its client hangs up after the first chunk.
  std::atomic<bool> first_chunk{false}, hang_up{false};
  std::thread streamer([&] {
    httplib::Client c = small.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    json body = completion_body(base_name(), "Count forever:", 1500);
    body["stream"] = true;
    body["stop"] = json::array();
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      first_chunk = true;
      return !hang_up.load();
    };
    c.send(req);
  });
  ASSERT_TRUE(eventually([&] { return first_chunk.load(); }));
  EXPECT_EQ(health_field(small, "running"), 1);
  // 2. A second request waits in the queue (its slot is the whole queue).
  std::thread queued([&] {
    httplib::Client c = small.client();
    post(c, "/v1/completions", completion_body(base_name(), "Queued", 2).dump());
  });
  ASSERT_TRUE(eventually([&] { return health_field(small, "queued") == 1; }));
  // 3. A third finds the queue full.
  httplib::Client c = small.client();
  Reply busy = post(c, "/v1/completions", completion_body(base_name(), "x", 2).dump());
  expect_error(busy, 503);
  // 4. The streaming client disconnects: its 1500-token generation stops, the queued request runs and finishes.
  hang_up = true;
  streamer.join();
  queued.join();
  EXPECT_TRUE(eventually([&] { return health_field(small, "running") == 0 && health_field(small, "queued") == 0; }, 5s));
  SchedulerStats st = small.server.stats();
  EXPECT_LT(st.generated_tokens, 1500) << "the disconnected generation kept running";
  EXPECT_EQ(post(c, "/v1/completions", completion_body(base_name(), "x", 2).dump()).status, 200);
}

TEST(Serve, NonStreamingClientThatGivesUpCancelsItsGeneration) {
  ServeOptions o = default_options();
  o.max_batch = 2;
  Running r(o);
  httplib::Client c = r.client(/*timeout_s=*/1);  // gives up (and closes the connection) after a second
  json body = completion_body(base_name(), "A very long story:", 1800);
  body["stop"] = json::array();
  Reply gone = post(c, "/v1/completions", body.dump());
  EXPECT_LT(gone.status, 0) << "the client should have timed out";
  // The server notices within a few of its one-second heartbeats, long before 1800 tokens.
  EXPECT_TRUE(eventually([&] { return health_field(r, "running") == 0; }, 15s));
  EXPECT_EQ(r.server.stats().jobs_done, 1);
  EXPECT_LT(r.server.stats().generated_tokens, 1800);
}

size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * size_t(sysconf(_SC_PAGESIZE));
}

TEST(Serve, SoakManySmallMixedRequests) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed memory in quarantine, so the RSS grows by design (LeakSanitizer checks leaks).
  GTEST_SKIP() << "measures RSS, which AddressSanitizer's quarantine inflates";
#endif
  const std::vector<std::string> models = {base_name(), "alpha", "beta", "gamma"};
  auto worker = [&](int id, int count, std::atomic<int>& failures) {
    httplib::Client c = server().client();
    c.set_keep_alive(true);
    for (int i = 0; i < count; ++i) {
      int k = id * 7919 + i;
      const std::string& m = models[size_t(k) % models.size()];
      std::string prompt = "soak " + std::to_string(k % 97);
      Reply r;
      switch (k % 6) {
        case 0: r = post(c, "/v1/chat/completions", chat_body(m, prompt, 1 + k % 3).dump()); break;
        case 1: r = post(c, "/v1/completions", "{bad json"); if (r.status == 400) continue; break;
        case 2: r = post(c, "/v1/completions", completion_body("nope", prompt, 2).dump()); if (r.status == 404) continue; break;
        default: {
          json b = completion_body(m, prompt, 1 + k % 4);
          if (k % 5 == 0) {
            b["temperature"] = 0.7;
            b["seed"] = k;
          }
          r = post(c, "/v1/completions", b.dump());
        }
      }
      if (r.status != 200 || !r.body.contains("choices")) ++failures;
    }
  };
  auto run = [&](int threads, int per_thread) {
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { worker(t, per_thread, failures); });
    for (auto& t : ts) t.join();
    return failures.load();
  };
  EXPECT_EQ(run(8, 40), 0);  // warm-up: allocator pools, thread pool, caches
  const size_t before = rss_bytes();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run(8, 300), 0);  // 2400 requests
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t after = rss_bytes();
  std::printf("soak: 2400 requests in %.1f s; RSS %.1f -> %.1f MiB\n", seconds, before / 1048576.0, after / 1048576.0);
  EXPECT_LT(after, before + (64u << 20)) << "RSS grew by " << (after - before) / 1048576.0 << " MiB";
  // A job's reply leaves before the scheduler retires it: "running" reaches 0 a moment after the last reply.
  EXPECT_TRUE(eventually([&] { return health_field(server(), "running") == 0; }, 5s));
}

}  // namespace
}  // namespace lmtune::serve
