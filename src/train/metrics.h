// Training metrics on disk: save.dir/metrics.jsonl (one JSON object per row, appended and flushed as it goes:
// the crash-safe record) mirrored into save.dir/metrics.h5 (one appendable dataset per metric under /train and
// /valid, plus a /<group>/step column). On resume the files are cut back to the checkpoint's step and the HDF5
// file is rebuilt from the JSONL, so a killed run never leaves duplicate or torn rows.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lmtune {

class Hdf5File;

using MetricValues = std::vector<std::pair<std::string, double>>;

class MetricsLog {
 public:
  // keep_through_step < 0 starts new files; otherwise rows with step <= keep_through_step are kept.
  MetricsLog(const std::filesystem::path& save_dir, int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends one row to `group` ("train" or "valid") at `step`.
  void log(const std::string& group, int64_t step, const MetricValues& values);

 private:
  static void append_h5(Hdf5File& h5, const std::string& group, int64_t step, const MetricValues& values);
  std::filesystem::path jsonl_path_, h5_path_;
  std::ofstream jsonl_;
  std::unique_ptr<Hdf5File> h5_;
  bool h5_failed_ = false;
};

// One row as read back from metrics.jsonl ("split", "step" and the metrics).
struct MetricsRow {
  std::string split;
  int64_t step = 0;
  MetricValues values;
  double get(const std::string& name) const;  // NaN when absent
};
std::vector<MetricsRow> read_metrics_jsonl(const std::filesystem::path& file);

}  // namespace lmtune
