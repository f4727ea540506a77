// `lmtune serve` against hostile clients, over raw sockets on loopback: slow clients (one byte at a time) neither
// starve other requests nor outlive their deadlines; bad Content-Lengths are refused before any body arrives;
// foreign Host headers (DNS rebinding) and non-JSON bodies (cross-site form posts) are refused; numbers beyond
// double's range are 400s naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "serve/server.h"
#include "serve_test_util.h"

namespace lmtune::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ServedModel& plain_model() {
  static std::unique_ptr<ServedModel> m = load_served_model(test::tiny_model_dir(), {});
  return *m;
}

// A server of the plain model with a small body limit and short completions.
struct Running : test::RunningServer {
  explicit Running(ServeOptions o) : RunningServer(plain_model(), small(std::move(o))) {}
  static ServeOptions small(ServeOptions o) {
    o.max_body = 64 * 1024;
    o.limits.default_max_tokens = 4;
    return o;
  }
};

// A raw client socket with a receive timeout.
struct Raw {
  int fd = -1;
  Raw(int port, int timeout_ms) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~Raw() { ::close(fd); }
  bool send(const std::string& s) const { return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()); }
  // Whether the server closed (or reset) the connection within `limit`, and what it sent before.
  std::pair<bool, std::string> closed_within(std::chrono::milliseconds limit) const {
    std::string out;
    char buf[4096];
    for (auto end = Clock::now() + limit; Clock::now() < end;) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) out.append(buf, size_t(n));
      else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return {true, out};
    }
    return {false, out};
  }
  // Everything until the server closes or the timeout: "" when nothing came.
  std::string receive_all() const {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, size_t(n));
    return out;
  }
  // The status of the first response line, -1 if none came within the timeout.
  int status() const {
    std::string out;
    char buf[4096];
    while (out.find("\r\n") == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return -1;
      out.append(buf, size_t(n));
    }
    return out.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(out.c_str() + 9) : -1;
  }
};

std::string completion(const std::string& prompt = "Hello") {
  return json{{"model", plain_model().names.base}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}}.dump();
}

std::string post_head(const std::string& length, const std::string& extra = "") {
  return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
         (length.empty() ? "" : "Content-Length: " + length + "\r\n") + "\r\n";
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ServeHardening, SlowClientsNeitherStarveOthersNorOutliveTheirDeadline) {
  ServeOptions o;
  o.max_batch = 1;
  o.queue = 1;  // 10 worker threads: 20 slow clients holding one each would starve everyone else
  o.head_timeout_ms = 1500;
  o.body_timeout_ms = 1500;
  Running r(o);
  // Half trickle their headers, half a body, one byte per client every 200 ms: no single read ever times out.
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 20; ++i) {
    slow.push_back(std::make_unique<Raw>(r.port, 100));
    slow.back()->send(i % 2 ? post_head("1000") : "GET /health HTTP/1.1\r\nX-Slow: ");
  }
  std::atomic<bool> done{false};
  std::thread trickler([&] {
    while (!done) {
      for (auto& s : slow) s->send("a");
      std::this_thread::sleep_for(200ms);
    }
  });
  std::this_thread::sleep_for(300ms);
  httplib::Client c("127.0.0.1", r.port);
  c.set_read_timeout(3, 0);
  auto t0 = Clock::now();
  auto health = c.Get("/health");
  auto post = c.Post("/v1/completions", completion(), "application/json");
  const double took = seconds_since(t0);
  ASSERT_TRUE(health && post) << "starved by slow clients";
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(post->status, 200) << post->body;
  EXPECT_LT(took, 2.0);
  // Each slow client is cut off at its total deadline (1.5 s from connecting or from its headers), trickling or not.
  auto t1 = Clock::now();
  for (auto& s : slow) {
    auto [closed, got] = s->closed_within(4s);
    EXPECT_TRUE(closed) << "a slow client outlived its deadline";
    if (!got.empty()) {
      EXPECT_NE(got.find(" 408 "), std::string::npos) << got;
    }
  }
  EXPECT_LT(seconds_since(t1), 4.0);
  done = true;
  trickler.join();
}

