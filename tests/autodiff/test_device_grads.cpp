// vjp and jvp of every differentiable op on Vulkan against the CPU (device_grads.h), f32 with tight NMSE and
// f16/bf16 inputs with looser thresholds. Inputs are random (never zero), odd-sized and laid out as views
// (transposed, strided, expanded), like the finite-difference checks of test_op_grads.cpp; a few larger shapes
// reach the multi-workgroup paths of the Vulkan reductions, norms and matmul.
#include "autodiff/device_grads.h"

namespace lmtune::test {
namespace {

using V = std::vector<Tensor>;
using Setup = DeviceGrads::Setup;

std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "vulkan" + std::to_string(info.param.index);
}

// Two-input shorthand.
DeviceGrads::Build two(const std::function<Tensor(const Tensor&, const Tensor&)>& f,
                       const std::function<Tensor(Device)>& a, const std::function<Tensor(Device)>& b) {
  return [=](Device d) {
    return Setup{[f](const V& in) { return V{f(in[0], in[1])}; }, {a(d), b(d)}};
  };
}

TEST_P(DeviceGrads, Unary) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
    bool positive;
  };
  const std::vector<Case> cases{
      {"neg", ops::neg, false},         {"exp", ops::exp, false},
      {"log", ops::log, true},          {"sqrt", ops::sqrt, true},
      {"rsqrt", ops::rsqrt, true},      {"square", ops::square, false},
      {"tanh", ops::tanh, false},       {"sigmoid", ops::sigmoid, false},
      {"silu", ops::silu, false},       {"gelu_tanh", ops::gelu_tanh, false},
      {"gelu_erf", ops::gelu_erf, false}, {"erf", ops::erf, false},
      {"scale", [](const Tensor& x) { return ops::scale(x, -1.75f); }, false},
      {"add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 0.5f); }, false},
  };
  for (DType dt : float_dtypes())
    for (const auto& c : cases) {
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      compare1(c.op, {3, 7}, dt, 5, Layout::transposed, c.positive ? 0.5f : 0.1f, 2.0f, c.positive);
    }
}

TEST_P(DeviceGrads, GatedActivation) {
  for (DType dt : float_dtypes())
    for (ops::GateActivation act :
         {ops::GateActivation::silu, ops::GateActivation::gelu_tanh, ops::GateActivation::gelu_erf}) {
      LMTUNE_CASE(int(act) << " " << dtype_name(dt));
      compare(two([act](const Tensor& g, const Tensor& u) { return ops::gated_activation(g, u, act); },
                  [=](Device d) { return make_input({3, 7}, dt, d, 12, Layout::transposed, 0.1f, 3.0f); },
                  [=](Device d) { return make_input({3, 7}, dt, d, 13, Layout::strided); }));
      // The output transposed, so that the vjp receives a non-contiguous cotangent.
      compare(two([act](const Tensor& g, const Tensor& u) { return ops::transpose(ops::gated_activation(g, u, act)); },
                  [=](Device d) { return make_input({2, 5, 9}, dt, d, 14, Layout::contiguous, 0.1f, 3.0f); },
                  [=](Device d) { return make_input({2, 5, 9}, dt, d, 15); }));
    }
}

TEST_P(DeviceGrads, BinaryWithBroadcast) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
  };
  const std::vector<Case> cases{{"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul}, {"div", ops::div},
                                {"maximum", ops::maximum}};
  for (DType dt : float_dtypes())
    for (const auto& c : cases) {
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      compare(two(c.op, [=](Device d) { return make_input({3, 1, 5}, dt, d, 6, Layout::strided); },
                  [=](Device d) { return make_input({4, 5}, dt, d, 7); }));
      // Both operands broadcast, one of them a transposed view.
      compare(two(c.op, [=](Device d) { return make_input({2, 3, 1}, dt, d, 8); },
                  [=](Device d) { return make_input({1, 3, 7}, dt, d, 9, Layout::transposed); }));
      // Six dims that do not collapse (the Vulkan launcher splits the outer ones), broadcast both ways.
      compare(two(c.op, [=](Device d) { return make_input({2, 1, 3, 1, 5, 1}, dt, d, 10); },
                  [=](Device d) { return make_input({1, 4, 1, 2, 1, 3}, dt, d, 11, Layout::strided); }));
    }
}

