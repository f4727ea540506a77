// Shape, dtype and device errors: ShapeError naming the op and both shapes (or the bad id / target).
#include "core/error.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

// Runs f, expects ShapeError, and checks that its message contains every fragment.
template <class F>
void expect_shape_error(F f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no ShapeError thrown; expected one mentioning " << fragments[0];
  } catch (const ShapeError& e) {
    for (const auto& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST_P(OpTest, ShapeErrorsNameOpAndShapes) {
  Device d = dev();
  Tensor a = make_input({3, 7}, DType::f32, d, 1), b = make_input({5, 4}, DType::f32, d, 2);
  expect_shape_error([&] { ops::matmul(a, b); }, {"matmul", "[3, 7]", "[5, 4]"});
  expect_shape_error([&] { ops::matmul(make_input({2, 3, 7}, DType::f32, d, 3), make_input({3, 7, 2}, DType::f32, d, 4)); },
                     {"matmul", "[2, 3, 7]", "[3, 7, 2]"});
  expect_shape_error([&] { ops::add(a, b); }, {"add", "[3, 7]", "[5, 4]"});
  expect_shape_error([&] { ops::linear(a, b); }, {"linear", "[3, 7]", "[5, 4]"});
  expect_shape_error([&] { ops::rms_norm(a, make_input({5}, DType::f32, d, 5), 1e-5f); }, {"rms_norm", "[5]", "[3, 7]"});
  expect_shape_error([&] { ops::layer_norm(a, make_input({7}, DType::f32, d, 5), make_input({6}, DType::f32, d, 6), 1e-5f); },
                     {"layer_norm", "[6]", "[3, 7]"});
  Tensor q = make_input({1, 4, 3, 8}, DType::f32, d, 7), kv = make_input({1, 4, 2, 8}, DType::f32, d, 8);
  expect_shape_error([&] { ops::attention(q, kv, kv, {}); }, {"attention", "[1, 4, 3, 8]", "[1, 4, 2, 8]"});
  Tensor ids = Tensor::from_ints({0, 1, 2}, {1, 3}, d);
  Tensor inv = Tensor::from_floats({1, 0.5f}, {2}, DType::f32, d);
  expect_shape_error([&] { ops::rope(q, ids, inv, ops::RopeLayout::half_split); }, {"rope", "[1, 3]", "[1, 4, 3, 8]"});
  expect_shape_error([&] { ops::softmax(a, 2); }, {"softmax", "axis 2"});
}

TEST_P(OpTest, DtypeErrors) {
  Device d = dev();
  Tensor a = make_input({3, 7}, DType::f32, d, 1), h = make_input({3, 7}, DType::bf16, d, 2);
  expect_shape_error([&] { ops::add(a, h); }, {"add", "f32", "bf16", "[3, 7]"});
  Tensor ids = Tensor::from_ints({0, 1, 2}, {3}, d);
  expect_shape_error([&] { ops::matmul(ops::reshape(ids, {3, 1}), a); }, {"matmul", "i32", "[3, 1]", "[3, 7]"});
  expect_shape_error([&] { ops::embedding(a, a); }, {"embedding", "i32"});
  expect_shape_error([&] { ops::cross_entropy(a, Tensor::from_floats({0, 1, 2}, {3}, DType::f32, d)); },
                     {"cross_entropy", "[3]", "[3, 7]"});
}

TEST_P(OpTest, BadIdsAndTargets) {
  Device d = dev();
  Tensor w = make_input({5, 4}, DType::f32, d, 1);
  expect_shape_error([&] { ops::embedding(w, Tensor::from_ints({0, 5, 1}, {3}, d)); }, {"embedding", "id 5", "[0, 5)"});
  expect_shape_error([&] { ops::embedding(w, Tensor::from_ints({-1}, {1}, d)); }, {"embedding", "id -1"});
  expect_shape_error([&] { ops::embedding_backward(make_input({2, 4}, DType::f32, d, 2), Tensor::from_ints({0, 9}, {2}, d), 5); },
                     {"embedding_backward", "id 9"});
  Tensor logits = make_input({3, 7}, DType::f32, d, 3);
  expect_shape_error([&] { ops::cross_entropy(logits, Tensor::from_ints({0, 7, 1}, {3}, d)); },
                     {"cross_entropy", "target 7", "[3, 7]"});
  expect_shape_error([&] { ops::cross_entropy(logits, Tensor::from_ints({0, 1}, {2}, d)); },
                     {"cross_entropy", "[2]", "[3, 7]"});
}

// A tensor that claims to live on another device (its storage is host memory; no kernel ever reads it).
Tensor on_fake_device(const Tensor& t, Device other) {
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->device = other;
  impl->node.reset();
  return Tensor(impl);
}

TEST(OpErrors, DeviceMismatch) {
  Tensor a = make_input({3, 7}, DType::f32, Device::cpu(), 1);
  Tensor b = on_fake_device(make_input({7, 2}, DType::f32, Device::cpu(), 2), Device::vulkan(3));
  expect_shape_error([&] { ops::matmul(a, b); }, {"matmul", "different devices", "cpu", "vulkan:3"});
  expect_shape_error([&] { ops::add(a, on_fake_device(a, Device::vulkan(3))); }, {"add", "cpu", "vulkan:3"});
}

}  // namespace
}  // namespace lmtune::test

namespace lmtune::test {
namespace {

// The comparison itself must catch wrong results, mismatched infinities and NaN.
TEST(OpHarness, DetectsWrongResults) {
  Tensor x = make_input({7, 33}, DType::f32, Device::cpu(), 1);
  ref::Array rx = ref::of(x);
  EXPECT_TRUE(close(ops::exp(x), ref::unary(rx, [](double v) { return std::exp(v); }), DType::f32));
  EXPECT_FALSE(close(ops::exp(x), ref::unary(rx, [](double v) { return std::exp(v) * (1 + 1e-4); }), DType::f32));
  EXPECT_FALSE(close(ops::exp(x), ref::unary(rx, [](double v) { return std::exp(v) * (1 + 3e-2); }), DType::bf16));
  EXPECT_FALSE(close(ops::exp(x), ref::Array(Shape{33, 7}), DType::f32));  // shape
  ref::Array inf = ref::unary(rx, [](double v) { return std::exp(v); });
  inf[3] = -ref::kInf;
  EXPECT_FALSE(close(ops::exp(x), inf, DType::f32));
  EXPECT_FALSE(close(ops::log(ops::scale(ops::square(x), -1.0f)), ref::Array(Shape{7, 33}, 1.0), DType::f32));  // NaN
}

}  // namespace
}  // namespace lmtune::test
