// MPI_COMM_WORLD as a Communicator (see communicator.h). Built only when CMake found MPI (LMTUNE_HAVE_MPI);
// otherwise make_mpi_communicator() explains that this binary cannot join an mpirun job.
#include "dist/communicator.h"

#include <spdlog/spdlog.h>

#include <climits>
#include <cstdlib>

#include "core/error.h"

#ifdef LMTUNE_HAVE_MPI
// The C API only: mpi.h would otherwise pull in the removed MPI-2 C++ bindings, which need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace lmtune::dist {

bool mpi_built_in() {
#ifdef LMTUNE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifdef LMTUNE_HAVE_MPI
namespace {

class MpiReduce final : public PendingReduce {
 public:
  explicit MpiReduce(MPI_Request request) : request_(request) {}
  ~MpiReduce() override {
    if (request_ != MPI_REQUEST_NULL) MpiReduce::wait();  // never leave MPI writing into a freed buffer
  }
  void wait() override { MPI_Wait(&request_, MPI_STATUS_IGNORE); }

 private:
  MPI_Request request_;
};

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int provided = 0;
    // Only the main thread calls MPI; the CPU backend's pool and Vulkan never do.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_);
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Comm_size(local_, &local_size_);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, size_t(len));
  }
  ~MpiWorld() override {
    MPI_Comm_free(&local_);
    MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  const std::string& host() const override { return host_; }

  void all_reduce_sum(std::span<double> v) override {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  std::unique_ptr<PendingReduce> start_all_reduce_sum(std::span<float> v) override {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
    return std::make_unique<MpiReduce>(request);
  }
  std::vector<double> all_gather(double value) override {
    std::vector<double> out(size_t(size_), 0.0);
    MPI_Allgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
    return out;
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  [[noreturn]] void abort(int exit_code) override {
    spdlog::default_logger()->flush();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

 private:
  static int count(size_t n) {
    if (n > size_t(INT_MAX)) throw Error("all-reduce of " + std::to_string(n) + " values: more than MPI's int count");
    return int(n);
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  MPI_Comm local_ = MPI_COMM_NULL;
  std::string host_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiWorld>(); }

#else

std::unique_ptr<Communicator> make_mpi_communicator() {
  throw ConfigError("this process was started by mpirun, but this lmtune was built without MPI (install "
                    "libopenmpi-dev and reconfigure with -DLMTUNE_MPI=ON); it can train on one device only");
}

#endif

}  // namespace lmtune::dist
