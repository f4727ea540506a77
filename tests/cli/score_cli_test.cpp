// `lmtune score` and `lmtune eval` on multiple-choice data, end to end through the binary, against the float64
// reference of scripts/reference_logprobs.py: per-record sums and means (base model and with a LoRA adapter, on
// the CPU and on Vulkan), choice predictions and accuracy, and bad records refused with file:line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/vulkan/vulkan_backend.h"
#include "infer/logprobs_fixture.h"

namespace lmtune::cli {
namespace {

using nlohmann::json;
using namespace infer::test;

struct ChildRun {
  int exit_code = -1;
  std::vector<json> objects;  // stdout lines that are JSON objects
  std::string out, err;
};

std::string quote(const std::string& s) { return "'" + s + "'"; }

ChildRun lmtune(const std::string& args) {
  TempDir dir;
  const std::string cmd = quote(LMTUNE_EXE) + " " + args + " 2>" + quote((dir.path / "err").string());
  ChildRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(dir.path / "err");
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') r.objects.push_back(json::parse(line));
  return r;
}

std::string model_args() { return "--model " + quote(logprobs_model_dir().string()); }

bool have_vulkan() { return !vk::list_devices().empty(); }

void expect_completion_scores(const ChildRun& r, const std::string& which) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t records = logprobs_expected()[which].size();
  ASSERT_EQ(r.objects.size(), records + 1) << r.out;
  double total = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < records; ++i) {
    const json& o = r.objects[i];
    const double want = expected_sum(which, i);
    const int64_t n = int64_t(logprobs_expected()[which][i].size());
    EXPECT_EQ(o["line"].get<int64_t>(), int64_t(i) + 1);
    EXPECT_EQ(o["tokens"].get<int64_t>(), n);
    EXPECT_NEAR(o["logprob"].get<double>(), want, kLogprobTol * double(n)) << which << " record " << i;
    EXPECT_NEAR(o["mean"].get<double>(), want / double(n), kLogprobTol) << which << " record " << i;
    total += want;
    tokens += n;
  }
  const json& s = r.objects.back()["summary"];
  EXPECT_EQ(s["records"].get<size_t>(), records);
  EXPECT_EQ(s["tokens"].get<int64_t>(), tokens);
  EXPECT_NEAR(s["logprob"].get<double>(), total, kLogprobTol * double(tokens));
}

TEST(ScoreCli, CompletionsEqualReference) {
  const std::string data = " --data " + quote(logprobs_fixture("records.jsonl").string());
  expect_completion_scores(lmtune("score " + model_args() + data + " --json --device cpu"), "base");
  expect_completion_scores(lmtune("score " + model_args() + data + " --json --batch-size 3 --device cpu --adapter " +
                                  quote(logprobs_adapter().string())),
                           "lora");
  // The table names every record and the total.
  ChildRun table = lmtune("score " + model_args() + data + " --device cpu");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("total: 4 records"), std::string::npos) << table.out;
}

TEST(ScoreCli, CompletionsEqualReferenceOnVulkan) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const std::string data = " --data " + quote(logprobs_fixture("records.jsonl").string());
  expect_completion_scores(lmtune("score " + model_args() + data + " --json --device vulkan --dtype f32"), "base");
  expect_completion_scores(lmtune("score " + model_args() + data + " --json --device vulkan --dtype f32 --adapter " +
                                  quote(logprobs_adapter().string())),
                           "lora");
}

TEST(ScoreCli, ChoicesAccuracy) {
  const std::string data = " --data " + quote(logprobs_fixture("choices.jsonl").string());
  ChildRun r = lmtune("score --choices --json --device cpu " + model_args() + data);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json& want = logprobs_expected()["choices"];
  ASSERT_EQ(r.objects.size(), want.size() + 1) << r.out;
  int norm_right = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const json& o = r.objects[i];
    EXPECT_EQ(o["predicted"], want[i]["answer"]);
    EXPECT_EQ(o["predicted_norm"], want[i]["answer_norm"]);
    norm_right += want[i]["answer_norm"] == o["answer"];
    for (size_t c = 0; c < want[i]["logprobs"].size(); ++c)
      EXPECT_NEAR(o["choices"][c]["logprob"].get<double>(), want[i]["logprobs"][c].get<double>(), 4 * kLogprobTol);
  }
  const json& s = r.objects.back()["summary"];
  EXPECT_EQ(s["examples"], 4);
  EXPECT_DOUBLE_EQ(s["acc"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["acc_norm"].get<double>(), norm_right / 4.0);

  // eval reports the same accuracy for such data, for the base model and the adapter.
  ChildRun e = lmtune("eval --json --device cpu " + model_args() + data + " --adapter " +
                      quote(logprobs_adapter().string()));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  ASSERT_EQ(e.objects.size(), 2u) << e.out;
  EXPECT_EQ(e.objects[0]["name"], "base");
  EXPECT_DOUBLE_EQ(e.objects[0]["acc"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(e.objects[0]["acc_norm"].get<double>(), norm_right / 4.0);
  EXPECT_EQ(e.objects[0]["examples"], 4);
  EXPECT_TRUE(e.objects[1]["acc"].is_number());
}

TEST(ScoreCli, BadRecordsFailWithFileAndLine) {
  TempDir dir;
  fs::path bad = dir.write("bad.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": 3}\n");
  ChildRun r = lmtune("score --device cpu " + model_args() + " --data " + quote(bad.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.jsonl:2: expected a string \"prompt\""), std::string::npos) << r.err;
  fs::path mc = dir.write("mc.jsonl", "{\"prompt\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 5}\n");
  r = lmtune("score --choices --device cpu " + model_args() + " --data " + quote(mc.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("mc.jsonl:1: expected \"answer\""), std::string::npos) << r.err;
  r = lmtune("eval --device cpu " + model_args() + " --data " + quote(mc.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("mc.jsonl:1"), std::string::npos) << r.err;
  fs::path empty_completion = dir.write("e.jsonl", "{\"prompt\": \"a\", \"completion\": \"\"}\n");
  r = lmtune("score --device cpu " + model_args() + " --data " + quote(empty_completion.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("e.jsonl:1: the completion has no tokens"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lmtune::cli
