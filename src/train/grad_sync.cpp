// Bucketed gradient all-reduce (see grad_sync.h).
#include "train/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include <spdlog/spdlog.h>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/ops/view.h"

namespace lmtune {
namespace {

// Consecutive parameters whose gradients are summed in one all-reduce.
struct Bucket {
  size_t first = 0, last = 0;  // [first, last) in the parameter list
  size_t floats = 0;
};

std::vector<Bucket> plan_buckets(const std::vector<NamedParam>& params, const std::vector<double>& has_grad,
                                 size_t bucket_bytes) {
  std::vector<Bucket> out;
  Bucket b;
  for (size_t i = 0; i < params.size(); ++i) {
    if (has_grad[i] == 0) continue;
    const size_t n = size_t(params[i].tensor.numel());
    if (b.floats > 0 && (b.floats + n) * sizeof(float) > bucket_bytes) {
      out.push_back(b);
      b = Bucket{i, i, 0};
    }
    if (b.floats == 0) b.first = i;
    b.last = i + 1;
    b.floats += n;
  }
  if (b.floats > 0) out.push_back(b);
  return out;
}

// A bucket's gradients side by side in one f32 tensor on the device, so that it crosses to the host in one
// transfer (a transfer per tensor made the exchange ~0.1 s per step for a 1B model's 224 adapter tensors).
// Parameters without a gradient on any rank take no room; one without a gradient here contributes zeros.
Tensor pack(const std::vector<NamedParam>& params, const Bucket& b, const std::vector<double>& has_grad) {
  NoGrad no_grad;
  const Device device = params[b.first].tensor.device();
  Tensor flat = Tensor::empty({int64_t(b.floats)}, DType::f32, device);
  int64_t at = 0;
  for (size_t i = b.first; i < b.last; ++i) {
    if (has_grad[i] == 0) continue;
    const Tensor& p = params[i].tensor;
    const Tensor slot = flat.view_as(p.shape(), contiguous_strides(p.shape()), at);
    const Tensor g = p.grad();
    copy_into(slot, g.defined() ? g : Tensor::zeros(p.shape(), DType::f32, device));
    at += p.numel();
  }
  return flat;
}

// The summed bucket back into the gradients, through one upload.
void unpack(const std::vector<NamedParam>& params, const Bucket& b, const std::vector<float>& host,
            const std::vector<double>& has_grad) {
  NoGrad no_grad;
  const Device device = params[b.first].tensor.device();
  Tensor flat = Tensor::empty({int64_t(b.floats)}, DType::f32, device);
  backend(device).write(*flat.buffer(), 0, host.data(), b.floats * sizeof(float));
  int64_t at = 0;
  for (size_t i = b.first; i < b.last; ++i) {
    const Tensor& p = params[i].tensor;
    if (has_grad[i] == 0) continue;  // no rank produced one: leave it undefined, as one device would
    const Tensor sum = flat.view_as(p.shape(), contiguous_strides(p.shape()), at);
    at += p.numel();
    if (Tensor g = p.grad(); g.defined()) {
      copy_into(g, sum);
    } else {  // this rank's micro-batches never reached the parameter
      Tensor own = Tensor::empty(p.shape(), DType::f32, device);
      copy_into(own, sum);
      p.impl()->grad = own.impl_ptr();
    }
  }
}

// The host side of the two buckets in flight, kept from step to step: glibc maps blocks this large afresh on
// every allocation, and faulting 32 MiB of new pages in costs more than the copy.
std::vector<float>& host_bucket(size_t k) {
  static std::vector<float> host[2];
  return host[k % 2];
}

}  // namespace

void all_reduce_gradients(const std::vector<NamedParam>& params, dist::Communicator& comm, size_t bucket_bytes) {
  if (comm.size() == 1) return;
  // Which parameters have a gradient anywhere: summed flags, so every rank plans the same buckets.
  std::vector<double> has_grad(params.size());
  for (size_t i = 0; i < params.size(); ++i) has_grad[i] = params[i].tensor.grad().defined() ? 1.0 : 0.0;
  comm.all_reduce_sum(has_grad);
  const std::vector<Bucket> buckets = plan_buckets(params, has_grad, bucket_bytes);
  // Two buckets in flight: bucket k is packed and copied off the device while bucket k-1 reduces.
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const Clock::time_point start = Clock::now();
  double download_s = 0, reduce_wait_s = 0, unpack_s = 0;
  size_t floats = 0;
  std::unique_ptr<dist::PendingReduce> pending[2];
  for (size_t k = 0; k <= buckets.size(); ++k) {
    if (k < buckets.size()) {
      const Tensor flat = pack(params, buckets[k], has_grad);
      std::vector<float>& host = host_bucket(k);
      host.resize(buckets[k].floats);
      const Clock::time_point t0 = Clock::now();
      backend(flat.device()).read(*flat.buffer(), 0, host.data(), host.size() * sizeof(float));
      download_s += seconds_since(t0);
      floats += host.size();
      pending[k % 2] = comm.start_all_reduce_sum(host);
    }
    if (k >= 1) {
      const Clock::time_point t0 = Clock::now();
      pending[(k - 1) % 2]->wait();
      reduce_wait_s += seconds_since(t0);
      const Clock::time_point t1 = Clock::now();
      unpack(params, buckets[k - 1], host_bucket(k - 1), has_grad);
      unpack_s += seconds_since(t1);
    }
  }
  spdlog::debug("gradient all-reduce: {} buckets, {:.1f} MB; {:.1f} ms, of which copies off the device {:.1f} ms "
                "(the first waits for the backward pass), waits for the reduction {:.1f} ms, uploads {:.1f} ms",
                buckets.size(), double(floats) * 4e-6, 1e3 * seconds_since(start), 1e3 * download_s,
                1e3 * reduce_wait_s, 1e3 * unpack_s);
}

}  // namespace lmtune
