// Empty tensors at the edges of host data and CPU kernels: an empty vector's data() and an empty tensor's storage
// may be null, which memcpy must not see (UndefinedBehaviorSanitizer in the sanitized CI stage fails these
// otherwise).
#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/ops/optimizer.h"
#include "core/tensor.h"

namespace lmtune {
namespace {

TEST(TensorFromHost, EmptyTensorsOfEveryDtype) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor t = Tensor::from_floats({}, {0, 3}, dt, Device::cpu());
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.shape(), (Shape{0, 3}));
    EXPECT_TRUE(t.to_floats().empty());
  }
  const Tensor ids = Tensor::from_ints({}, {0}, Device::cpu());
  EXPECT_EQ(ids.numel(), 0);
  EXPECT_TRUE(ids.to_ints().empty());
}

TEST(TensorFromHost, EmptyTensorsThroughCpuKernels) {
  const Tensor empty = Tensor::from_floats({}, {0}, DType::f32, Device::cpu());
  const Tensor one = Tensor::from_floats({3.0f}, {1}, DType::f32, Device::cpu());
  EXPECT_EQ(ops::sum_of_squares({empty, one}).to_floats(), std::vector<float>{9.0f});  // rows of length 0 loaded
  EXPECT_EQ(ops::cast(empty, DType::bf16).numel(), 0);                                 // and stored
}

}  // namespace
}  // namespace lmtune
