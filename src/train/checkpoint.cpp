// Checkpoint files (see checkpoint.h).
#include "train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "io/hdf5_file.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

// 2: sealed with checksums (Hdf5File::seal). 1 (no checksums) is still read, with a warning.
constexpr int64_t kFormatVersion = 2;

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

// Checkpoints this process has verified, as the file they were then (a replaced or rewritten file has another
// inode or time), so that retention does not re-read every kept, possibly large, checkpoint at every save.
struct FileIdentity {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns;
  bool operator==(const FileIdentity&) const = default;
};
std::mutex verified_mutex;
std::map<fs::path, FileIdentity> verified_files;

std::optional<FileIdentity> file_identity(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino, st.st_size, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void remember_verified(const fs::path& file) {
  std::lock_guard lock(verified_mutex);
  if (auto id = file_identity(file)) verified_files[file] = *id;
}

// Why `file` cannot be resumed from, or "" when it verifies.
std::string checkpoint_problem(const fs::path& file) {
  {
    std::lock_guard lock(verified_mutex);
    auto it = verified_files.find(file);
    if (it != verified_files.end() && file_identity(file) == it->second) return "";
  }
  try {
    verify_checkpoint(file);
  } catch (const std::exception& e) {  // damaged files can fail in any way; none may stop retention or resume
    return e.what();
  }
  remember_verified(file);
  return "";
}

void remove_checkpoint(const fs::path& file, const std::string& why) {
  std::error_code ec;
  fs::remove(file, ec);
  if (ec) spdlog::warn("cannot remove {}: {}", file.string(), ec.message());
  else if (!why.empty()) spdlog::warn("removed checkpoint {}: {}", file.string(), why);
  std::lock_guard lock(verified_mutex);
  verified_files.erase(file);
}

void prune_checkpoints(const fs::path& save_dir, const fs::path& newest, int64_t newest_step, int keep) {
  int good = 1;  // `newest` was verified
  for (const fs::path& file : list_checkpoints(save_dir)) {
    if (file == newest) continue;
    if (step_of(file) > newest_step) {
      remove_checkpoint(file, "its step is beyond the one just saved, so it belongs to a run this one replaced");
      continue;
    }
    if (good >= keep) {
      remove_checkpoint(file, "");
      continue;
    }
    if (std::string why = checkpoint_problem(file); !why.empty())
      remove_checkpoint(file, "damaged (" + why + ")");
    else
      ++good;
  }
}

void remove_stale_temporaries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".step-", 0) == 0 && n.find(".tmp.") != std::string::npos) {
      std::error_code ec;
      fs::remove(e.path(), ec);
    }
  }
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

std::vector<fs::path> list_checkpoints(const fs::path& save_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  const fs::path dir = checkpoint_dir(save_dir);
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir))
    if (int64_t s = step_of(e.path()); s >= 0) found.emplace_back(s, e.path());
  std::sort(found.rbegin(), found.rend());
  std::vector<fs::path> out;
  for (auto& [step, file] : found) out.push_back(std::move(file));
  return out;
}

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
    f.set_attr("/", "ranks", meta.ranks);
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
    f.seal();
  });
  // Retention trusts the new file only once it reads back intact; until then nothing older is removed.
  if (std::string why = checkpoint_problem(file); !why.empty()) {
    remove_checkpoint(file, "");
    throw FileError("the checkpoint just written does not read back intact (earlier checkpoints are kept): " + why);
  }
  prune_checkpoints(save_dir, file, pr.step, std::max(keep, 1));
  remove_stale_temporaries(dir);
  return file;
}

CheckpointMeta verify_checkpoint(const fs::path& file) {
  Hdf5File f = Hdf5File::open(file);
  if (!f.has_attr("/", "format") || f.attr_string("/", "format") != "lmtune-checkpoint")
    throw FileError(file.string() + ": not an lmtune checkpoint (root attribute 'format' is missing or wrong)");
  const int64_t version = f.attr_int("/", "version");
  if (version == kFormatVersion)
    f.verify_seal();
  else if (version == 1)
    spdlog::warn("{}: checkpoint format 1 carries no checksums, so damage to it cannot be detected", file.string());
  else
    throw FileError(file.string() + ": checkpoint format version " + std::to_string(version) + " is not supported");
  return {f.attr_string("/", "recipe"), f.attr_string("/", "dataset_hash"),
          f.has_attr("/", "ranks") ? f.attr_int("/", "ranks") : 1};
}

std::optional<ResumePoint> find_resume_checkpoint(const fs::path& save_dir) {
  const std::vector<fs::path> all = list_checkpoints(save_dir);
  if (all.empty()) return std::nullopt;
  std::vector<std::string> problems;
  for (const fs::path& file : all) {
    CheckpointMeta meta;
    try {
      meta = verify_checkpoint(file);
    } catch (const std::exception& e) {  // a damaged file can fail in any way
      problems.emplace_back(e.what());
      continue;
    }
    remember_verified(file);
    for (const std::string& why : problems)
      spdlog::warn("resume: skipping damaged checkpoint, resuming from {} instead: {}", file.string(), why);
    return ResumePoint{file, std::move(meta)};
  }
  std::string msg = "resume: none of the " + std::to_string(all.size()) + " checkpoint(s) in " +
                    checkpoint_dir(save_dir).string() + " can be resumed from; nothing in save.dir was changed:";
  for (const std::string& why : problems) msg += "\n  " + why;
  msg += "\nRestore a good copy of a checkpoint there, or start again with resume=false and --overwrite";
  throw Error(msg);
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
