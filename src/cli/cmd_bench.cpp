// `lmtune bench ops` (and the `bench` command; `bench train` is in cmd_bench_train.cpp): throughput of the
// kernels that dominate fine-tuning on the chosen device -- TFLOP/s of matmul at square and LLM shapes and of
// attention (fused and reference), GB/s of the memory-bound ops. Vulkan times are GPU timestamps summed over the
// op's dispatches (the runtime's profiler); CPU times are wall clock around the op plus a synchronize.
// Each figure is the median of --reps runs after a warm-up of --warmup seconds (default 1) per op (the first use
// of a pipeline compiles it, up to 2 s on NVIDIA, and the clocks drop meanwhile).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/flash_attention.h"
#include "backend/vulkan/matmul_plan.h"
#include "backend/vulkan/quant_matmul.h"
#include "backend/vulkan/recorder.h"
#include "backend/vulkan/vulkan_backend.h"
#include "cli/bench_timing.h"
#include "cli/commands.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/view.h"
#include "core/primitive.h"
#include "core/quant.h"

namespace lmtune::cli {
namespace {

struct BenchOptions {
  bool json = false;
  bool f32_out = false;  // matmul results in f32 whatever the operands
  bool profile = false;
  double warmup_s = 1.0;       // warm-up per op, seconds
  bool stream = false;         // time reps back-to-back calls by wall clock (one synchronize) instead
  std::string sizes = "auto";  // auto | small | full
  std::string shapes;          // MxNxK[,MxNxK...] replaces the matmul shapes
  std::string attention;       // BxTxHxKVxD[,...] replaces the attention shapes
  std::string only;            // comma list of op names to run
  int reps = 10;
};

struct Result {
  std::string op, shape, dtype, kernel;
  double ms = 0;
  double rate = 0;  // TFLOP/s (matmul) or GB/s
  bool flops = false;
  std::string error;
};

TimingOptions g_timing;  // --warmup, --stream
bool g_f32_out = false;   // --f32-out

struct MatmulShape {
  int64_t M, N, K;
  DType dtype;
  bool b_transposed;          // x @ W^T with W [N, K]: the layout of a linear layer
  bool a_transposed = false;  // X^T @ Y with X [K, M]: a weight gradient
  std::optional<quant::Format> quant;  // B a block-quantized weight (x Wᵀ for nt, dY W for nn)
  std::string label() const {
    return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " " + (a_transposed ? "t" : "n") +
           (b_transposed ? "t" : "n") + (quant ? " " + std::string(quant::info(*quant).name) : "");
  }
};

// One --shapes entry: MxNxK, then any of :dtype, :nn|:nt|:tn|:tt and :<quant format> (a block-quantized weight).
std::vector<MatmulShape> parse_matmul_shape(const std::string& one) {
  long long m = 0, n = 0, k = 0;
  char tail[64] = "";
  const int got = std::sscanf(one.c_str(), "%lldx%lldx%lld%63s", &m, &n, &k, tail);
  bool ok = got >= 3 && m > 0 && n > 0 && k > 0, ta = false, tb = false, layout = false;
  std::optional<DType> only;
  std::optional<quant::Format> quant;
  std::string rest = got == 4 ? tail : "";
  while (ok && !rest.empty()) {
    const size_t end = rest.find(':', 1);
    const std::string part = rest.substr(1, end == std::string::npos ? std::string::npos : end - 1);
    ok = rest[0] == ':' && !part.empty();
    rest = end == std::string::npos ? "" : rest.substr(end);
    if (!ok) break;
    if (part.size() == 2 && (part[0] == 'n' || part[0] == 't') && (part[1] == 'n' || part[1] == 't')) {
      ta = part[0] == 't', tb = part[1] == 't', layout = true;
    } else if (auto f = quant::parse_format(part)) {
      quant = f;
    } else {
      try {
        only = parse_dtype(part);
      } catch (const Error&) {
        ok = false;
      }
    }
  }
  ok = ok && !(quant && ta);  // the quantized weight is B; A (x or dY) is row-major
  if (!ok)
    throw ConfigError("bench: bad --shapes entry '" + one +
                      "' (expected MxNxK[:dtype][:nn|:nt|:tn|:tt][:q8_0|:q4_0|:q4_k|:q5_k|:q6_k|:nf4])");
  std::vector<MatmulShape> s;
  if (quant) {  // x [M, K] Wᵀ with W [N, K] quantized (nt, the default), or dY [M, N] W -> [M, K] (nn)
    s.push_back({m, n, k, only.value_or(DType::bf16), !layout || tb, false, quant});
    return s;
  }
  for (DType t : {DType::f16, DType::f32}) s.push_back({m, n, k, only.value_or(t), tb, ta});
  if (only) s.pop_back();
  return s;
}

std::vector<MatmulShape> matmul_shapes(const BenchOptions& o, bool small) {
  std::vector<MatmulShape> s;
  if (!o.shapes.empty()) {
    for (const std::string& one : split_commas(o.shapes))
      for (const MatmulShape& m : parse_matmul_shape(one)) s.push_back(m);
    return s;
  }
  if (small) {
    for (DType t : {DType::f32, DType::f16}) s.push_back({512, 512, 512, t, false});
    s.push_back({512, 512, 2048, DType::bf16, true});
    s.push_back({512, 2048, 512, DType::bf16, true});
    s.push_back({512, 896, 16, DType::bf16, true});
    s.push_back({512, 16, 896, DType::bf16, true});
    return s;
  }
  for (DType t : {DType::f16, DType::bf16, DType::f32}) s.push_back({4096, 4096, 4096, t, false});
  s.push_back({4096, 4096, 4096, DType::f16, true});
  // Qwen2.5-0.5B-sized layers over 2048 tokens (M x N x K: tokens x out features x in features), bf16.
  s.push_back({2048, 2048, 8192, DType::bf16, true});
  s.push_back({2048, 8192, 2048, DType::bf16, true});
  s.push_back({2048, 4864, 896, DType::bf16, true});
  s.push_back({2048, 896, 4864, DType::bf16, true});
  // LoRA rank-16 products: x A^T and (x A^T) B^T.
  s.push_back({2048, 16, 896, DType::bf16, true});
  s.push_back({2048, 896, 16, DType::bf16, true});
  return s;
}

// The product's kernel as the Vulkan planner chooses it for these operands.
std::string kernel_label(const Tensor& a, const Tensor& b, DType out) {
  if (!a.device().is_vulkan()) return "openblas";
  Shape shape = a.shape();
  shape.back() = b.dim(-1);
  const Tensor c = Tensor::empty(shape, out, a.device());
  const std::optional<vk::MatmulPlan> plan = vk::plan_matmul(vk::context_for(a.device()), a, b, c);
  return plan ? plan->describe() : "composed";
}

// C [M, N] = x [M, K] Wᵀ (nt) with W [N, K] quantized, or dY [M, K] W with W [K, N] (nn): the products of a
// QLoRA layer's forward and input gradient.
Result bench_quantized_matmul(const MatmulShape& s, Device dev, int reps, Result r) {
  const quant::Format f = *s.quant;
  const Tensor dense = s.b_transposed ? Tensor::randn({s.N, s.K}, 2, 0.05f, DType::f32, Device::cpu())
                                      : Tensor::randn({s.K, s.N}, 2, 0.05f, DType::f32, Device::cpu());
  const quant::QuantizedTensor w = quant::quantize(dense, f, dev);
  const Tensor x = Tensor::randn({s.M, s.K}, 1, 1.0f, s.dtype, dev);
  r.ms = time_op([&] { return s.b_transposed ? ops::quantized_linear(x, w) : ops::quantized_matmul(x, w, s.dtype); },
                 dev, reps, g_timing);
  r.kernel = dev.is_vulkan() ? vk::plan_quant_matmul(vk::context_for(dev), f, s.b_transposed, uint64_t(s.M),
                                                     uint64_t(s.N), uint64_t(s.K), s.dtype).describe()
                             : "openblas, dequantized panels";
  r.rate = 2.0 * double(s.M) * double(s.N) * double(s.K) / (r.ms * 1e-3) / 1e12;
  return r;
}

Result bench_matmul(const MatmulShape& s, Device dev, int reps) {
  Result r;
  r.op = "matmul";
  r.shape = s.label();
  r.dtype = std::string(dtype_name(s.dtype));
  r.flops = true;
  if (s.quant) return bench_quantized_matmul(s, dev, reps, r);
  Tensor a = s.a_transposed ? ops::transpose(Tensor::randn({s.K, s.M}, 1, 1.0f, s.dtype, dev))
                            : Tensor::randn({s.M, s.K}, 1, 1.0f, s.dtype, dev);
  Tensor b = s.b_transposed ? ops::transpose(Tensor::randn({s.N, s.K}, 2, 1.0f, s.dtype, dev))
                            : Tensor::randn({s.K, s.N}, 2, 1.0f, s.dtype, dev);
  const DType out = g_f32_out ? DType::f32 : s.dtype;
  r.ms = time_op([&] { return ops::matmul(a, b, out); }, dev, reps, g_timing);
  r.kernel = kernel_label(a, b, out) + (g_f32_out ? " f32 out" : "");
  r.rate = 2.0 * double(s.M) * double(s.N) * double(s.K) / (r.ms * 1e-3) / 1e12;
  return r;
}

struct MemOp {
  std::string name;
  DType dtype;
  double bytes_per_elem;  // bytes moved per element of the [rows, cols] input
  std::function<Tensor(const Tensor& x, const Tensor& y, const Tensor& w)> fn;
};

std::vector<MemOp> mem_ops() {
  return {
      {"add", DType::f32, 12, [](const Tensor& x, const Tensor& y, const Tensor&) { return ops::add(x, y); }},
      {"add", DType::bf16, 6, [](const Tensor& x, const Tensor& y, const Tensor&) { return ops::add(x, y); }},
      {"mul", DType::f32, 12, [](const Tensor& x, const Tensor& y, const Tensor&) { return ops::mul(x, y); }},
      {"silu", DType::f32, 8, [](const Tensor& x, const Tensor&, const Tensor&) { return ops::silu(x); }},
      {"copy", DType::f32, 8,
       [](const Tensor& x, const Tensor&, const Tensor&) {
         return apply1(std::make_shared<Copy>(), {x}, {x.shape(), x.dtype()});
       }},
      {"cast f32->f16", DType::f32, 6,
       [](const Tensor& x, const Tensor&, const Tensor&) { return ops::cast(x, DType::f16); }},
      {"rms_norm", DType::f32, 8,
       [](const Tensor& x, const Tensor&, const Tensor& w) { return ops::rms_norm(x, w, 1e-6f); }},
      {"softmax", DType::f32, 8, [](const Tensor& x, const Tensor&, const Tensor&) { return ops::softmax(x, -1); }},
      {"sum", DType::f32, 4, [](const Tensor& x, const Tensor&, const Tensor&) { return ops::sum(x, {-1}); }},
  };
}

Result bench_mem(const MemOp& op, int64_t rows, int64_t cols, Device dev, int reps) {
  Result r;
  r.op = op.name;
  r.shape = std::to_string(rows) + "x" + std::to_string(cols);
  r.dtype = std::string(dtype_name(op.dtype));
  r.kernel = "";
  Tensor x = Tensor::randn({rows, cols}, 3, 1.0f, op.dtype, dev);
  Tensor y = Tensor::randn({rows, cols}, 4, 1.0f, op.dtype, dev);
  Tensor w = Tensor::randn({cols}, 5, 1.0f, op.dtype, dev);
  r.ms = time_op([&] { return op.fn(x, y, w); }, dev, reps, g_timing);
  r.rate = op.bytes_per_elem * double(rows) * double(cols) / (r.ms * 1e-3) / 1e9;
  return r;
}

struct AttentionShape {
  int64_t B, T, H, KV, D;
  bool fused, backward;  // flash_attention or attention_reference; forward only or forward + backward
  bool causal = true;
  int64_t S = 0;  // keys, when more than T: the queries are the last T of them (decoding over a KV cache)
};

// --attention-shapes entries BxTxHxKVxD[:full][:keys=S] (H a multiple of KV; full: no causal mask; keys=S: S >= T
// keys, the T queries being the last T positions, as when decoding over a cache).
std::vector<AttentionShape> parse_attention_shapes(const std::string& list) {
  std::vector<AttentionShape> s;
  for (const std::string& entry : split_commas(list)) {
    std::string one = entry;
    bool full = false;
    long long keys = 0;  // -1: an option not understood
    for (size_t colon; keys >= 0 && (colon = one.rfind(':')) != std::string::npos; one.resize(colon)) {
      const std::string opt = one.substr(colon + 1);
      char extra;
      if (opt == "full") full = true;
      else if (std::sscanf(opt.c_str(), "keys=%lld%c", &keys, &extra) != 1 || keys <= 0) keys = -1;
    }
    long long b, t, h, kv, d;
    char extra;
    if (keys < 0 || std::sscanf(one.c_str(), "%lldx%lldx%lldx%lldx%lld%c", &b, &t, &h, &kv, &d, &extra) != 5 ||
        b <= 0 || t <= 0 || h <= 0 || kv <= 0 || d <= 0 || h % kv != 0 || (keys > 0 && keys < t))
      throw ConfigError("bench: bad --attention-shapes entry '" + entry +
                        "' (expected BxTxHxKVxD[:full][:keys=S], H a multiple of KV, S >= T)");
    s.push_back({b, t, h, kv, d, true, false, !full, keys > t ? keys : 0});
  }
  return s;
}

std::vector<AttentionShape> attention_shapes(const BenchOptions& o, bool small) {
  std::vector<AttentionShape> s;
  // Qwen2.5-0.5B heads (14 query, 2 kv, D 64) over 2048 tokens; Llama-style D 128 (16 query, 8 kv heads).
  std::vector<AttentionShape> base = !o.attention.empty() ? parse_attention_shapes(o.attention)
                                     : small ? std::vector<AttentionShape>{{1, 256, 14, 2, 64, true, false}}
                                             : std::vector<AttentionShape>{{1, 2048, 14, 2, 64, true, false},
                                                                           {1, 2048, 16, 8, 128, true, false}};
  for (const auto& b : base)
    for (bool fused : {true, false})
      if (fused || o.attention.empty())
      for (bool backward : {false, true})
        if (!backward || b.S == 0) s.push_back({b.B, b.T, b.H, b.KV, b.D, fused, backward, b.causal, b.S});
  return s;
}

std::string attention_label(const AttentionShape& a) {
  return "B" + std::to_string(a.B) + " T" + std::to_string(a.T) + " H" + std::to_string(a.H) + "/" +
         std::to_string(a.KV) + " D" + std::to_string(a.D) + (a.S ? " S" + std::to_string(a.S) : "") +
         (a.causal ? "" : " full") + (a.backward ? " f+b" : " fwd");
}

// bf16 attention, causal unless asked. FLOPs counted as 4 B H T S D for the forward pass, halved for causal, and
// 3.5 times that for forward + backward (the backward's five T x S x D products), whatever the kernels recompute.
Result bench_attention(const AttentionShape& a, Device dev, int reps) {
  Result r;
  r.op = "attention";
  r.shape = attention_label(a);
  r.dtype = "bf16";
  r.kernel = a.fused ? "flash" : "reference";
  r.flops = true;
  Tensor q = Tensor::randn({a.B, a.T, a.H, a.D}, 6, 1.0f, DType::bf16, dev);
  const int64_t S = a.S ? a.S : a.T;
  Tensor k = Tensor::randn({a.B, S, a.KV, a.D}, 7, 1.0f, DType::bf16, dev);
  Tensor v = Tensor::randn({a.B, S, a.KV, a.D}, 8, 1.0f, DType::bf16, dev);
  Tensor d_o = Tensor::randn({a.B, a.T, a.H, a.D}, 9, 1.0f, DType::bf16, dev);
  ops::AttentionOptions opt;
  opt.causal = a.causal;
  opt.q_offset = S - a.T;
  auto attend = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{a.fused ? ops::flash_attention(in[0], in[1], in[2], opt).first
                                       : ops::attention_reference(in[0], in[1], in[2], opt)};
  };
  if (a.backward) {
    r.ms = time_op([&] { return vjp(attend, {q, k, v}, {d_o}).second[0]; }, dev, reps, g_timing);
  } else {
    NoGrad no_grad;
    r.ms = time_op([&] { return attend({q, k, v})[0]; }, dev, reps, g_timing);
  }
  if (a.fused && dev.is_vulkan())
    r.kernel += " " + vk::flash_kernel_family(dev, ops::attention_params(q, k, v, opt), q.dtype());
  // Causal halves the T x T square; the S - T keys before it are seen by every query.
  const double pairs = double(a.T) * double(S - a.T) + double(a.T) * double(a.T) / (a.causal ? 2 : 1);
  double fwd = 4.0 * double(a.B * a.H) * pairs * double(a.D);
  r.rate = (a.backward ? 3.5 * fwd : fwd) / (r.ms * 1e-3) / 1e12;
  return r;
}

bool selected(const BenchOptions& o, const std::string& op) {
  if (o.only.empty()) return true;
  std::string list = "," + o.only + ",";
  return list.find("," + op + ",") != std::string::npos || list.find("," + op.substr(0, op.find(' ')) + ",") != std::string::npos;
}

void print_result(const Result& r, const BenchOptions& o, const std::string& device) {
  if (o.json) {
    nlohmann::json j{{"op", r.op}, {"shape", r.shape}, {"dtype", r.dtype}, {"device", device}};
    if (!r.error.empty()) {
      j["error"] = r.error;
    } else {
      j["ms"] = r.ms;
      j[r.flops ? "tflops" : "gbps"] = r.rate;
      if (!r.kernel.empty()) j["kernel"] = r.kernel;
    }
    std::printf("%s\n", j.dump().c_str());
  } else if (!r.error.empty()) {
    std::printf("%-14s %-22s %-5s  n/a: %s\n", r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.error.c_str());
  } else {
    std::printf("%-14s %-22s %-5s %10.3f ms %9.4g %-7s %s\n", r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.ms,
                r.rate, r.flops ? "TFLOP/s" : "GB/s", r.kernel.c_str());
  }
  std::fflush(stdout);
}

void run_bench_ops(const std::string& device_opt, const BenchOptions& o) {
  apply_device_option(device_opt);
  Device dev = default_device();
  bool small = o.sizes == "small";
  if (o.sizes == "auto") {
    small = is_cpu_class(dev);
  } else if (o.sizes != "small" && o.sizes != "full") {
    throw ConfigError("bench: --sizes must be auto, small or full (got '" + o.sizes + "')");
  }
  std::string desc = device_description(dev);
  g_timing = {o.warmup_s, o.stream};
  g_f32_out = o.f32_out;
  if (!o.json) {
    std::printf("lmtune bench ops on %s (%s sizes, median of %d, %s)\n", desc.c_str(), small ? "small" : "full",
                o.reps, o.stream ? "back to back, wall clock" : dev.is_vulkan() ? "GPU timestamps" : "wall clock");
    std::printf("%-14s %-22s %-5s %13s %17s\n", "op", "shape (MxNxK)", "dtype", "time", "throughput");
  }
  if (o.profile) {
    vk::set_profiling(true);
    vk::reset_profile();
  }
  auto run = [&](auto&& fn, Result fail) {
    Result r;
    try {
      r = fn();
    } catch (const Error& e) {
      r = fail;
      r.error = e.what();
    }
    print_result(r, o, desc);
  };
  for (const auto& s : matmul_shapes(o, small)) {
    if (!selected(o, "matmul")) break;
    Result fail;
    fail.op = "matmul";
    fail.shape = s.label();
    fail.dtype = std::string(dtype_name(s.dtype));
    run([&] { return bench_matmul(s, dev, o.reps); }, fail);
  }
  for (const auto& a : attention_shapes(o, small)) {
    if (!selected(o, "attention")) break;
    Result fail;
    fail.op = "attention";
    fail.shape = attention_label(a);
    fail.dtype = "bf16";
    run([&] { return bench_attention(a, dev, o.reps); }, fail);
  }
  int64_t rows = small ? 1024 : 16384, cols = small ? 1024 : 4096;
  for (const auto& op : mem_ops()) {
    if (!selected(o, op.name)) continue;
    Result fail;
    fail.op = op.name;
    fail.shape = std::to_string(rows) + "x" + std::to_string(cols);
    fail.dtype = std::string(dtype_name(op.dtype));
    run([&] { return bench_mem(op, rows, cols, dev, o.reps); }, fail);
  }
  if (o.profile && dev.is_vulkan()) std::printf("\n%s", vk::profile_report().c_str());
}

}  // namespace