TEST(ServeHardening, ContentLengthIsJudgedBeforeAnyBodyArrives) {
  Running r(ServeOptions{});
  for (auto [length, status] : std::vector<std::pair<std::string, int>>{
           {"10000000", 413}, {"99999999999999999999999", 413}, {"-1", 400}, {"1e23", 400}, {"12abc", 400}}) {
    Raw s(r.port, 2000);
    auto t0 = Clock::now();
    ASSERT_TRUE(s.send(post_head(length)));  // and no body
    EXPECT_EQ(s.status(), status) << "Content-Length: " << length;
    EXPECT_LT(seconds_since(t0), 1.0) << "Content-Length: " << length;
  }
  for (const std::string& framing : {std::string("Transfer-Encoding: chunked\r\n"), std::string()}) {
    Raw s(r.port, 2000);
    ASSERT_TRUE(s.send(post_head("", framing)));
    EXPECT_EQ(s.status(), 411) << framing;
  }
}

int status_with_host(const Running& r, const std::string& host) {
  Raw s(r.port, 5000);
  std::string body = completion();
  s.send("POST /v1/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  std::string reply = s.receive_all();
  if (reply.rfind("HTTP/1.1 ", 0) != 0) return -1;
  if (std::atoi(reply.c_str() + 9) == 403) {
    json e = json::parse(reply.substr(reply.find("\r\n\r\n") + 4));
    EXPECT_EQ(e["error"]["code"], "host_not_allowed") << e;
  }
  return std::atoi(reply.c_str() + 9);
}

TEST(ServeHardening, HostHeaderMustNameThisServer) {
  ServeOptions o;
  o.allowed_hosts = {"llm.lan"};
  Running r(o);
  const std::string port = ":" + std::to_string(r.port);
  const std::vector<std::string> good = {"127.0.0.1" + port, "localhost" + port, "[::1]" + port, "LocalHost",
                                         "llm.lan" + port};
  for (const std::string& ok : good)
    EXPECT_EQ(status_with_host(r, ok), 200) << ok;
  for (const std::string& bad :
       std::vector<std::string>{"evil.example" + port, "localhost.evil.example", "llm.lan.evil.example"})
    EXPECT_EQ(status_with_host(r, bad), 403) << bad;
}

TEST(ServeHardening, HostAllowListRules) {
  ServeOptions loop;
  EXPECT_TRUE(host_allowed("", loop));
  EXPECT_TRUE(host_allowed("10.1.2.3:80", loop));  // a literal address cannot be rebound
  EXPECT_FALSE(host_allowed("attacker.example", loop));
  EXPECT_FALSE(host_allowed("[::1", loop));
  ServeOptions any;
  any.host = "0.0.0.0";
  EXPECT_TRUE(host_allowed("my-gpu-box.internal:8080", any));
  any.allowed_hosts = {"my-gpu-box.internal"};
  EXPECT_TRUE(host_allowed("MY-GPU-BOX.internal.:8080", any));
  EXPECT_FALSE(host_allowed("attacker.example", any));
  loop.allowed_hosts = {"*"};
  EXPECT_TRUE(host_allowed("attacker.example", loop));
}

TEST(ServeHardening, PostBodiesMustBeJson) {
  Running r(ServeOptions{});
  httplib::Client c("127.0.0.1", r.port);
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                           "application/jsonp", ""}) {
    auto res = c.Post("/v1/completions", completion(), type);
    ASSERT_TRUE(res) << type;
    EXPECT_EQ(res->status, 415) << type;
    EXPECT_TRUE(json::parse(res->body)["error"].is_object()) << res->body;
  }
  for (const char* type : {"application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"}) {
    auto res = c.Post("/v1/completions", completion(), type);
    ASSERT_TRUE(res) << type;
    EXPECT_EQ(res->status, 200) << type << " " << res->body;
  }
  EXPECT_EQ(media_type(" application/json ; charset=utf-8"), "application/json");
}

TEST(ServeHardening, NumbersBeyondDoubleAre400sNamingTheField) {
  Running r(ServeOptions{});
  httplib::Client c("127.0.0.1", r.port);
  const std::string base = plain_model().names.base;
  for (auto [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": ")" + base + R"(", "prompt": "x", "max_tokens": 1e400})", "max_tokens"},
           {R"({"model": ")" + base + R"(", "prompt": "x", "temperature": )" + std::string(5000, '9') + "}",
            "temperature"},
           {R"({"model": ")" + base + R"(", "prompt": [1, 2, -1e999]})", "prompt[]"}}) {
    auto res = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    json e = json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], field) << e;
  }
}

}  // namespace
}  // namespace lmtune::serve
