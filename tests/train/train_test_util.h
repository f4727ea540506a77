// Helpers of the training tests: temporary directories, a tiny Llama-style model with the byte-level test
// tokenizer (tests/train/fixtures/byte_tokenizer, 259 ids) made by models::init_model_dir, tiny JSONL data,
// recipes, and running the lmtune binary as a child process.
#pragma once
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "models/init_model.h"
#include "train/metrics.h"

namespace lmtune::train_test {

namespace fs = std::filesystem;

inline fs::path source_path(const std::string& rel) { return fs::path(LMTUNE_SOURCE_DIR) / rel; }

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag = "t") {
    static int counter = 0;
    path = fs::temp_directory_path() / ("lmtune_train_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    fs::create_directories((path / name).parent_path());
    std::ofstream(path / name) << text;
    return path / name;
  }
};

struct TinyModelSpec {
  int layers = 2, hidden = 32, intermediate = 64, heads = 4, kv_heads = 2;
  double init_std = 0.2;  // larger than HF's 0.02 so a frozen random model gives LoRA something to steer
  uint64_t seed = 7;
};

// A random Llama-style model with the byte tokenizer in `dir` (f32).
inline fs::path make_tiny_model(const fs::path& dir, const TinyModelSpec& s = {}) {
  fs::create_directories(dir);
  std::ostringstream preset;
  preset << "model_type: llama\nhidden_size: " << s.hidden << "\nintermediate_size: " << s.intermediate
         << "\nnum_hidden_layers: " << s.layers << "\nnum_attention_heads: " << s.heads
         << "\nnum_key_value_heads: " << s.kv_heads
         << "\nmax_position_embeddings: 512\nrms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\n"
         << "initializer_range: " << s.init_std << "\n";
  fs::path preset_file = dir.parent_path() / (dir.filename().string() + "-preset.yaml");
  std::ofstream(preset_file) << preset.str();
  models::InitOptions o;
  o.arch = "llama";
  o.preset = preset_file;
  o.tokenizer_dir = source_path("tests/train/fixtures/byte_tokenizer");
  o.out = dir;
  o.seed = s.seed;
  o.dtype = DType::f32;
  o.overwrite = true;
  models::init_model_dir(o);
  return dir;
}

// A small learnable text corpus: short sentences from a tiny grammar.
inline std::string text_corpus(int lines, int offset = 0) {
  const char* names[] = {"anna", "bob", "carl", "dora"};
  const char* verbs[] = {"likes", "sees", "has"};
  const char* things[] = {"a red cat", "two dogs", "the sun", "green tea", "a book"};
  std::string out;
  for (int i = offset; i < offset + lines; ++i)
    out += std::string("{\"text\": \"") + names[i % 4] + " " + verbs[(i / 4) % 3] + " " + things[(i / 3) % 5] +
           ".\"}\n";
  return out;
}

// Recipe text: a minimal LoRA recipe on `model` and `train`, then `extra` YAML lines (later keys win through
// overrides, so tests usually pass overrides instead).
inline std::string recipe_yaml(const fs::path& model, const fs::path& train, const fs::path& save_dir) {
  std::ostringstream y;
  y << "model: " << model.string() << "\ndevice: cpu\nprecision: fp32\nfinetune: lora\n"
    << "data:\n  train: " << train.string() << "\n  max_seq_len: 64\n  packing: true\n"
    << "lora:\n  rank: 4\n  alpha: 8\n  dropout: 0.0\n  targets: all-linear\n"
    << "optimizer:\n  name: adamw\n  lr: 1.0e-2\n"
    << "schedule:\n  name: constant\n"
    << "train:\n  batch_size: 4\n  grad_accum: 1\n  steps: 20\n  grad_clip: 1.0\n  grad_checkpointing: false\n"
    << "  seed: 3\n"
    << "eval:\n  every: 0\n"
    << "save:\n  every: 0\n  dir: " << save_dir.string() << "\n";
  return y.str();
}

struct ChildResult {
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal killed it
  std::string output;   // stdout + stderr
};

// Runs the lmtune binary with `args` and extra environment variables; waits for it. max_file_bytes > 0 limits
// the size of every file the child writes (RLIMIT_FSIZE, with SIGXFSZ ignored so that writes past it fail with
// EFBIG): a full disk for an ordinary user. The limit covers its log file too, so keep such runs short.
inline ChildResult run_lmtune(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env = {}, rlim_t max_file_bytes = 0) {
  static int counter = 0;
  fs::path log = fs::temp_directory_path() / ("lmtune_child_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    if (max_file_bytes > 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{max_file_bytes, max_file_bytes};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(126);
    }
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    if (!f) std::_Exit(127);
    ::dup2(::fileno(stdout), 2);
    std::vector<std::string> all{LMTUNE_EXE};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(LMTUNE_EXE, argv.data());
    std::_Exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  fs::remove(log);
  return r;
}

// The train-split losses a run wrote to its metrics.jsonl, in step order.
inline std::vector<double> train_losses(const fs::path& save_dir) {
  std::vector<double> out;
  for (const MetricsRow& r : read_metrics_jsonl(save_dir / "metrics.jsonl"))
    if (r.split == "train") out.push_back(r.get("loss"));
  return out;
}

}  // namespace lmtune::train_test
