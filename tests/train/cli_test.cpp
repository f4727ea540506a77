// `lmtune train` as a child process: resume after kill -9 before, during and after a checkpoint write gives the
// same losses and a bitwise-identical adapter; bad inputs fail with a clear message, a non-zero exit and no
// checkpoint; --dry-run prints statistics and trains nothing.
#include <gtest/gtest.h>

#include <csignal>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/hdf5_file.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

struct CliRun {
  TempDir dir{"cli"};
  fs::path model, data, recipe;
  CliRun() {
    model = make_tiny_model(dir.path / "model");
    data = dir.write("train.jsonl", text_corpus(24));
  }
  fs::path write_recipe(const fs::path& save, const std::string& extra = "") {
    recipe = dir.write("recipe-" + save.filename().string() + ".yaml", recipe_yaml(model, data, save) + extra);
    return recipe;
  }
};

std::map<int64_t, double> losses(const fs::path& save) {
  std::map<int64_t, double> out;
  for (const MetricsRow& r : read_metrics_jsonl(save / "metrics.jsonl"))
    if (r.split == "train") {
      EXPECT_EQ(out.count(r.step), 0u) << "duplicate metrics row for step " << r.step;
      out[r.step] = r.get("loss");
    }
  return out;
}

size_t checkpoint_files(const fs::path& save) {
  std::error_code ec;
  if (!fs::is_directory(save / "checkpoints", ec)) return 0;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(save / "checkpoints")) n += e.is_regular_file();
  return n;
}

// Flips 64 bytes inside the data of the first lora_A tensor of a checkpoint, as a bad disk or copy would; the file
// stays valid HDF5 (the value becomes huge, not unreadable). Returns the dataset's name.
std::string damage_checkpoint(const fs::path& file) {
  std::string name, needle;
  {
    Hdf5File f = Hdf5File::open(file);
    for (const std::string& n : f.list("params"))
      if (name.empty() && n.find("lora_A") != std::string::npos) name = "/params/" + n;
    const std::vector<float> v = f.read<float>(name);
    needle.assign(reinterpret_cast<const char*>(v.data()), 16);
  }
  std::string bytes = read_file_text(file);
  const size_t at = bytes.find(needle);
  EXPECT_NE(at, std::string::npos) << file;
  for (size_t i = at; at != std::string::npos && i < at + 64; ++i) bytes[i] = char(~bytes[i]);
  write_file_atomic(file, bytes);
  return name;
}

// Every file under `dir` with its contents.
std::map<fs::path, std::string> snapshot(const fs::path& dir) {
  std::map<fs::path, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path()] = read_file_text(e.path());
  return out;
}

std::vector<std::string> checkpoint_names(const fs::path& save) {
  std::vector<std::string> out;
  for (const fs::path& p : list_checkpoints(save)) out.push_back(p.filename().string());
  return out;
}

// Settings that exercise everything a resume must restore: dropout masks, accumulation, checkpointing, AdamW.
const std::vector<std::string> kResumeSettings = {"train.steps=6",          "save.every=2",
                                                  "train.grad_accum=2",     "train.batch_size=2",
                                                  "lora.dropout=0.1",       "train.grad_checkpointing=true",
                                                  "schedule.name=cosine",   "schedule.warmup_steps=2",
                                                  "data.valid_split=0.2",   "eval.every=3"};

}  // namespace

