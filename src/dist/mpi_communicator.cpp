// MPI_COMM_WORLD as a Communicator (see communicator.h). Built only when CMake found MPI (LMTUNE_HAVE_MPI);
// otherwise make_mpi_communicator() explains that this binary cannot join an mpirun job.
#include "dist/communicator.h"

#include <spdlog/spdlog.h>

#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

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

// Float all-reduces started by start_all_reduce_sum run one after another as blocking MPI_Allreduce calls on a
// thread of their own, so they progress while the caller copies the next bucket off the device. MPI's
// non-blocking collectives progress only inside MPI calls, which the caller makes none of meanwhile: with
// MPI_Iallreduce, Llama-3.1-8B's gradient exchange on two H100s took 0.29 s per step, on this thread 0.13 s
// (bench/RESULTS.md).
class ReduceThread {
 public:
  ReduceThread() : thread_([this] { run(); }) {}
  ~ReduceThread() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  std::future<void> start(std::span<float> v) {
    std::packaged_task<void()> task([v] {
      MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    std::future<void> done = task.get_future();
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void run() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class ThreadReduce final : public PendingReduce {
 public:
  explicit ThreadReduce(std::future<void> done) : done_(std::move(done)) {}
  ~ThreadReduce() override {
    if (done_.valid()) done_.wait();  // never leave MPI writing into a freed buffer
  }
  void wait() override { done_.get(); }

 private:
  std::future<void> done_;
};

class DoneReduce final : public PendingReduce {
 public:
  void wait() override {}
};

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int provided = 0;
    // The main thread makes every MPI call but the float all-reduces, which run on a thread of their own
    // (ReduceThread) when MPI allows calls from several threads, else on the main thread as they are started.
    // The CPU backend's pool and Vulkan never call MPI.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (provided >= MPI_THREAD_MULTIPLE) reducer_ = std::make_unique<ReduceThread>();
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
    reducer_.reset();
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
    count(v.size());
    if (reducer_) return std::make_unique<ThreadReduce>(reducer_->start(v));
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return std::make_unique<DoneReduce>();
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
  std::unique_ptr<ReduceThread> reducer_;
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
