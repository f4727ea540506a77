// Metrics files (see metrics.h).
#include "train/metrics.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hdf5_file.h"

namespace lmtune {
namespace fs = std::filesystem;
using json = nlohmann::json;

double MetricsRow::get(const std::string& name) const {
  for (const auto& [k, v] : values)
    if (k == name) return v;
  return std::nan("");
}

std::vector<MetricsRow> read_metrics_jsonl(const fs::path& file) {
  std::vector<MetricsRow> rows;
  if (!fs::exists(file)) return rows;
  std::istringstream in(read_file_text(file));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      break;  // a line torn by a crash ends the usable record
    }
    MetricsRow r;
    r.split = j.value("split", "");
    r.step = j.value("step", int64_t(0));
    for (const auto& [k, v] : j.items())
      if (k != "split" && k != "step") r.values.emplace_back(k, v.is_number() ? v.get<double>() : std::nan(""));
    rows.push_back(std::move(r));
  }
  return rows;
}

namespace {

std::string row_json(const std::string& group, int64_t step, const MetricValues& values) {
  json j;
  j["split"] = group;
  j["step"] = step;
  for (const auto& [k, v] : values) j[k] = std::isfinite(v) ? json(v) : json(nullptr);
  return j.dump();
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& save_dir, int64_t keep_through_step)
    : jsonl_path_(save_dir / "metrics.jsonl"), h5_path_(save_dir / "metrics.h5") {
  fs::create_directories(save_dir);
  std::vector<MetricsRow> kept;
  if (keep_through_step >= 0)
    for (MetricsRow& r : read_metrics_jsonl(jsonl_path_))
      if (r.step <= keep_through_step) kept.push_back(std::move(r));
  std::string text;
  for (const MetricsRow& r : kept) text += row_json(r.split, r.step, r.values) + "\n";
  write_file_atomic(jsonl_path_, text);
  // Rebuilt through a temporary file like every other replacement, so a kill or a full disk here leaves the
  // previous metrics.h5 (or none), and the next write of it removes any temporary left behind.
  save_hdf5_atomic(h5_path_, [&](Hdf5File& f) {
    for (const MetricsRow& r : kept) append_h5(f, r.split, r.step, r.values);
  });
  h5_ = std::make_unique<Hdf5File>(Hdf5File::open(h5_path_, true));
  jsonl_.open(jsonl_path_, std::ios::app);
  if (!jsonl_) throw FileError(jsonl_path_.string() + ": cannot open for appending: " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  // After a failed write (a full disk) closing fails too, repeating the error already reported; the
  // destructor of h5_ closes quietly instead.
  if (h5_failed_) return;
  try {
    if (h5_) h5_->close();
  } catch (const Error& e) {
    spdlog::warn("{}", e.what());
  }
}

void MetricsLog::append_h5(Hdf5File& h5, const std::string& group, int64_t step, const MetricValues& values) {
  const std::string step_ds = group + "/step";
  if (!h5.exists(step_ds)) {
    h5.create_group(group);
    h5.create_appendable<int64_t>(step_ds, 256);
  }
  h5.append<int64_t>(step_ds, std::vector<int64_t>{step});
  for (const auto& [k, v] : values) {
    const std::string ds = group + "/" + k;
    if (!h5.exists(ds)) h5.create_appendable<float>(ds, 256);
    h5.append<float>(ds, std::vector<float>{float(v)});
  }
}

void MetricsLog::log(const std::string& group, int64_t step, const MetricValues& values) {
  jsonl_ << row_json(group, step, values) << '\n';
  jsonl_.flush();
  // A full disk must stop the run with its cause, not lose rows silently.
  if (!jsonl_) throw FileError(jsonl_path_.string() + ": write failed: " + std::strerror(errno));
  try {
    append_h5(*h5_, group, step, values);
    h5_->flush();
  } catch (const Error&) {
    h5_failed_ = true;
    throw;
  }
}

}  // namespace lmtune
