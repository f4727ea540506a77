// Linked into every test binary: tensors created without a device go to the CPU, whatever GPU the machine has,
// so tests behave the same on a developer's GPU machine and in CI. Device-parametrized tests name their device.
#include "core/device.h"

namespace {
const bool kDefaultDeviceIsCpu = [] {
  lmtune::set_default_device(lmtune::Device::cpu());
  return true;
}();
}  // namespace
