// Fuzzes the safetensors reader: header length, JSON header (dtypes, shapes, data_offsets, __metadata__) and the
// tensors' data ranges; valid tensors of a float dtype are then widened to f32 as the model loader would.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = lmtune::fuzz::write_temp(data, size, ".safetensors");
  return lmtune::fuzz::expect_project_errors([&] {
    lmtune::SafetensorsFile file(path);
    for (const auto& t : file.tensors()) {
      (void)file.at(t.name).numel();
      (void)t.to_f32();  // throws ShapeError/FileError for dtypes other than F32, F16, BF16
    }
  });
}
