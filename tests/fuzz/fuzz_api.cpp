// Fuzzes the server's JSON API request handling without a socket: parse_body (size of nesting, object check) and
// parse_request's validation of a chat or completion request (model, messages or prompt, sampling, stop, n, ...).
// The first byte picks the endpoint.
#include "fuzz_util.h"
#include "serve/api.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const lmtune::ChatTemplate chat(lmtune::fuzz::byte_tokenizer());
  static const lmtune::serve::ModelNames names{"base", {"adapter-a"}};
  bool is_chat = data[0] & 1;
  std::string body = lmtune::fuzz::text(data + 1, size - 1);
  lmtune::serve::ApiLimits limits;
  try {
    auto json = lmtune::serve::parse_body(body, limits.max_depth);
    (void)lmtune::serve::parse_request(json, is_chat, names, lmtune::fuzz::byte_tokenizer(), &chat, limits);
  } catch (const lmtune::serve::ApiError&) {  // the server answers these with their HTTP status
  } catch (const lmtune::Error&) {
  }
  return 0;
}
