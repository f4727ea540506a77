// Error types. Every failure a user can cause (bad files, shapes, keys, devices) is one of these; the CLI turns
// them into one clear message and a non-zero exit code. Messages carry context: file, line, key, tensor, shapes.
#pragma once
#include <stdexcept>
#include <string>

namespace lmtune {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Shapes, dtypes or devices of operands do not fit the op.
struct ShapeError : Error { using Error::Error; };
// A file could not be read or is malformed (message names the file and the problem).
struct FileError : Error { using Error::Error; };
// A configuration key or value is wrong (message names the file and key).
struct ConfigError : Error { using Error::Error; };
// Device problems: no device, out of memory, device lost, unsupported feature.
struct DeviceError : Error { using Error::Error; };
struct OutOfMemoryError : DeviceError { using DeviceError::DeviceError; };
// Autodiff misuse: an op without a vjp/jvp, backward of a non-scalar, ...
struct AutodiffError : Error { using Error::Error; };

}  // namespace lmtune
