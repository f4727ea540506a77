// Checkpoint files in-process: checksums catch damaged bytes, and retention keeps good checkpoints over damaged
// ones (and over ones a replaced run left beyond the current step).
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hdf5_file.h"
#include "train/checkpoint.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

struct Saver {
  TempDir dir{"ckpt"};
  Optimizer opt{{{"layer.lora_A", leaf(values())}}, Recipe::Optimizer{}};

  static Tensor leaf(const std::vector<float>& v) {
    Tensor t = Tensor::from_floats(v, {int64_t(v.size())});
    t.set_requires_grad(true);
    return t;
  }
  static std::vector<float> values() {
    std::vector<float> v(32);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.37f + 0.013f * float(i);
    return v;
  }
  fs::path file(int64_t step) const { return checkpoint_dir(dir.path) / ("step-" + std::to_string(step) + ".h5"); }
  fs::path save(int64_t step) {
    TrainProgress pr;
    pr.step = step;
    return save_checkpoint(dir.path, pr, opt, {"model: m\n", "hash"});
  }
  // 64 flipped bytes inside the weights' data: the file stays valid HDF5.
  void damage(int64_t step) const {
    const std::vector<float> v = values();
    std::string bytes = read_file_text(file(step));
    const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(v.data()), 16));
    ASSERT_NE(at, std::string::npos);
    for (size_t i = at; i < at + 64; ++i) bytes[i] = char(~bytes[i]);
    write_file_atomic(file(step), bytes);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const fs::path& p : list_checkpoints(dir.path)) out.push_back(p.filename().string());
    return out;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Checkpoint, DamagedDataFailsVerificationNamingFileAndDataset) {
  Saver s;
  s.save(2);
  EXPECT_EQ(verify_checkpoint(s.file(2)).dataset_hash, "hash");
  s.damage(2);
  const std::string msg = error_of([&] { verify_checkpoint(s.file(2)); });
  EXPECT_NE(msg.find(s.file(2).string() + ": dataset '/params/layer.lora_A': checksum mismatch"), std::string::npos)
      << msg;
  Optimizer other{{{"layer.lora_A", Saver::leaf(std::vector<float>(32))}}, Recipe::Optimizer{}};
  EXPECT_NE(error_of([&] { load_checkpoint(s.file(2), other); }).find("checksum mismatch"), std::string::npos);
}

TEST(Checkpoint, RetentionKeepsGoodCheckpointsOverDamagedOnes) {
  Saver s;
  s.save(2);
  s.save(4);
  s.damage(4);
  s.save(6);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"step-6.h5", "step-2.h5"}));
  s.save(8);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"step-8.h5", "step-6.h5"}));
}

TEST(Checkpoint, RetentionRemovesCheckpointsBeyondTheNewOne) {
  // A run resumed from step 2 past a damaged step-8, or restarted with --overwrite: its own saves are kept.
  Saver s;
  s.save(2);
  s.save(8);
  s.damage(8);
  s.save(4);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"step-4.h5", "step-2.h5"}));
}

TEST(Checkpoint, ResumeSkipsDamagedAndRefusesWhenNoneIsGood) {
  Saver s;
  EXPECT_FALSE(find_resume_checkpoint(s.dir.path).has_value());
  s.save(2);
  s.save(4);
  s.damage(4);
  std::optional<ResumePoint> p = find_resume_checkpoint(s.dir.path);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->file, s.file(2));
  s.damage(2);
  const std::string msg = error_of([&] { find_resume_checkpoint(s.dir.path); });
  EXPECT_NE(msg.find("none of the 2 checkpoint(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(s.file(4).string() + ": dataset '/params/layer.lora_A': checksum mismatch"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(s.file(2).string() + ": dataset"), std::string::npos) << msg;
}
