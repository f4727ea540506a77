// Several devices for `lmtune train` and `lmtune bench train` (docs/training.md, "Several devices"): --devices
// re-executes the command under mpirun, one rank per listed device; a rank (started that way or by the user's own
// mpirun) joins the job, takes its device from its local rank and a fair share of the host's CPU threads.
#pragma once
#include <functional>
#include <string>

#include "dist/communicator.h"

namespace lmtune::cli {

// The whole command line, for re-executing it under mpirun (main() records it).
void set_command_line(int argc, char** argv);

struct RankSetup {
  dist::Communicator* ranks = nullptr;  // null: this process trains alone
  std::string device;                   // this process's device spec
};

// Runs a command's work as this process's rank. `devices`: the --devices value ("" when absent); `device_spec`:
// --device, else the recipe's device ("auto" for bench). Several devices outside mpirun: execs mpirun and never
// returns. Under mpirun, a rank's device comes from its local rank (through --devices when given); a mismatch
// (2 ranks on a host for a list of 3, a fixed vulkan:N for several local ranks) is a ConfigError. On several
// ranks any exception is logged with the rank and host and ends the whole job (MPI_Abort, exit code 1), so no
// rank waits forever in a collective for one that is gone.
void run_on_ranks(const std::string& devices, const std::string& device_spec,
                  const std::function<void(const RankSetup&)>& work);

}  // namespace lmtune::cli
