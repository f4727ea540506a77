// The server's log-probs over real sockets, on the reference fixture of scripts/reference_logprobs.py (the Llama
// fixture with a character-level tokenizer and a chat template): echo + max_tokens 0 scores a prompt as the
// float64 reference does (base model and the LoRA adapter, CPU and Vulkan); generated tokens' log-probs equal
// infer::score_tokens on the same text; the completions and chat JSON shapes, streaming chunks, and 400s for bad
// logprobs values.
#include <gtest/gtest.h>
#include <httplib.h>

#include "backend/vulkan/vulkan_backend.h"
#include "infer/logprobs_fixture.h"
#include "infer/score.h"
#include "serve_test_util.h"

namespace lmtune::serve {
namespace {

using nlohmann::json;
using namespace infer::test;

std::unique_ptr<ServedModel> load_fixture(Device device) {
  const Device before = default_device();
  set_default_device(device);
  auto m = load_served_model(logprobs_model_dir(), {parse_adapter_entry("lora=" + logprobs_adapter().string())});
  set_default_device(before);
  return m;
}

struct Served {
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<test::RunningServer> server;
  explicit Served(Device device) : model(load_fixture(device)) {
    ServeOptions o;
    o.max_batch = 4;
    server = std::make_unique<test::RunningServer>(*model, o);
  }
  std::pair<int, json> post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", server->port);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, body.value("stream", false) ? json(r->body) : json::parse(r->body)};
  }
};

Served& cpu_server() {
  static Served s(Device::cpu());
  return s;
}

json records() {
  json out = json::array();
  std::ifstream in(logprobs_fixture("records.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// echo + max_tokens 0 on prompt + completion: the completion's tokens are the last ones of the echoed prompt.
void expect_echo_equals_reference(const Served& s, const std::string& model, const std::string& which) {
  json recs = records();
  for (size_t i = 0; i < recs.size(); ++i) {
    const std::string text = recs[i]["prompt"].get<std::string>() + recs[i]["completion"].get<std::string>();
    auto [status, j] = s.post("/v1/completions", {{"model", model}, {"prompt", text}, {"echo", true},
                                                  {"max_tokens", 0}, {"logprobs", 5}});
    ASSERT_EQ(status, 200) << j;
    const json& c = j["choices"][0];
    EXPECT_EQ(c["text"], "<s>" + text);  // the prompt as the model saw it: its tokens decoded, BOS included
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 0);
    const json& lp = c["logprobs"];
    const size_t n = text.size() + 1;  // <s> + one token per character
    ASSERT_EQ(lp["tokens"].size(), n) << lp;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    const json& want = logprobs_expected()[which][i];
    const size_t first = n - want.size();
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_NEAR(lp["token_logprobs"][first + k].get<double>(), want[k]["logprob"].get<double>(), kLogprobTol)
          << model << " record " << i << " token " << k;
      const json& top = lp["top_logprobs"][first + k];
      ASSERT_TRUE(top.is_object());
      EXPECT_EQ(top.size(), 5u);
      // The most likely alternative, by its text (one character per token here).
      const int32_t best = want[k]["top"][0][0].get<int32_t>();
      const std::string best_text = s.model->tokenizer.decode({best});
      ASSERT_TRUE(top.contains(best_text)) << top;
      EXPECT_NEAR(top[best_text].get<double>(), want[k]["top"][0][1].get<double>(), kLogprobTol);
    }
    // text_offset: byte offsets into the echoed text.
    int64_t offset = 0;
    for (size_t k = 0; k < n; ++k) {
      EXPECT_EQ(lp["text_offset"][k].get<int64_t>(), offset);
      offset += int64_t(lp["tokens"][k].get<std::string>().size());
    }
  }
}

TEST(ServeLogprobs, EchoScoresEqualReference) {
  expect_echo_equals_reference(cpu_server(), cpu_server().model->names.base, "base");
  expect_echo_equals_reference(cpu_server(), "lora", "lora");
}

TEST(ServeLogprobs, EchoScoresEqualReferenceOnVulkan) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  Served vulkan(Device::vulkan(0));
  expect_echo_equals_reference(vulkan, vulkan.model->names.base, "base");
  expect_echo_equals_reference(vulkan, "lora", "lora");
}

// Generated tokens: the log-probs a (sampled) completion reports equal score_tokens on the same tokens, and the
// JSON is OpenAI's legacy completions shape.
TEST(ServeLogprobs, CompletionLogprobsEqualScore) {
  Served& s = cpu_server();
  const std::string prompt = "The cat sat";
  for (const std::string& model : {s.model->names.base, std::string("lora")}) {
    auto [status, j] = s.post("/v1/completions", {{"model", model}, {"prompt", prompt}, {"max_tokens", 6},
                                                  {"temperature", 0.8}, {"seed", 5}, {"logprobs", 3}});
    ASSERT_EQ(status, 200) << j;
    const json& c = j["choices"][0];
    const json& lp = c["logprobs"];
    const size_t n = lp["tokens"].size();
    ASSERT_EQ(int64_t(n), j["usage"]["completion_tokens"].get<int64_t>());
    ASSERT_GT(n, 0u);
    std::string joined;
    for (const json& t : lp["tokens"]) joined += t.get<std::string>();
    EXPECT_EQ(joined, c["text"]);
    EXPECT_EQ(lp["text_offset"][0].get<int64_t>(), int64_t(prompt.size()) + 3);  // "<s>" + the prompt
    // The same tokens scored by `lmtune score`'s code (the adapter alone, as the server applies it).
    const Tokenizer& tok = s.model->tokenizer;
    infer::ScoreRequest req{tok.encode(prompt, true), tok.encode(c["text"].get<std::string>(), false)};
    ASSERT_EQ(req.continuation.size(), n);
    infer::ScoreOptions opt;
    opt.top_n = 3;
    opt.adapter = model == "lora" ? "lora" : "";
    std::vector<infer::TokenScore> want;
    {
      // The scheduler thread owns the decoder while serving: score a separately loaded copy.
      auto copy = load_fixture(Device::cpu());
      want = infer::score_tokens(copy->decoder, {req}, opt)[0];
    }
    for (size_t k = 0; k < n; ++k) {
      EXPECT_NEAR(lp["token_logprobs"][k].get<double>(), want[k].logprob, 1e-5) << model << " token " << k;
      const json& top = lp["top_logprobs"][k];
      ASSERT_EQ(top.size(), 3u) << top;
      for (const infer::TopLogprob& alt : want[k].top)
        EXPECT_NEAR(top[tok.decode({alt.id})].get<double>(), alt.logprob, 1e-5);
    }
  }
}

TEST(ServeLogprobs, ChatShapeAndStreaming) {
  Served& s = cpu_server();
  json body = {{"model", s.model->names.base}, {"messages", {{{"role", "user"}, {"content", "hi there"}}}},
               {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  auto [status, j] = s.post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << j;
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array());
  ASSERT_EQ(int64_t(content.size()), j["usage"]["completion_tokens"].get<int64_t>());
  std::string joined;
  for (const json& t : content) {
    ASSERT_TRUE(t["token"].is_string() && t["logprob"].is_number() && t["bytes"].is_array()) << t;
    const std::string token = t["token"];
    joined += token;
    ASSERT_EQ(t["bytes"].size(), token.size());
    for (size_t b = 0; b < token.size(); ++b) EXPECT_EQ(t["bytes"][b].get<int>(), int(uint8_t(token[b])));
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    for (const json& alt : t["top_logprobs"])
      ASSERT_TRUE(alt["token"].is_string() && alt["logprob"].is_number() && alt["bytes"].is_array()) << alt;
    // Greedy: the chosen token is the most likely one.
    EXPECT_NEAR(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>(), 1e-6);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
  }
  EXPECT_EQ(joined, j["choices"][0]["message"]["content"]);

  // Streamed: the chunks' log-probs, concatenated, are the same tokens and values.
  body["stream"] = true;
  auto [sstatus, raw] = s.post("/v1/chat/completions", body);
  ASSERT_EQ(sstatus, 200);
  std::istringstream lines(raw.get<std::string>());
  json streamed = json::array();
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    json chunk = json::parse(line.substr(6));
    const json& lp = chunk["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const json& t : lp["content"]) streamed.push_back(t);
  }
  ASSERT_EQ(streamed.size(), content.size());
  for (size_t k = 0; k < content.size(); ++k) {
    EXPECT_EQ(streamed[k]["token"], content[k]["token"]);
    EXPECT_NEAR(streamed[k]["logprob"].get<double>(), content[k]["logprob"].get<double>(), 1e-6);
  }
}

TEST(ServeLogprobs, StreamedCompletionOffsets) {
  Served& s = cpu_server();
  json body = {{"model", "lora"}, {"prompt", "abc"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 1},
               {"stream", true}};
  auto [status, raw] = s.post("/v1/completions", body);
  ASSERT_EQ(status, 200);
  std::istringstream lines(raw.get<std::string>());
  std::vector<int64_t> offsets;
  std::string text, tokens;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    json c = json::parse(line.substr(6))["choices"][0];
    text += c["text"].get<std::string>();
    if (c["logprobs"].is_null()) continue;
    for (const json& o : c["logprobs"]["text_offset"]) offsets.push_back(o.get<int64_t>());
    for (const json& t : c["logprobs"]["tokens"]) tokens += t.get<std::string>();
  }
  EXPECT_EQ(tokens, text);
  ASSERT_FALSE(offsets.empty());
  EXPECT_EQ(offsets[0], 6);  // "<s>abc"
  for (size_t k = 1; k < offsets.size(); ++k) EXPECT_GT(offsets[k], offsets[k - 1]);
}

TEST(ServeLogprobs, BadValuesAre400) {
  Served& s = cpu_server();
  const std::string base = s.model->names.base;
  auto completion = [&](json extra) {
    json body = {{"model", base}, {"prompt", "abc"}, {"max_tokens", 2}};
    body.update(extra);
    return s.post("/v1/completions", body);
  };
  for (json bad : {json(6), json(-1), json("3"), json(true), json(2.5)}) {
    auto [status, j] = completion({{"logprobs", bad}});
    EXPECT_EQ(status, 400) << bad;
    EXPECT_EQ(j["error"]["param"], "logprobs") << j;
  }
  EXPECT_EQ(completion({{"logprobs", 5}}).first, 200);
  EXPECT_EQ(completion({{"max_tokens", 0}}).first, 400);  // 0 only with echo
  EXPECT_EQ(completion({{"echo", true}, {"stream", true}}).first, 400);
  auto echo = completion({{"echo", true}, {"max_tokens", 0}});  // echo without log-probs: the prompt back
  EXPECT_EQ(echo.first, 200);
  EXPECT_EQ(echo.second["choices"][0]["text"], "<s>abc");
  EXPECT_TRUE(echo.second["choices"][0]["logprobs"].is_null());
  auto chat = [&](json extra) {
    json body = {{"model", base}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 2}};
    body.update(extra);
    return s.post("/v1/chat/completions", body);
  };
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", 21}}).first, 400);
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", -1}}).first, 400);
  EXPECT_EQ(chat({{"top_logprobs", 2}}).first, 400);  // needs logprobs: true
  EXPECT_EQ(chat({{"logprobs", 3}}).first, 400);       // a boolean in chat
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", 20}}).first, 200);
}

}  // namespace
}  // namespace lmtune::serve
