// Helpers for the serving tests: the tiny qwen3 model of the inference tests plus three PEFT adapters with
// different targets and random (trained-looking) B matrices, written once per test binary.
#pragma once
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "infer/infer_test_util.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/weights.h"
#include "serve/server.h"

namespace lmtune::serve::test {

using infer::test::TempDir;
using infer::test::tiny_model_dir;
using infer::test::tiny_tokenizer;

struct TestAdapter {
  std::string name;
  std::vector<std::string> targets;
  uint64_t seed;
};

inline const std::vector<TestAdapter>& test_adapters() {
  static const std::vector<TestAdapter> a = {
      {"alpha", {"q_proj", "v_proj"}, 11}, {"beta", {"all-linear"}, 12}, {"gamma", {"o_proj", "down_proj"}, 13}};
  return a;
}

// The directory of adapter `name` (written on first use).
inline std::filesystem::path adapter_dir(const std::string& name) {
  static TempDir dir;
  static bool written = [] {
    for (const TestAdapter& t : test_adapters()) {
      models::Decoder m = models::load_decoder(tiny_model_dir(), DType::f32, DType::f32, Device::cpu());
      models::add_lora(m.weights(), t.targets, 4, 1.0f, t.seed, "t");
      uint64_t s = t.seed * 1000;
      for (models::Linear* l : m.weights().linears())
        for (auto& a : l->adapters) a.B = Tensor::randn(a.B.shape(), s++, 0.5f);
      save_peft_adapter(models::extract_peft(m.weights(), "t", 4, 8.0, false, 0.0, "tiny"), dir.path / t.name);
    }
    return true;
  }();
  (void)written;
  return dir.path / name;
}

// A server of `model` on an ephemeral loopback port, serving on a thread until destroyed.
struct RunningServer {
  Server server;
  int port;
  std::thread thread;
  RunningServer(ServedModel& model, ServeOptions o) : server(model, on_port0(std::move(o))), port(server.bind()) {
    thread = std::thread([this] { server.run(); });
  }
  ~RunningServer() {
    server.stop();
    thread.join();
  }
  static ServeOptions on_port0(ServeOptions o) {
    o.port = 0;
    return o;
  }
};

}  // namespace lmtune::serve::test
