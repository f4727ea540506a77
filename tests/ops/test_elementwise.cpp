// Elementwise ops (unary, broadcasting binary, where, masked_fill) against double references, in every float
// dtype and on contiguous, transposed, strided and expanded inputs.
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  bool positive;  // domain is x > 0
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases{
      {"neg", ops::neg, [](double x) { return -x; }, false},
      {"exp", ops::exp, [](double x) { return std::exp(x); }, false},
      {"log", ops::log, [](double x) { return std::log(x); }, true},
      {"sqrt", ops::sqrt, [](double x) { return std::sqrt(x); }, true},
      {"rsqrt", ops::rsqrt, [](double x) { return 1 / std::sqrt(x); }, true},
      {"square", ops::square, [](double x) { return x * x; }, false},
      {"tanh", ops::tanh, [](double x) { return std::tanh(x); }, false},
      {"sigmoid", ops::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {"silu", ops::silu, [](double x) { return x / (1 + std::exp(-x)); }, false},
      {"gelu_tanh", ops::gelu_tanh,
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, false},
      {"gelu_erf", ops::gelu_erf, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, false},
      {"erf", ops::erf, [](double x) { return std::erf(x); }, false},
      {"scale", [](const Tensor& x) { return ops::scale(x, -1.75f); }, [](double x) { return -1.75 * x; }, false},
      {"add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 0.625f); }, [](double x) { return x + 0.625; },
       false},
  };
  return cases;
}

TEST_P(OpTest, UnaryOpsAllDtypesAndLayouts) {
  for (const auto& c : unary_cases())
    for (DType dt : float_dtypes())
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded})
        for (const Shape& s : {Shape{7, 33}, Shape{1}, Shape{3, 1, 65}}) {
          LMTUNE_CASE(c.name << " " << dtype_name(dt) << " " << layout_name(l) << " " << to_string(s));
          Tensor x = make_input(s, dt, dev(), 11, l, c.positive ? 0.2f : 0.1f, c.positive ? 3.0f : 2.0f, c.positive);
          Tensor y = c.op(x);
          EXPECT_EQ(y.dtype(), dt);
          EXPECT_TRUE(close(y, ref::unary(ref::of(x), c.ref), dt));
        }
}

TEST_P(OpTest, BinaryOpsBroadcast) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const std::vector<Case> cases{
      {"add", ops::add, [](double a, double b) { return a + b; }},
      {"sub", ops::sub, [](double a, double b) { return a - b; }},
      {"mul", ops::mul, [](double a, double b) { return a * b; }},
      {"div", ops::div, [](double a, double b) { return a / b; }},
      {"maximum", ops::maximum, [](double a, double b) { return a >= b ? a : b; }},
      {"greater_equal", ops::greater_equal, [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
  };
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{7, 33}, {7, 33}}, {{7, 1, 33}, {5, 33}}, {{3, 1}, {1, 65}}, {{1}, {3, 7}}, {{2, 3, 7}, {}}};
  for (const auto& c : cases)
    for (DType dt : float_dtypes())
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided})
        for (const auto& [sa, sb] : shapes) {
          LMTUNE_CASE(c.name << " " << dtype_name(dt) << " " << layout_name(l) << " " << to_string(sa) << " "
                             << to_string(sb));
          Tensor a = make_input(sa, dt, dev(), 21, l);
          Tensor b = make_input(sb, dt, dev(), 22, Layout::contiguous);
          EXPECT_TRUE(close(c.op(a, b), ref::binary(ref::of(a), ref::of(b), c.ref), dt));
          EXPECT_TRUE(close(c.op(b, a), ref::binary(ref::of(b), ref::of(a), c.ref), dt));
        }
}

TEST_P(OpTest, WhereAndMaskedFill) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor a = make_input({7, 33}, dt, dev(), 31, Layout::transposed);
    Tensor b = make_input({1, 33}, dt, dev(), 32);
    Tensor cond_f = make_input({7, 1}, dt, dev(), 33);  // nonzero where positive after the step below
    Tensor cond = ops::greater_equal(cond_f, Tensor::zeros({}, dt, dev()));
    ref::Array rc = ref::of(cond);
    EXPECT_TRUE(close(ops::where(cond, a, b), ref::where(rc, ref::of(a), ref::of(b)), dt));
    Tensor ci = Tensor::from_ints({1, 0, 0, 1, 1, 0, 1}, {7, 1}, dev());
    EXPECT_TRUE(close(ops::where(ci, a, b), ref::where(ref::of(ci), ref::of(a), ref::of(b)), dt));
    ref::Array filled = ref::where(rc, ref::Array(Shape{}, {-3.5}), ref::of(a));
    EXPECT_TRUE(close(ops::masked_fill(a, cond, -3.5f), filled, dt));
  }
}

}  // namespace
}  // namespace lmtune::test
