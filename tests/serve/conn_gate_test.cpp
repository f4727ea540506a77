// The connection gate's framing: when a buffered request is complete enough to hand to a worker.
#include <gtest/gtest.h>

#include "serve/conn_gate.h"

namespace lmtune::serve {
namespace {

TEST(ConnGate, RequestSizeFromHeadAndContentLength) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length:  5 \r\n\r\n";
  EXPECT_EQ(complete_request_size(head + "hello", 100), head.size() + 5);
  EXPECT_EQ(complete_request_size(head, 100), head.size() + 5) << "the body is still to come";
  EXPECT_EQ(complete_request_size(head.substr(0, head.size() - 2), 100), 0u) << "the head is incomplete";
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(complete_request_size(get + "GET /", 100), get.size()) << "a pipelined request is not this one's";
  // The handlers answer these from the head alone, at once.
  for (const char* h : {"Content-Length: 101", "Content-Length: -1", "Content-Length: 1e23",
                               "Content-Length: 99999999999999999999999", "Transfer-Encoding: chunked",
                               "Expect: 100-continue", "Content-Length: 1\r\nContent-Length: 2"}) {
    const std::string req = std::string("POST / HTTP/1.1\r\n") + h + "\r\n\r\n";
    EXPECT_EQ(complete_request_size(req, 100), req.size()) << h;
  }
}

}  // namespace
}  // namespace lmtune::serve
