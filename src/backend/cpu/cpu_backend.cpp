// CPU backend: 64-byte aligned host buffers with usage accounting, and a small persistent thread pool.
#include "backend/cpu/cpu_backend.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>
#include <unistd.h>

#include "core/error.h"

namespace lmtune::cpu {
namespace {

struct Usage {
  std::atomic<size_t> in_use{0};
  std::atomic<size_t> peak{0};
  void add(size_t n) {
    size_t now = in_use += n;
    size_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {}
  }
};

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(size_t bytes, Usage& usage) : bytes_(bytes), usage_(usage) {
    size_t rounded = (bytes + 63) / 64 * 64;
    data_ = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !data_)
      throw OutOfMemoryError("cpu: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    usage_.add(bytes_);
  }
  ~CpuBuffer() override {
    std::free(data_);
    usage_.in_use -= bytes_;
  }
  size_t bytes() const override { return bytes_; }
  Device device() const override { return Device::cpu(); }
  void* host_data() override { return data_; }

 private:
  size_t bytes_;
  Usage& usage_;
  void* data_ = nullptr;
};

// MemAvailable from /proc/meminfo (what the kernel can give without swapping), else the free physical pages.
size_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return size_t(std::strtoull(line.c_str() + 13, nullptr, 10)) * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Buffer> allocate(size_t bytes) override { return std::make_shared<CpuBuffer>(bytes, usage_); }
  void write(Buffer& dst, size_t offset, const void* src, size_t bytes) override {
    std::memcpy(static_cast<char*>(dst.host_data()) + offset, src, bytes);
  }
  void read(Buffer& src, size_t offset, void* dst, size_t bytes) override {
    std::memcpy(dst, static_cast<char*>(src.host_data()) + offset, bytes);
  }
  void fill(Buffer& dst, uint32_t word) override {
    auto* p = static_cast<unsigned char*>(dst.host_data());
    unsigned char pattern[4];
    std::memcpy(pattern, &word, 4);
    const size_t n = dst.bytes(), whole = n / 4 * 4;
    if (word == 0) {
      std::memset(p, 0, n);
      return;
    }
    for (size_t i = 0; i < whole; i += 4) std::memcpy(p + i, pattern, 4);
    for (size_t i = whole; i < n; ++i) p[i] = pattern[i - whole];
  }
  void copy(Buffer& src, Buffer& dst, const std::vector<CopyRegion>& regions) override {
    const auto* s = static_cast<const char*>(src.host_data());
    auto* d = static_cast<char*>(dst.host_data());
    for (const CopyRegion& r : regions) {
      if (r.src_offset + r.bytes > src.bytes() || r.dst_offset + r.bytes > dst.bytes())
        throw DeviceError("cpu: copy region past the end of a buffer");
      std::memcpy(d + r.dst_offset, s + r.src_offset, r.bytes);
    }
  }
  void synchronize() override {}
  size_t bytes_in_use() const override { return usage_.in_use; }
  size_t peak_bytes() const override { return usage_.peak; }
  void reset_peak() override { usage_.peak = usage_.in_use.load(); }
  size_t available_bytes() const override { return host_available_bytes(); }

 private:
  Usage usage_;
};

// Fixed pool of workers; parallel_for hands each worker a contiguous chunk and waits for all.
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int chunks, const std::function<void(int)>& task) {
    std::lock_guard run_lock(run_mu_);  // one parallel region at a time
    {
      std::lock_guard lock(mu_);
      task_ = &task;
      chunks_ = chunks;
      next_ = 1;
      pending_ = chunks - 1;
      ++generation_;
    }
    cv_.notify_all();
    task(0);
    std::unique_lock lock(mu_);
    // The caller also takes chunks that no worker picked up yet.
    while (next_ < chunks_) {
      int c = next_++;
      lock.unlock();
      task(c);
      lock.lock();
      --pending_;
    }
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int) {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_ < chunks_); });
      if (stop_) return;
      while (task_ && next_ < chunks_) {
        int c = next_++;
        const auto* task = task_;
        lock.unlock();
        (*task)(c);
        lock.lock();
        if (--pending_ == 0) done_cv_.notify_all();
      }
      seen = generation_;
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int chunks_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

ThreadPool& pool() {
  static ThreadPool p(num_threads());
  return p;
}

}  // namespace

namespace {
int requested_threads = 0;  // set_num_threads(), before the pool exists

int threads_from_environment() {  // LMTUNE_THREADS, or 0 when unset or not a positive number
  const char* s = std::getenv("LMTUNE_THREADS");
  int v = s ? std::atoi(s) : 0;
  return v > 0 ? v : 0;
}
}  // namespace

int num_threads() {
  static int n = [] {
    if (int v = threads_from_environment()) return v;
    if (requested_threads > 0) return requested_threads;
    unsigned hc = std::thread::hardware_concurrency();
    return hc ? int(hc) : 1;
  }();
  return n;
}

void set_num_threads(int n) {
  if (n < 1 || threads_from_environment()) return;
  requested_threads = n;
  openblas_set_num_threads(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  static thread_local bool inside = false;  // nested regions run inline instead of deadlocking the pool
  int threads = num_threads();
  if (threads <= 1 || n <= grain || inside) {
    fn(0, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads * 4, (n + grain - 1) / grain);
  int64_t step = (n + chunks - 1) / chunks;
  pool().run(int(chunks), [&](int c) {
    int64_t b = c * step, e = std::min(n, b + step);
    if (b >= e) return;
    bool was = inside;
    inside = true;
    fn(b, e);
    inside = was;
  });
}

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace lmtune::cpu