void add_bench_command(CLI::App& app, const std::string& device) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto* ops_cmd = bench->add_subcommand("ops", "TFLOP/s of matmul and GB/s of memory-bound ops on the device");
  auto o = std::make_shared<BenchOptions>();
  ops_cmd->add_flag("--json", o->json, "One JSON object per line");
  ops_cmd->add_option("--sizes", o->sizes, "auto | small | full (auto: small on CPU devices)");
  ops_cmd->add_option("--shapes", o->shapes, "Matmul shapes MxNxK[:dtype][:nt|:tn|:tt][:FORMAT][,...] (f16 and f32 unless a dtype is given; t: that operand transposed; FORMAT q8_0|q4_0|q4_k|q5_k|q6_k|nf4: B a quantized weight, x·Wᵀ (nt, default) or dY·W (nn), bf16 unless a dtype is given)");
  ops_cmd->add_option("--attention-shapes", o->attention, "Attention shapes BxTxHxKVxD[:full][:keys=S][,...] (batch, tokens, query heads, kv heads, head dim; bf16, causal unless :full; keys=S: S keys, the tokens being the last T, as in decoding; forward only)");
  ops_cmd->add_option("--ops", o->only, "Comma list of ops to run (matmul,attention,add,mul,silu,copy,cast,rms_norm,softmax,sum)");
  ops_cmd->add_option("--reps", o->reps, "Timed repetitions per op (median)")->check(CLI::Range(1, 1000));
  ops_cmd->add_option("--warmup", o->warmup_s, "Seconds of warm-up per op (default 1)")->check(CLI::Range(0.0, 60.0));
  ops_cmd->add_flag("--f32-out", o->f32_out, "Matmul results in f32 (as the fused loss's logits)");
  ops_cmd->add_flag("--stream", o->stream, "Time --reps calls queued back to back (wall clock, one synchronize)");
  ops_cmd->add_flag("--profile", o->profile, "Also print the per-kernel GPU profile (Vulkan)");
  ops_cmd->callback([&device, o] { run_bench_ops(device, *o); });
  add_bench_train_command(*bench, device);
  add_bench_generate_command(*bench, device);
}

}  // namespace lmtune::cli