TEST_P(DeviceGrads, WhereAndMaskedFill) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    compare([=](Device d) {
      Tensor cond = Tensor::from_ints({1, 0, 1, 1, 0, 0, 1}, {7, 1}, d);
      return Setup{[cond](const V& in) { return V{ops::where(cond, in[0], in[1])}; },
                   {make_input({7, 5}, dt, d, 8), make_input({5}, dt, d, 9)}};
    });
    // A float condition that broadcasts the other way.
    compare([=](Device d) {
      Tensor cond = Tensor::from_floats({0, 1, 1, 0, 1}, {1, 5}, dt, d);
      return Setup{[cond](const V& in) { return V{ops::where(cond, in[0], in[1])}; },
                   {make_input({7, 1}, dt, d, 10), make_input({7, 5}, dt, d, 11, Layout::transposed)}};
    });
    compare([=](Device d) {
      Tensor mask = Tensor::from_ints({1, 0, 1, 1, 0, 0, 1}, {7, 1}, d);
      return Setup{[mask](const V& in) { return V{ops::masked_fill(in[0], mask, -2.0f)}; },
                   {make_input({7, 3}, dt, d, 12)}};
    });
  }
}

TEST_P(DeviceGrads, ViewsCopyCastConcat) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    const Shape s{3, 4, 5};
    compare1([](const Tensor& t) { return ops::reshape(t, {5, -1}); }, s, dt, 11, Layout::transposed);
    compare1([](const Tensor& t) { return ops::transpose(t, 0, 2); }, s, dt, 11, Layout::transposed);
    compare1([](const Tensor& t) { return ops::permute(t, {2, 0, 1}); }, s, dt, 11, Layout::strided);
    compare1([](const Tensor& t) { return ops::slice(t, 2, 1, 5, 2); }, s, dt, 11, Layout::transposed);
    compare1([](const Tensor& t) { return ops::contiguous(t); }, s, dt, 11, Layout::transposed);
    compare1([](const Tensor& t) { return ops::contiguous(t); }, s, dt, 11, Layout::expanded);
    compare1([](const Tensor& t) { return ops::expand(ops::slice(t, 0, 0, 1), {2, 4, 5}); }, s, dt, 11);
    compare1([](const Tensor& t) { return ops::sum_to_shape(t, {4, 1}); }, s, dt, 11, Layout::transposed);
    compare(two([](const Tensor& a, const Tensor& b) { return ops::concat({a, b}, 1); },
                [=](Device d) { return make_input({2, 3, 5}, dt, d, 12); },
                [=](Device d) { return make_input({2, 1, 5}, dt, d, 13, Layout::strided); }));
    compare([=](Device d) {
      return Setup{[](const V& in) { return V{ops::concat({in[0], in[1], in[2]}, 0)}; },
                   {make_input({1, 4}, dt, d, 16), make_input({3, 4}, dt, d, 17, Layout::transposed),
                    make_input({2, 4}, dt, d, 18, Layout::expanded)}};
    });
    compare(two([](const Tensor& a, const Tensor& b) { return ops::concat({a, b}, -1); },
                [=](Device d) { return make_input({2, 3, 5}, dt, d, 14, Layout::transposed); },
                [=](Device d) { return make_input({2, 3, 2}, dt, d, 15); }));
    for (DType to : float_dtypes()) {
      if (to == dt) continue;
      LMTUNE_CASE("cast to " << dtype_name(to));
      // Cast, then an op in the new dtype, so the cotangent reaching the cast is a computed tensor.
      compare1([to](const Tensor& t) { return ops::square(ops::cast(t, to)); }, {3, 7}, dt, 16, Layout::transposed);
    }
  }
}

TEST_P(DeviceGrads, Reductions) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    const Shape s{3, 4, 5};
    auto L = Layout::strided;
    compare1([](const Tensor& t) { return ops::sum(t, {0, 2}); }, s, dt, 14, L, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::sum_all(t); }, s, dt, 14, Layout::transposed, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::mean(t, {1}, true); }, s, dt, 14, L, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::max(t, 1); }, s, dt, 14, L, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::logsumexp(t, -1, true); }, s, dt, 14, L, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::topk(t, 2).first; }, s, dt, 14, L, 0.1f, 3.0f);
    // Long rows: several threads (and workgroups) per row in the Vulkan kernels.
    const Shape w{3, 1031};
    compare1([](const Tensor& t) { return ops::sum(t, {-1}); }, w, dt, 15, Layout::transposed, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::sum(t, {0}); }, w, dt, 15, Layout::contiguous, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::max(t, -1); }, w, dt, 15, Layout::contiguous, 0.1f, 3.0f);
    compare1([](const Tensor& t) { return ops::logsumexp(t, -1); }, w, dt, 15, Layout::strided, 0.1f, 3.0f);
    // (f32 only: among 1031 values rounded to f16/bf16 the top 5 may tie, and ties make the gradient ambiguous.)
    if (dt == DType::f32)
      compare1([](const Tensor& t) { return ops::topk(t, 5).first; }, w, dt, 15, Layout::contiguous, 0.1f, 3.0f);
  }
}