TEST(TrainCli, ResumeAfterKillGivesIdenticalRun) {
  CliRun run;
  const fs::path straight = run.dir.path / "straight";
  std::vector<std::string> args{"train", run.write_recipe(straight).string(), "--device", "cpu"};
  args.insert(args.end(), kResumeSettings.begin(), kResumeSettings.end());
  ChildResult r = run_lmtune(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto expected = losses(straight);
  ASSERT_EQ(expected.size(), 6u);
  const std::string adapter = read_file_text(straight / "adapter/adapter_model.safetensors");

  struct Case {
    std::string crash_at;
    int64_t resumed_from;  // the checkpoint the second run must continue from
  };
  for (const Case& c : {Case{"step-start@4", 2}, Case{"checkpoint-write@4", 2}, Case{"checkpoint-done@4", 4}}) {
    SCOPED_TRACE(c.crash_at);
    const fs::path save = run.dir.path / ("crash-" + c.crash_at.substr(0, c.crash_at.find('@')));
    std::vector<std::string> a{"train", run.write_recipe(save).string(), "--device", "cpu"};
    a.insert(a.end(), kResumeSettings.begin(), kResumeSettings.end());
    ChildResult killed = run_lmtune(a, {{"LMTUNE_TEST_CRASH_AT", c.crash_at}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.output;
    EXPECT_EQ(fs::exists(save / "checkpoints/step-4.h5"), c.resumed_from == 4);
    a.push_back("resume=true");
    ChildResult resumed = run_lmtune(a);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from " + (save / "checkpoints").string() + "/step-" +
                                  std::to_string(c.resumed_from) + ".h5"),
              std::string::npos)
        << resumed.output;
    EXPECT_EQ(losses(save), expected);
    EXPECT_TRUE(read_file_text(save / "adapter/adapter_model.safetensors") == adapter) << "adapter differs";
    EXPECT_EQ(checkpoint_files(save), 2u);  // step-4 and step-6; no temporary file left behind
  }
}

TEST(TrainCli, ResumeRefusesChangedSettingsOrData) {
  CliRun run;
  const fs::path save = run.dir.path / "out";
  ChildResult r = run_lmtune({"train", run.write_recipe(save).string(), "train.steps=2", "save.every=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_lmtune({"train", run.recipe.string(), "train.steps=4", "resume=true", "lora.rank=8"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("resume: lora.rank is '8' but the checkpoint"), std::string::npos) << r.output;
  run.dir.write("train.jsonl", text_corpus(25));
  r = run_lmtune({"train", run.recipe.string(), "train.steps=4", "resume=true"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the training data differs"), std::string::npos) << r.output;
  r = run_lmtune({"train", run.recipe.string(), "train.steps=4"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("already holds checkpoints"), std::string::npos) << r.output;
}

TEST(TrainCli, BadInputsFailCleanlyWithoutCheckpoints) {
  CliRun run;
  struct Case {
    std::string name, expect;
    std::function<std::vector<std::string>(const fs::path& save)> args;
  };
  const fs::path broken_model = run.dir.path / "broken_model";
  fs::create_directories(broken_model);
  fs::copy_file(run.model / "config.json", broken_model / "config.json");
  fs::copy_file(run.model / "tokenizer.json", broken_model / "tokenizer.json");
  const fs::path bad_jsonl = run.dir.write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  const fs::path masked = run.dir.write(
      "masked.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"
                      "{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"y\"}]}\n");
  const fs::path small_vocab = run.dir.path / "small_vocab";
  fs::create_directories(small_vocab);
  for (const char* f : {"tokenizer.json", "model.safetensors"}) fs::copy_file(run.model / f, small_vocab / f);
  nlohmann::json config = nlohmann::json::parse(read_file_text(run.model / "config.json"));
  ASSERT_EQ(config["vocab_size"], 259);
  config["vocab_size"] = 200;
  config["eos_token_id"] = 2;  // the byte tokenizer's is past 200, which config.json's own check refuses
  write_file_atomic(small_vocab / "config.json", config.dump());
  const std::vector<Case> cases = {
      {"tokenizer beyond the embedding", "the tokenizer has 259 ids but config.json's vocab_size is 200",
       [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "model=" + small_vocab.string()};
       }},
      {"context beyond positions", "data.max_seq_len 1024 is beyond the model's max_position_embeddings 512",
       [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "data.max_seq_len=1024"};
       }},
      // ~2^25 tokens with rank-65536 adapters on every projection: terabytes of activations on any machine.
      {"beyond memory", "training needs an estimated", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "train.batch_size=65536",
                                         "data.max_seq_len=512", "lora.rank=65536"};
       }},
      {"unknown key", "unknown key 'train.stpes'", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "train.stpes=3"};
       }},
      {"bad value", "'fp8' is not one of", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "precision=fp8"};
       }},
      {"bad jsonl", "bad.jsonl:2: invalid JSON", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "data.train=" + bad_jsonl.string()};
       }},
      {"all masked", "no usable samples", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "data.train=" + masked.string()};
       }},
      {"missing weights", "missing model.safetensors", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "model=" + broken_model.string()};
       }},
      {"missing model dir", "model directory not found", [&](const fs::path& s) {
         return std::vector<std::string>{"train", run.write_recipe(s).string(), "model=" + (run.dir.path / "nope").string()};
       }},
  };
  for (const Case& c : cases) {
    for (bool dry : {false, true}) {
      SCOPED_TRACE(c.name + (dry ? " (dry run)" : ""));
      const fs::path save = run.dir.path / ("bad-" + std::to_string(&c - cases.data()) + (dry ? "-dry" : ""));
      std::vector<std::string> a = c.args(save);
      if (dry) a.push_back("--dry-run");
      ChildResult r = run_lmtune(a);
      EXPECT_EQ(r.exit_code, 1) << r.output;
      EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "expected one error line:\n" << r.output;
      EXPECT_EQ(checkpoint_files(save), 0u);
      EXPECT_FALSE(fs::exists(save / "adapter"));
    }
  }
}

