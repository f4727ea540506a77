// mpirun for --devices (see launcher.h).
#include "dist/launcher.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "dist/communicator.h"

namespace lmtune::dist {
namespace fs = std::filesystem;

std::vector<std::string> mpirun_command(const std::string& mpirun, int ranks, const std::vector<std::string>& command) {
  std::vector<std::string> argv{mpirun, "-np", std::to_string(ranks), "--oversubscribe", "--bind-to", "none",
                                "--mca", "plm", "isolated", "--mca", "btl", "self,vader", "--mca", "pml", "ob1",
                                "--mca", "btl_vader_single_copy_mechanism", "none"};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::string find_mpirun() {
  if (!mpi_built_in())
    throw ConfigError("--devices with more than one device needs MPI, and this lmtune was built without it "
                      "(install libopenmpi-dev openmpi-bin and rebuild)");
  if (const char* path = std::getenv("PATH")) {
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty() && ::access((fs::path(dir) / "mpirun").c_str(), X_OK) == 0)
        return (fs::path(dir) / "mpirun").string();
  }
#ifdef LMTUNE_MPIEXEC
  if (::access(LMTUNE_MPIEXEC, X_OK) == 0) return LMTUNE_MPIEXEC;
#endif
  throw ConfigError("--devices with more than one device runs mpirun, which is not on PATH (install openmpi-bin, "
                    "or put OpenMPI's bin directory on PATH and set OPAL_PREFIX for a relocated copy)");
}

void exec_under_mpirun(int ranks, const std::vector<std::string>& command) {
  const std::vector<std::string> argv = mpirun_command(find_mpirun(), ranks, command);
  std::string line;
  for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
  spdlog::info("launching {} ranks: {}", ranks, line);
  spdlog::default_logger()->flush();
  std::vector<char*> raw;
  for (const std::string& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
  raw.push_back(nullptr);
  ::execv(raw[0], raw.data());
  throw Error("cannot run " + argv[0] + ": " + std::strerror(errno));
}

std::vector<int> parse_device_list(const std::string& option, const std::string& value) {
  std::vector<int> out;
  if (!value.empty() && value.back() == ',')
    throw ConfigError(option + " '" + value + "': expected comma-separated device indices such as 0,1 (it ends in a "
                      "comma)");
  std::istringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    errno = 0;
    const long i = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || i < 0 || i > 1024)
      throw ConfigError(option + " '" + value + "': expected comma-separated device indices such as 0,1 (got '" +
                        item + "')");
    if (std::find(out.begin(), out.end(), int(i)) != out.end())
      throw ConfigError(option + " '" + value + "': device " + item + " is listed twice");
    out.push_back(int(i));
  }
  if (out.empty()) throw ConfigError(option + " is empty: list device indices such as 0,1");
  return out;
}

}  // namespace lmtune::dist
