// Collectives between the ranks of a data-parallel job (docs/training.md, "Several devices"): one process per
// device, launched by mpirun (or by `--devices`, which runs mpirun itself). The trainer sums gradients and losses
// through this interface; the MPI implementation does the work, and a single-process one stands in for a run on
// one device, so training has one code path. Nothing below src/train knows of MPI.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace lmtune::dist {

// A collective started on a buffer that must stay alive (and untouched) until wait() returns.
class PendingReduce {
 public:
  virtual ~PendingReduce() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;        // 0 .. size()-1
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks on this host: picks the device
  virtual int local_size() const = 0;
  virtual const std::string& host() const = 0;
  bool is_root() const { return rank() == 0; }
  // "rank 1 of 2 on host-a": how errors name a rank.
  std::string where() const;

  // Element-wise sums over all ranks, in place; every rank ends with the same values.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual std::unique_ptr<PendingReduce> start_all_reduce_sum(std::span<float> values) = 0;
  // Every rank's `value`, indexed by rank.
  virtual std::vector<double> all_gather(double value) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with `exit_code` (MPI_Abort); a single process just exits.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// True when this process is a rank that mpirun (OpenMPI, or a PMI launcher such as MPICH's hydra) started.
bool launched_by_mpi();
// Whether this build can run several ranks (CMake found MPI).
bool mpi_built_in();

// The job's communicator: MPI's world when launched_by_mpi(), else a single process. MPI is initialized on the
// first call and finalized at exit. Throws ConfigError when launched by mpirun but built without MPI.
Communicator& world();
std::unique_ptr<Communicator> single_process();
// MPI_COMM_WORLD; only after launched_by_mpi() says so (mpi_communicator.cpp).
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace lmtune::dist