TEST_P(DeviceGrads, SoftmaxAndCrossEntropy) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    for (int axis : {-1, 1})
      for (bool log : {false, true}) {
        LMTUNE_CASE("axis " << axis << " log " << log);
        compare1([=](const Tensor& t) { return log ? ops::log_softmax(t, axis) : ops::softmax(t, axis); }, {3, 4, 7},
                 dt, 15, Layout::transposed, 0.1f, 3.0f);
      }
    for (bool log : {false, true}) {
      compare1([=](const Tensor& t) { return log ? ops::log_softmax(t) : ops::softmax(t); }, {2, 1031}, dt, 16,
               Layout::contiguous, 0.1f, 3.0f);
      // The cotangent arrives as a transposed view.
      compare1([=](const Tensor& t) { return ops::transpose(log ? ops::log_softmax(t) : ops::softmax(t)); }, {5, 9},
               dt, 17, Layout::contiguous, 0.1f, 3.0f);
    }
    compare([=](Device d) {
      Tensor targets = Tensor::from_ints({3, -100, 6, 0, 2}, {5}, d);
      return Setup{[targets](const V& in) { return V{ops::cross_entropy(in[0], targets)}; },
                   {make_input({5, 7}, dt, d, 16, Layout::transposed, 0.1f, 3.0f)}};
    });
    compare([=](Device d) {
      Tensor targets = Tensor::from_ints({1030, 17, -1}, {3}, d);
      return Setup{[targets](const V& in) { return V{ops::cross_entropy(in[0], targets, -1)}; },
                   {make_input({3, 1031}, dt, d, 17, Layout::contiguous, 0.1f, 3.0f)}};
    });
  }
}

TEST_P(DeviceGrads, LinearCrossEntropy) {
  for (DType dt : float_dtypes())
    for (float softcap : {0.0f, 2.0f}) {
      LMTUNE_CASE(dtype_name(dt) << " softcap " << softcap);
      // V = 97 in chunks of 32 (3 x 32 + 1), N = 5 with an ignored row, hidden transposed.
      compare([=](Device d) {
        Tensor targets = Tensor::from_ints({96, -100, 31, 0, 64}, {5}, d);
        return Setup{[=](const V& in) { return V{ops::linear_cross_entropy(in[0], in[1], targets, -100, softcap, 32)}; },
                     {make_input({5, 9}, dt, d, 26, Layout::transposed), make_input({97, 9}, dt, d, 27)}};
      });
      // A frozen weight: d hidden is computed in the forward pass.
      compare([=](Device d) {
        Tensor targets = Tensor::from_ints({96, -100, 31, 0, 64}, {5}, d);
        Tensor w = make_input({97, 9}, dt, d, 27);
        return Setup{[=](const V& in) { return V{ops::linear_cross_entropy(in[0], w, targets, -100, softcap, 32)}; },
                     {make_input({5, 9}, dt, d, 26, Layout::transposed)}};
      });
    }
}