TEST(TrainCli, DryRunPrintsRecipeStatisticsAndMemory) {
  CliRun run;
  const fs::path save = run.dir.path / "out";
  ChildResult r = run_lmtune({"train", run.write_recipe(save).string(), "--dry-run", "data.valid_split=0.25"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"# resolved recipe", "rank: 4", "training data (text)", "samples           18 (of 24 lines)",
                        "validation data", "sequences/epoch", "steps/epoch", "memory estimate", "total"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_EQ(checkpoint_files(save), 0u);
  EXPECT_FALSE(fs::exists(save / "metrics.jsonl"));
}

TEST(TrainCli, ResumeSkipsADamagedCheckpointForAnOlderGoodOne) {
  CliRun run;
  const fs::path straight = run.dir.path / "straight";
  ChildResult r = run_lmtune({"train", run.write_recipe(straight).string(), "train.steps=6", "save.every=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto expected = losses(straight);
  const std::string adapter = read_file_text(straight / "adapter/adapter_model.safetensors");

  const fs::path save = run.dir.path / "damaged";
  std::vector<std::string> a{"train", run.write_recipe(save).string(), "train.steps=6", "save.every=2"};
  r = run_lmtune(a, {{"LMTUNE_TEST_CRASH_AT", "step-start@5"}});
  ASSERT_EQ(r.signal, SIGKILL) << r.output;
  const fs::path ckpt = checkpoint_dir(save);
  const std::string dataset = damage_checkpoint(ckpt / "step-4.h5");
  a.push_back("resume=true");
  r = run_lmtune(a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping damaged checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find((ckpt / "step-4.h5").string() + ": dataset '" + dataset + "': checksum mismatch"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from " + (ckpt / "step-2.h5").string()), std::string::npos) << r.output;
  EXPECT_EQ(losses(save), expected);
  EXPECT_TRUE(read_file_text(save / "adapter/adapter_model.safetensors") == adapter) << "adapter differs";
  EXPECT_EQ(checkpoint_names(save), (std::vector<std::string>{"step-6.h5", "step-4.h5"}));
  for (const fs::path& p : list_checkpoints(save)) EXPECT_NO_THROW(verify_checkpoint(p)) << p;
}

TEST(TrainCli, ResumeWithNoGoodCheckpointFailsAndChangesNothing) {
  CliRun run;
  const fs::path save = run.dir.path / "out";
  ChildResult r = run_lmtune({"train", run.write_recipe(save).string(), "train.steps=4", "save.every=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path ckpt = checkpoint_dir(save);
  const std::string dataset = damage_checkpoint(ckpt / "step-4.h5");
  const std::string step2 = read_file_text(ckpt / "step-2.h5");
  write_file_atomic(ckpt / "step-2.h5", std::string_view(step2).substr(0, step2.size() / 2));
  const auto before = snapshot(save);

  r = run_lmtune({"train", run.recipe.string(), "train.steps=6", "resume=true"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("none of the 2 checkpoint(s) in " + ckpt.string() + " can be resumed from"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find((ckpt / "step-4.h5").string() + ": dataset '" + dataset + "': checksum mismatch"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find((ckpt / "step-2.h5").string() + ": "), std::string::npos) << r.output;
  EXPECT_TRUE(snapshot(save) == before) << "save.dir changed";

  r = run_lmtune({"train", run.recipe.string(), "train.steps=6"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("already holds checkpoints"), std::string::npos) << r.output;
  EXPECT_TRUE(snapshot(save) == before) << "save.dir changed";
}

TEST(TrainCli, TemporariesOfKilledWritesAreRemoved) {
  CliRun run;
  const fs::path save = run.dir.path / "out";
  ChildResult r = run_lmtune({"train", run.write_recipe(save).string(), "train.steps=2", "save.every=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<fs::path> stale = {checkpoint_dir(save) / ".step-1.h5.tmp.99999.0",
                                       save / "adapter/.adapter_model.safetensors.tmp.99999.0",
                                       save / ".metrics.h5.tmp.99999.0", save / ".metrics.jsonl.tmp.Ab12Cd"};
  for (const fs::path& p : stale) write_file_atomic(p, std::string_view("left by a killed writer"));
  r = run_lmtune({"train", run.recipe.string(), "train.steps=3", "save.every=1", "resume=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const fs::path& p : stale) EXPECT_FALSE(fs::exists(p)) << p;
}

TEST(TrainCli, FullDiskStopsWithAnErrorNotACrash) {
  CliRun run;
  // Files may not grow past 24 KiB: metrics.h5 (34 KiB after a few rows) is the first to fail.
  const fs::path fresh = run.dir.path / "fresh";
  ChildResult r = run_lmtune({"train", run.write_recipe(fresh).string(), "train.steps=3"}, {}, 24 << 10);
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((fresh / "metrics.h5").string() + ": /: flush failed: file write failed: File too large"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[warning]"), std::string::npos) << r.output;

  // 64 KiB: the checkpoint (94 KiB) fails; the earlier checkpoints and the adapter stay as they were.
  const fs::path save = run.dir.path / "resumed";
  r = run_lmtune({"train", run.write_recipe(save).string(), "train.steps=2", "save.every=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = snapshot(save / "checkpoints");
  const std::string adapter = read_file_text(save / "adapter/adapter_model.safetensors");
  r = run_lmtune({"train", run.recipe.string(), "train.steps=3", "save.every=1", "resume=true"}, {}, 64 << 10);
  EXPECT_EQ(r.signal, 0) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((checkpoint_dir(save) / "step-3.h5").string() + ": not written"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_TRUE(snapshot(save / "checkpoints") == before) << "checkpoints changed, or a temporary file was left";
  EXPECT_TRUE(read_file_text(save / "adapter/adapter_model.safetensors") == adapter) << "adapter changed";
}
