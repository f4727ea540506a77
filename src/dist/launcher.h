// `--devices 0,1,…`: a command re-executes itself under mpirun with one rank per listed device of this host
// (docs/training.md, "Several devices"). The flags keep the job on this host and on shared memory, so it needs
// neither ssh nor a network: plm isolated, btl self,vader, pml ob1, no single-copy (CMA is often barred inside
// containers), no core binding (each rank runs its own CPU thread pool) and --allow-run-as-root for root.
#pragma once
#include <string>
#include <vector>

namespace lmtune::dist {

// The mpirun command line that runs `command` (argv, the program first) as `ranks` ranks on this host.
std::vector<std::string> mpirun_command(const std::string& mpirun, int ranks, const std::vector<std::string>& command);

// mpirun on PATH, else the one CMake found; throws ConfigError when there is none or MPI is not built in.
std::string find_mpirun();

// Replaces this process by mpirun running `command` as `ranks` ranks; throws Error when exec fails.
[[noreturn]] void exec_under_mpirun(int ranks, const std::vector<std::string>& command);

// The comma-separated device indices of --devices ("0,1" -> 0, 1); throws ConfigError naming the option on
// anything but distinct non-negative integers.
std::vector<int> parse_device_list(const std::string& option, const std::string& value);

}  // namespace lmtune::dist