TEST_P(DeviceGrads, MatmulAndLinear) {
  auto mm = [](const Tensor& a, const Tensor& b) { return ops::matmul(a, b); };
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    // Batched with broadcast batch dims, a transposed, b strided.
    compare(two(mm, [=](Device d) { return make_input({2, 1, 3, 5}, dt, d, 17, Layout::transposed); },
                [=](Device d) { return make_input({3, 5, 4}, dt, d, 18, Layout::strided); }));
    // A stack of matrices times one transposed matrix (folded into one GEMM).
    compare(two(mm, [=](Device d) { return make_input({2, 3, 5}, dt, d, 19); },
                [=](Device d) { return make_input({5, 4}, dt, d, 20, Layout::transposed); }));
    // Both operands transposed.
    compare(two(mm, [=](Device d) { return make_input({3, 5}, dt, d, 21, Layout::transposed); },
                [=](Device d) { return make_input({5, 4}, dt, d, 22, Layout::transposed); }));
    // A batch-broadcast operand with stride 0 (expanded).
    compare(two(mm, [=](Device d) { return make_input({3, 6, 37}, dt, d, 23, Layout::expanded); },
                [=](Device d) { return make_input({3, 37, 5}, dt, d, 24); }));
    // Three batch dims, broadcast on two of them.
    compare(two(mm, [=](Device d) { return make_input({2, 3, 1, 4, 5}, dt, d, 37, Layout::transposed); },
                [=](Device d) { return make_input({2, 1, 2, 5, 3}, dt, d, 38); }));
    // Vector shapes: M = 1 and N = 1.
    compare(two(mm, [=](Device d) { return make_input({1, 9}, dt, d, 39); },
                [=](Device d) { return make_input({9, 1}, dt, d, 40); }));
    compare(two(mm, [=](Device d) { return make_input({3, 1, 9}, dt, d, 41, Layout::strided); },
                [=](Device d) { return make_input({9, 5}, dt, d, 42); }));
    // Long K (split-K candidates), odd M and N.
    compare(two(mm, [=](Device d) { return make_input({3, 1031}, dt, d, 25); },
                [=](Device d) { return make_input({1031, 5}, dt, d, 26, Layout::transposed); }));
    // Larger than one tile in M and N (edge tiles), and a transposed cotangent reaching the matmul.
    compare(two([](const Tensor& a, const Tensor& b) { return ops::transpose(ops::matmul(a, b)); },
                [=](Device d) { return make_input({70, 45}, dt, d, 35); },
                [=](Device d) { return make_input({45, 133}, dt, d, 36, Layout::transposed); }));
    compare([=](Device d) {
      return Setup{[](const V& in) { return V{ops::linear(in[0], in[1], in[2])}; },
                   {make_input({2, 3, 5}, dt, d, 27), make_input({4, 5}, dt, d, 28), make_input({4}, dt, d, 29)}};
    });
    compare(two([](const Tensor& x, const Tensor& w) { return ops::linear(x, w); },
                [=](Device d) { return make_input({9}, dt, d, 43); }, [=](Device d) { return make_input({4, 9}, dt, d, 44); }));
    // Many rows: the weight gradient is a GEMM with K = 2 * 67.
    compare([=](Device d) {
      return Setup{[](const V& in) { return V{ops::linear(in[0], in[1], in[2])}; },
                   {make_input({2, 67, 9}, dt, d, 30, Layout::strided), make_input({3, 9}, dt, d, 31),
                    make_input({3}, dt, d, 32)}};
    });
  }
}

TEST_P(DeviceGrads, Norms) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    for (int64_t C : {7, 129}) {
      LMTUNE_CASE("C " << C);
      compare([=](Device d) {
        return Setup{[](const V& in) { return V{ops::rms_norm(in[0], in[1], 1e-5f)}; },
                     {make_input({3, C}, dt, d, 24, Layout::transposed, 0.1f, 2.0f),
                      make_input({C}, dt, d, 25, Layout::contiguous, 0.5f, 1.5f)}};
      });
      compare([=](Device d) {  // the cotangent arrives as a transposed view
        return Setup{[](const V& in) { return V{ops::transpose(ops::rms_norm(in[0], in[1], 1e-5f))}; },
                     {make_input({5, C}, dt, d, 23), make_input({C}, dt, d, 25, Layout::contiguous, 0.5f, 1.5f)}};
      });
      compare([=](Device d) {
        return Setup{[](const V& in) { return V{ops::layer_norm(in[0], in[1], in[2], 1e-5f)}; },
                     {make_input({2, 3, C}, dt, d, 26, Layout::strided, 0.1f, 2.0f),
                      make_input({C}, dt, d, 27, Layout::contiguous, 0.5f, 1.5f), make_input({C}, dt, d, 28)}};
      });
      compare(two([](const Tensor& x, const Tensor& w) { return ops::layer_norm(x, w, Tensor(), 1e-5f); },
                  [=](Device d) { return make_input({3, C}, dt, d, 29, Layout::transposed, 0.1f, 2.0f); },
                  [=](Device d) { return make_input({C}, dt, d, 30, Layout::contiguous, 0.5f, 1.5f); }));
    }
  }
}

TEST_P(DeviceGrads, Rope) {
  for (DType dt : float_dtypes())
    for (auto layout : {ops::RopeLayout::half_split, ops::RopeLayout::interleaved})
      for (bool full : {false, true}) {
        LMTUNE_CASE(dtype_name(dt) << " layout " << int(layout) << (full ? " R = D" : " R < D"));
        auto tables = [full](Device d) {
          Tensor pos = Tensor::from_ints({0, 1, 2, 7, 9, 300}, {2, 3}, d);
          Tensor inv = full ? Tensor::from_floats({1.0f, 0.3f, 0.01f}, {3}, DType::f32, d)
                            : Tensor::from_floats({1.0f, 0.1f}, {2}, DType::f32, d);
          return std::make_pair(pos, inv);
        };
        compare([=](Device d) {
          auto [pos, inv] = tables(d);
          // Scaled on the partial rotation (yarn / longrope attention factor).
          const float scale = full ? 1.0f : 1.25f;
          return Setup{[=](const V& in) { return V{ops::rope(in[0], pos, inv, layout, scale)}; },
                       {make_input({2, 3, 2, 6}, dt, d, 29, Layout::strided)}};
        });
        // The cotangent reaching rope is a transposed view.
        compare([=](Device d) {
          auto [pos, inv] = tables(d);
          return Setup{[=](const V& in) { return V{ops::transpose(ops::rope(in[0], pos, inv, layout), 1, 2)}; },
                       {make_input({2, 3, 2, 6}, dt, d, 35)}};
        });
      }
}

