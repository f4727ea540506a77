// The OpenAI wire format without sockets: request validation (types, ranges, models, prompts, stop, n, context
// clamp), the nesting-depth cap, and the shape of responses and chunks.
#include <gtest/gtest.h>

#include "serve/api.h"
#include "serve_test_util.h"

namespace lmtune::serve {
namespace {

using nlohmann::json;

const ModelNames& names() {
  static ModelNames n{"tiny", {"alpha", "beta"}};
  return n;
}

GenerationRequest parse(const json& body, bool chat = false, ApiLimits limits = {}) {
  static ChatTemplate tmpl(test::tiny_tokenizer());
  return parse_request(body, chat, names(), test::tiny_tokenizer(), &tmpl, limits);
}

int status_of(const json& body, bool chat = false, ApiLimits limits = {}) {
  try {
    parse(body, chat, limits);
  } catch (const ApiError& e) {
    return e.status;
  }
  return 200;
}

TEST(Api, ParsesSamplingStopAndModel) {
  GenerationRequest r = parse({{"model", "beta"}, {"prompt", "hi there"}, {"max_tokens", 7}, {"temperature", 0.5},
                               {"top_p", 0.8}, {"top_k", 5}, {"min_p", 0.1}, {"seed", 42}, {"stop", "END"}, {"n", 2}});
  EXPECT_EQ(r.adapter, "beta");
  EXPECT_EQ(r.model, "beta");
  EXPECT_EQ(r.stop.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.8f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop.stop_strings, std::vector<std::string>{"END"});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.prompt, test::tiny_tokenizer().encode("hi there", true));
  EXPECT_EQ(parse({{"model", "tiny"}, {"prompt", {1, 2, 3}}}).prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse({{"model", "tiny"}, {"prompt", "x"}, {"stop", {"a", "", "b"}}}).stop.stop_strings,
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(parse({{"model", "tiny"}, {"prompt", "x"}}).adapter, "");
}

TEST(Api, ChatUsesTheTemplateAndItsStopIds) {
  json body{{"model", "alpha"},
            {"messages", {{{"role", "system"}, {"content", "Be brief."}},
                          {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}}};
  GenerationRequest r = parse(body, true);
  ChatTemplate tmpl(test::tiny_tokenizer());
  EXPECT_EQ(r.prompt, tmpl.encode_prompt(json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                       {{"role", "user"}, {"content", "Hi"}}})));
  for (int32_t id : tmpl.stop_ids())
    EXPECT_NE(std::find(r.stop.stop_ids.begin(), r.stop.stop_ids.end(), id), r.stop.stop_ids.end());
}

TEST(Api, MaxTokensIsClampedToTheContext) {
  ApiLimits l;
  l.context = 50;
  GenerationRequest r = parse({{"model", "tiny"}, {"prompt", {1, 2, 3, 4, 5}}, {"max_tokens", 1000}}, false, l);
  EXPECT_EQ(r.stop.max_tokens, 45);
  json too_long{{"model", "tiny"}, {"prompt", std::vector<int>(50, 1)}};
  EXPECT_EQ(status_of(too_long, false, l), 400);
}

TEST(Api, RefusesBadFields) {
  const json ok{{"model", "tiny"}, {"prompt", "x"}};
  auto with = [&](const char* k, const json& v) {
    json b = ok;
    b[k] = v;
    return b;
  };
  EXPECT_EQ(status_of(ok), 200);
  EXPECT_EQ(status_of(with("model", "nope")), 404);
  EXPECT_EQ(status_of(with("model", "/abs/alpha")), 404);
  EXPECT_EQ(status_of(with("model", 3)), 400);
  EXPECT_EQ(status_of(with("max_tokens", -1)), 400);
  EXPECT_EQ(status_of(with("max_tokens", 2.5)), 400);
  EXPECT_EQ(status_of(with("temperature", -0.1)), 400);
  EXPECT_EQ(status_of(with("temperature", "hot")), 400);
  EXPECT_EQ(status_of(with("top_p", 0)), 400);
  EXPECT_EQ(status_of(with("top_k", -2)), 400);
  EXPECT_EQ(status_of(with("min_p", 2)), 400);
  EXPECT_EQ(status_of(with("n", 0)), 400);
  EXPECT_EQ(status_of(with("n", 5)), 400);
  EXPECT_EQ(status_of(with("stop", 5)), 400);
  EXPECT_EQ(status_of(with("stop", {"a", 1})), 400);
  EXPECT_EQ(status_of(with("seed", "x")), 400);
  EXPECT_EQ(status_of(with("stream", "yes")), 400);
  EXPECT_EQ(status_of(with("presence_penalty", 0.5)), 400);
  EXPECT_EQ(status_of(with("logprobs", true)), 400);
  EXPECT_EQ(status_of(with("prompt", {-1})), 400);
  EXPECT_EQ(status_of(with("prompt", {{1, 2}, {3}})), 400);
  EXPECT_EQ(status_of(with("prompt", "")), 400);
  EXPECT_EQ(status_of({{"model", "tiny"}, {"messages", json::array()}}, true), 400);
  EXPECT_EQ(status_of({{"model", "tiny"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, true), 400);
  try {
    parse(with("top_p", 7));
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "top_p");
    json err = error_body(e);
    EXPECT_EQ(err["error"]["param"], "top_p");
    EXPECT_EQ(err["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(err["error"]["code"].is_null());
  }
}

TEST(Api, BodyDepthAndSyntax) {
  EXPECT_NO_THROW(parse_body(R"({"a": {"b": [1, {"c": 2}]}})", 4));
  EXPECT_THROW(parse_body(R"({"a": {"b": [1, {"c": [2]}]}})", 4), ApiError);
  EXPECT_THROW(parse_body(std::string(100000, '['), 32), ApiError);
  EXPECT_THROW(parse_body("{\"a\": ", 32), ApiError);
  EXPECT_THROW(parse_body("42", 32), ApiError);
}

TEST(Api, ChunksAndResponses) {
  GenerationRequest r = parse({{"model", "alpha"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}, true);
  json first = chunk_json(r, "id1", 5, 0, "He", "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", "He"}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  json last = chunk_json(r, "id1", 5, 0, "", "stop", false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json resp = response_json(r, "id1", 5, {{"Hello", "length", 3, {}}});
  EXPECT_EQ(resp["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(resp["usage"]["completion_tokens"], 3);
  EXPECT_EQ(resp["usage"]["prompt_tokens"], int64_t(r.prompt.size()));
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

}  // namespace
}  // namespace lmtune::serve
