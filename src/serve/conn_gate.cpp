// The connection gate (see conn_gate.h): an epoll poller that buffers requests under total deadlines, and the
// worker threads that serve complete ones.
#include "serve/conn_gate.h"

#include <spdlog/spdlog.h>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace lmtune::serve {

using Clock = std::chrono::steady_clock;

namespace {

const char* const kBusy =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
    "Content-Length: 94\r\n\r\n"
    R"({"error":{"message":"too many open connections","type":"server_error","param":null,"code":null}})";
const char* const kTimeout =
    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    "Content-Length: 103\r\n\r\n"
    R"({"error":{"message":"the request took too long to send","type":"invalid_request_error","param":null,)"
    R"("code":null}})";
const char* const kHeadTooLarge =
    "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
    "Content-Length: 100\r\n\r\n"
    R"({"error":{"message":"request headers are too large","type":"invalid_request_error","param":null,)"
    R"("code":null}})";

// Best effort: the socket may be full or gone, and a refusal must never block the poller.
void send_and_close(int fd, const char* response) {
  if (response) (void)!::send(fd, response, std::strlen(response), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

size_t complete_request_size(const std::string& buf, size_t max_body) {
  const size_t end = buf.find("\r\n\r\n");
  if (end == std::string::npos) return 0;
  const size_t head = end + 4;
  size_t body = 0, lengths = 0;
  for (size_t pos = buf.find("\r\n") + 2; pos < end;) {
    size_t eol = buf.find("\r\n", pos);
    std::string line = buf.substr(pos, eol - pos);
    pos = eol + 2;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower(trim(line.substr(0, colon))), value = trim(line.substr(colon + 1));
    if (name == "transfer-encoding" || name == "expect") return head;  // the handlers decide at once
    if (name != "content-length") continue;
    if (++lengths > 1 || value.empty() || value.size() > 12 ||
        !std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return head;
    body = std::stoull(value);
  }
  return body <= max_body ? head + body : head;
}

ConnectionGate::ConnectionGate(GateOptions options, Serve serve)
    : options_(std::move(options)), serve_(std::move(serve)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  poller_ = std::thread([this] { poll_loop(); });
  for (size_t i = 0; i < std::max<size_t>(1, options_.workers); ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

ConnectionGate::~ConnectionGate() {
  stop();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void ConnectionGate::wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

size_t ConnectionGate::open_connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

void ConnectionGate::add(int fd) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_ && open_ < options_.max_connections) {
      ++open_;
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->deadline = Clock::now() + options_.head_timeout;
      incoming_.push_back(std::move(c));
      wake();
      return;
    }
  }
  spdlog::debug("serve: refusing a connection ({} open)", options_.max_connections);
  send_and_close(fd, kBusy);
}

void ConnectionGate::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  wake();
  if (poller_.joinable()) poller_.join();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto* list : {&incoming_, &ready_})
    for (auto& c : *list) send_and_close(c->fd, nullptr);
  open_ -= incoming_.size() + ready_.size();
  incoming_.clear();
  ready_.clear();
}

void ConnectionGate::poll_loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    std::deque<std::unique_ptr<Connection>> arrived;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
      arrived.swap(incoming_);
    }
    for (auto& c : arrived) watch(std::move(c));
    int n = epoll_wait(epoll_fd_, events.data(), int(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      if (events[size_t(i)].data.fd == wake_fd_) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof(count));
      } else if (polled_.count(events[size_t(i)].data.fd)) {
        on_readable(events[size_t(i)].data.fd);
      }
    }
    expire(Clock::now());
  }
  while (!polled_.empty()) close_conn(polled_.begin()->first, nullptr);
}

void ConnectionGate::watch(std::unique_ptr<Connection> c) {
  const int fd = c->fd;
  polled_[fd] = std::move(c);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return close_conn(fd, nullptr);
  if (!polled_[fd]->buffered.empty()) check_complete(fd);  // a pipelined request may already be whole
}

void ConnectionGate::on_readable(int fd) {
  Connection& c = *polled_[fd];
  const bool was_idle = c.buffered.empty() && c.requests > 0;
  char chunk[16384];
  ssize_t got = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    return close_conn(fd, nullptr);
  if (got < 0) return;
  c.buffered.append(chunk, size_t(got));
  if (was_idle) c.deadline = Clock::now() + options_.head_timeout;  // the next request has begun
  check_complete(fd);
}

void ConnectionGate::check_complete(int fd) {
  Connection& c = *polled_[fd];
  if (c.need == 0) {
    c.need = complete_request_size(c.buffered, options_.max_body);
    if (c.need == 0) {
      if (c.buffered.size() > options_.max_head) close_conn(fd, kHeadTooLarge);
      return;
    }
    c.deadline = Clock::now() + options_.body_timeout;  // also bounds a body that the worker reads itself
  }
  if (c.buffered.size() >= c.need) dispatch(fd);
}

void ConnectionGate::expire(Clock::time_point now) {
  std::vector<int> late;
  for (const auto& [fd, c] : polled_)
    if (c->deadline <= now) late.push_back(fd);
  for (int fd : late) {
    Connection& c = *polled_[fd];
    // An idle keep-alive connection just closes; one in the middle of a request learns why.
    close_conn(fd, c.buffered.empty() && c.requests > 0 ? nullptr : kTimeout);
  }
}

void ConnectionGate::close_conn(int fd, const char* response) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  polled_.erase(fd);
  send_and_close(fd, response);
  std::lock_guard<std::mutex> lock(mutex_);
  --open_;
}

void ConnectionGate::dispatch(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  std::unique_ptr<Connection> c = std::move(polled_[fd]);
  polled_.erase(fd);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.push_back(std::move(c));
  }
  ready_cv_.notify_one();
}

void ConnectionGate::worker_loop() {
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    bool keep = false;
    try {
      keep = serve_(*c);
    } catch (const std::exception& e) {
      spdlog::warn("serve: a connection failed: {}", e.what());
    }
    c->requests++;
    c->need = 0;
    std::lock_guard<std::mutex> lock(mutex_);
    if (keep && !stopping_) {
      c->deadline = Clock::now() + (c->buffered.empty() ? options_.idle_timeout : options_.head_timeout);
      incoming_.push_back(std::move(c));
      wake();
    } else {
      send_and_close(c->fd, nullptr);
      --open_;
    }
  }
}

}  // namespace lmtune::serve
