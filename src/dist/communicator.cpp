// The single-process communicator, launch detection and the job's world (see communicator.h).
#include "dist/communicator.h"

#include <unistd.h>

#include <cstdlib>

#include "core/error.h"

namespace lmtune::dist {
namespace {

class SingleProcess final : public Communicator {
 public:
  SingleProcess() {
    char name[256] = {};
    host_ = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  const std::string& host() const override { return host_; }
  void all_reduce_sum(std::span<double>) override {}
  std::unique_ptr<PendingReduce> start_all_reduce_sum(std::span<float>) override {
    struct Done final : PendingReduce {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  std::vector<double> all_gather(double value) override { return {value}; }
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  std::string host_;
};

}  // namespace

std::string Communicator::where() const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " on " + host();
}

bool launched_by_mpi() {
  // OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMI(x) launchers (hydra, srun) set PMI_SIZE or PMIX_RANK.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* v = std::getenv(name); v && *v) return true;
  return false;
}

std::unique_ptr<Communicator> single_process() { return std::make_unique<SingleProcess>(); }

Communicator& world() {
  static std::unique_ptr<Communicator> w = launched_by_mpi() ? make_mpi_communicator() : single_process();
  return *w;
}

}  // namespace lmtune::dist
