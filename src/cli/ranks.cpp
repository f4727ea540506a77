// Rank setup and the --devices launcher (see ranks.h).
#include "cli/ranks.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/error.h"
#include "dist/launcher.h"

namespace lmtune::cli {
namespace {

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

// The program itself by absolute path: mpirun starts it from its own working directory and PATH.
std::string self_executable() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? command_line().at(0) : self.string();
}

bool is_cpu_spec(const std::string& spec) { return spec == "cpu" || (spec == "auto" && choose_device().is_cpu()); }

// The device of local rank `local` of `local_size`: the listed index, else the local rank itself.
std::string rank_device(const std::string& spec, const std::vector<int>& listed, int local, int local_size) {
  if (!listed.empty() && int(listed.size()) != local_size)
    throw ConfigError("--devices lists " + std::to_string(listed.size()) + " device(s) but mpirun started " +
                      std::to_string(local_size) + " rank(s) on this host; list one device per rank");
  if (is_cpu_spec(spec)) return "cpu";
  if (spec.starts_with("vulkan:") && listed.empty() && local_size > 1)
    throw ConfigError("device '" + spec + "' names one GPU for " + std::to_string(local_size) + " ranks on this "
                      "host; use device vulkan (local rank i takes vulkan:i) or --devices");
  return "vulkan:" + std::to_string(listed.empty() ? local : listed[size_t(local)]);
}

void join_logs(const dist::Communicator& ranks) {
  spdlog::set_pattern("[%H:%M:%S] [rank " + std::to_string(ranks.rank()) + "] [%^%l%$] %v");
  if (!ranks.is_root()) spdlog::set_level(spdlog::level::warn);  // rank 0 tells the story; others only trouble
  spdlog::info("rank {} of {} on {}; {} rank(s) on this host", ranks.rank(), ranks.size(), ranks.host(),
               ranks.local_size());
}

}  // namespace

void set_command_line(int argc, char** argv) { command_line().assign(argv, argv + argc); }

void run_on_ranks(const std::string& devices, const std::string& device_spec,
                  const std::function<void(const RankSetup&)>& work) {
  const std::vector<int> listed = devices.empty() ? std::vector<int>{} : dist::parse_device_list("--devices", devices);
  RankSetup setup;
  if (!dist::launched_by_mpi()) {
    if (listed.size() > 1) {
      std::vector<std::string> command = command_line();
      command.at(0) = self_executable();
      dist::exec_under_mpirun(int(listed.size()), command);
    }
    setup.device = listed.empty() ? device_spec : rank_device(device_spec, listed, 0, 1);
    return work(setup);
  }
  dist::Communicator& ranks = dist::world();
  setup.ranks = &ranks;
  try {
    join_logs(ranks);
    setup.device = rank_device(device_spec, listed, ranks.local_rank(), ranks.local_size());
    if (ranks.local_size() > 1) {
      const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
      cpu::set_num_threads(std::max(1, cores / ranks.local_size()));
    }
    work(setup);
  } catch (const std::exception& e) {
    if (ranks.size() == 1) throw;
    spdlog::error("{} failed, stopping all ranks: {}", ranks.where(), e.what());
    ranks.abort(1);
  }
}

}  // namespace lmtune::cli
