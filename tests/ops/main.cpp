// Instantiates the device-parametrized op tests: always on the CPU; on vulkan:0 when a Vulkan device exists
// (those compare the device against the same double-precision references).
#include "backend/vulkan/vulkan_backend.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

std::vector<Device> vulkan_devices() {
  if (vk::list_devices().empty()) return {};
  return {Device::vulkan(0)};
}

std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "vulkan" + std::to_string(info.param.index);
}

INSTANTIATE_TEST_SUITE_P(Cpu, OpTest, ::testing::Values(Device::cpu()), device_name);
INSTANTIATE_TEST_SUITE_P(Vulkan, OpTest, ::testing::ValuesIn(vulkan_devices()), device_name);

}  // namespace
}  // namespace lmtune::test