TEST_P(DeviceGrads, EmbeddingAndBackward) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    auto small_ids = [](Device d) { return Tensor::from_ints({3, 0, 4, 3, 3, 1}, {2, 3}, d); };
    compare([=](Device d) {
      Tensor ids = small_ids(d);
      return Setup{[ids](const V& in) { return V{ops::embedding(in[0], ids)}; }, {make_input({5, 4}, dt, d, 30)}};
    });
    compare([=](Device d) {
      Tensor ids = small_ids(d);
      return Setup{[ids](const V& in) { return V{ops::embedding_backward(in[0], ids, 5)}; },
                   {make_input({2, 3, 4}, dt, d, 31, Layout::transposed)}};
    });
    compare([=](Device d) {  // ids given as a transposed view
      Tensor ids = ops::transpose(make_ids({3, 2}, 5, 36, d));
      return Setup{[ids](const V& in) { return V{ops::embedding(in[0], ids)}; }, {make_input({5, 4}, dt, d, 37)}};
    });
    // Many repeated ids scatter-adding into few rows.
    compare([=](Device d) {
      Tensor ids = make_ids({4, 9}, 11, 32, d);
      return Setup{[ids](const V& in) { return V{ops::transpose(ops::embedding(in[0], ids))}; },
                   {make_input({11, 33}, dt, d, 33)}};
    });
    compare([=](Device d) {
      Tensor ids = make_ids({67, 5}, 7, 34, d);
      return Setup{[ids](const V& in) { return V{ops::embedding_backward(in[0], ids, 7)}; },
                   {make_input({67, 5, 9}, dt, d, 35, Layout::strided)}};
    });
  }
}

TEST_P(DeviceGrads, Attention) {
  struct Case {
    const char* name;
    int64_t T, S, H, KV;
    bool causal;
    int64_t window;
    float softcap;
    bool docs;
    int64_t q_offset;
    bool low_precision;  // also f16 and bf16
    int64_t D = 3;
    bool transpose_out = false;  // the cotangent arrives as a [B, H, T, D] transposed view
  };
  const std::vector<Case> cases{{"gqa_causal_softcap", 5, 5, 4, 2, true, 0, 3.0f, false, 0, true},
                                {"window_docs", 6, 6, 2, 1, true, 3, 0, true, 0, true},
                                {"kv_cache", 2, 5, 2, 2, true, 0, 0, false, 3, false},
                                {"masked_rows", 4, 4, 2, 1, true, 0, 0, false, -1, false},
                                {"full_gqa", 3, 7, 6, 2, false, 0, 0, false, 0, false},
                                {"long_mqa_window_softcap", 33, 33, 4, 1, true, 9, 5.0f, false, 0, true, 16, true}};
  for (const auto& c : cases)
    for (DType dt : float_dtypes()) {
      if (dt != DType::f32 && !c.low_precision) continue;
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      compare([&](Device d) {
        ops::AttentionOptions opt;
        opt.causal = c.causal;
        opt.window = c.window;
        opt.softcap = c.softcap;
        opt.q_offset = c.q_offset;
        if (c.docs) opt.doc_ids = Tensor::from_ints({0, 0, 1, 1, 1, 2, 4, 4, 4, 4, 5, 5}, {2, 6}, d);
        bool tr = c.transpose_out;
        return Setup{[opt, tr](const V& in) {
                       Tensor o = ops::attention(in[0], in[1], in[2], opt);
                       return V{tr ? ops::transpose(o, 1, 2) : o};
                     },
                     {make_input({2, c.T, c.H, c.D}, dt, d, 32, Layout::strided, 0.1f, 1.5f),
                      make_input({2, c.S, c.KV, c.D}, dt, d, 33, Layout::contiguous, 0.1f, 1.5f),
                      make_input({2, c.S, c.KV, c.D}, dt, d, 34)}};
      });
    }
}

INSTANTIATE_TEST_SUITE_P(Vulkan, DeviceGrads, ::testing::Values(Device::vulkan(0)), device_name);

}  // namespace
}  // namespace lmtune::test
