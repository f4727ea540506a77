// The connection gate in front of the HTTP handlers of `lmtune serve`: one poller thread buffers each
// connection's request head (and its Content-Length body, when that is within the limit) under total deadlines,
// and only a complete request reaches a worker thread. A client that trickles bytes (slowloris) therefore holds a
// socket and a buffer, never a worker, and loses even those at its deadline; workers go to ready requests only.
// No HTTP library here: the worker callback (serve/server.cpp) parses the buffered bytes.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lmtune::serve {

struct GateOptions {
  size_t max_connections = 512;                   // open at once; beyond it new ones get 503 and are closed
  size_t workers = 16;                            // threads that serve complete requests
  std::chrono::milliseconds head_timeout{10000};  // request line and headers, from the first wait, total
  std::chrono::milliseconds body_timeout{30000};  // the body, from the end of the headers, total
  std::chrono::milliseconds idle_timeout{5000};   // keep-alive wait for the next request
  size_t max_head = 16384;                        // bytes of request line + headers
  size_t max_body = 1 << 20;                      // bodies up to this are buffered before a worker sees them
};

// One client connection. `buffered` holds received bytes not yet consumed; `deadline` is when the read in
// progress (head or body) must be complete.
struct Connection {
  int fd = -1;
  std::string buffered;
  std::chrono::steady_clock::time_point deadline;
  size_t requests = 0;  // served on this connection so far
  size_t need = 0;      // bytes that make the request complete, once the head is in (0: head not complete)
};

// The size of the request whose head starts `buf`: head + Content-Length when the body should be buffered first,
// the head alone when the handlers must see it at once (no or malformed or too large Content-Length, chunked
// bodies, Expect: 100-continue), 0 while the head is incomplete.
size_t complete_request_size(const std::string& buf, size_t max_body);

class ConnectionGate {
 public:
  // Serves the complete request at the start of c.buffered (consuming it) and returns whether the connection
  // stays open for another one. Called on a worker thread.
  using Serve = std::function<bool(Connection& c)>;

  ConnectionGate(GateOptions options, Serve serve);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Takes ownership of an accepted socket (from the accept thread).
  void add(int fd);
  // Closes every connection not being served and joins the threads (waiting for requests being served).
  void stop();
  size_t open_connections() const;

 private:
  void poll_loop();
  void worker_loop();
  void watch(std::unique_ptr<Connection> c);          // poller thread
  void on_readable(int fd);                           // poller thread
  void check_complete(int fd);                        // poller thread
  void expire(std::chrono::steady_clock::time_point now);  // poller thread
  void close_conn(int fd, const char* response);      // poller thread
  void dispatch(int fd);                              // poller thread
  void wake();

  GateOptions options_;
  Serve serve_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::map<int, std::unique_ptr<Connection>> polled_;  // poller thread only
  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::deque<std::unique_ptr<Connection>> incoming_, ready_;  // to the poller / to the workers
  size_t open_ = 0;
  bool stopping_ = false;
  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace lmtune::serve
