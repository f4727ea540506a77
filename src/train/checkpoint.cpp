// Checkpoint files (see checkpoint.h).
#include "train/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "io/hdf5_file.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kFormatVersion = 1;

// step-N.h5 -> N, or -1 for other names.
int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("step-", 0) != 0 || p.extension() != ".h5") return -1;
  try {
    size_t used = 0;
    std::string digits = name.substr(5, name.size() - 8);
    int64_t n = std::stoll(digits, &used);
    return used == digits.size() ? n : -1;
  } catch (...) {
    return -1;
  }
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (int64_t s = step_of(e.path()); s >= 0) out.emplace_back(s, e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void test_crash_point(const char* point, int64_t step) {
  static const char* spec = std::getenv("LMTUNE_TEST_CRASH_AT");
  if (!spec || !*spec) return;
  std::string s(spec), name = s, at;
  if (size_t i = s.find('@'); i != std::string::npos) {
    name = s.substr(0, i);
    at = s.substr(i + 1);
  }
  if (name != point || (!at.empty() && at != std::to_string(step))) return;
  spdlog::default_logger()->flush();
  std::raise(SIGKILL);
}

fs::path checkpoint_dir(const fs::path& save_dir) { return save_dir / "checkpoints"; }

fs::path save_checkpoint(const fs::path& save_dir, const TrainProgress& pr, const Optimizer& opt,
                         const CheckpointMeta& meta, int keep) {
  const fs::path dir = checkpoint_dir(save_dir);
  fs::create_directories(dir);
  const fs::path file = dir / ("step-" + std::to_string(pr.step) + ".h5");
  save_hdf5_atomic(file, [&](Hdf5File& f) {
    f.set_attr("/", "format", "lmtune-checkpoint");
    f.set_attr("/", "version", kFormatVersion);
    f.set_attr("/", "recipe", meta.recipe_yaml);
    f.set_attr("/", "dataset_hash", meta.dataset_hash);
    f.set_attr("/", "step", pr.step);
    f.set_attr("/", "data_epoch", pr.cursor.epoch);
    f.set_attr("/", "data_index", pr.cursor.index);
    f.set_attr("/", "loss_scale", pr.scaler.scale);
    f.set_attr("/", "loss_scale_good_steps", pr.scaler.good_steps);
    f.set_attr("/", "consecutive_skips", pr.consecutive_skips);
    f.set_attr("/", "skipped_steps", pr.skipped_steps);
    f.set_attr("/", "tokens_seen", pr.tokens_seen);
    f.set_attr("/", "elapsed_s", pr.elapsed_s);
    f.set_attr("/", "rng_seed", std::to_string(pr.seed));  // u64 as text: HDF5 int attributes here are i64
    save_params(f, "params", opt.params());
    test_crash_point("checkpoint-write", pr.step);
    opt.save(f, "optimizer");
  });
  // Keep the newest `keep`; remove temporary files a killed writer left behind.
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove(all[i].second);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".step-", 0) == 0 && n.find(".tmp.") != std::string::npos) {
      std::error_code ec;
      fs::remove(e.path(), ec);
    }
  }
  return file;
}

std::optional<fs::path> latest_checkpoint(const fs::path& save_dir) {
  auto all = list_checkpoints(checkpoint_dir(save_dir));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      Hdf5File f = Hdf5File::open(it->second);
      if (f.has_attr("/", "format") && f.attr_string("/", "format") == "lmtune-checkpoint") return it->second;
    } catch (const Error& e) {
      spdlog::warn("skipping unreadable checkpoint {}: {}", it->second.string(), e.what());
    }
  }
  return std::nullopt;
}

CheckpointMeta read_checkpoint_meta(const fs::path& file) {
  Hdf5File f = Hdf5File::open(file);
  if (f.attr_int("/", "version") != kFormatVersion)
    throw FileError(file.string() + ": checkpoint format version " + std::to_string(f.attr_int("/", "version")) +
                    " is not supported");
  return {f.attr_string("/", "recipe"), f.attr_string("/", "dataset_hash")};
}

TrainProgress load_checkpoint(const fs::path& file, Optimizer& opt) {
  Hdf5File f = Hdf5File::open(file);
  TrainProgress pr;
  pr.step = f.attr_int("/", "step");
  pr.cursor.epoch = f.attr_int("/", "data_epoch");
  pr.cursor.index = f.attr_int("/", "data_index");
  pr.scaler.scale = f.attr_double("/", "loss_scale");
  pr.scaler.good_steps = f.attr_int("/", "loss_scale_good_steps");
  pr.consecutive_skips = f.attr_int("/", "consecutive_skips");
  pr.skipped_steps = f.attr_int("/", "skipped_steps");
  pr.tokens_seen = f.attr_int("/", "tokens_seen");
  pr.elapsed_s = f.attr_double("/", "elapsed_s");
  pr.seed = std::stoull(f.attr_string("/", "rng_seed"));
  load_params(f, "params", opt.params());
  opt.load(f, "optimizer");
  return pr;
}

}  // namespace lmtune
