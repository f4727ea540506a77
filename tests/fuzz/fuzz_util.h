// Shared by the libFuzzer targets: the input as text or as a temporary file, the byte tokenizer fixture, and the
// rule that the project's own errors are expected outcomes while anything else escapes to libFuzzer as a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::fuzz {

inline std::string text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The file parsers map their input, so each input is written to one file per process (rewritten every run).
inline std::filesystem::path write_temp(const uint8_t* data, size_t size, const std::string& ext) {
  auto path = std::filesystem::temp_directory_path() / ("lmtune_fuzz_" + std::to_string(getpid()) + ext);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}

// A byte-level BPE tokenizer with a ChatML template (259 ids), loaded once: the targets that need a tokenizer
// fuzz what feeds it, not the tokenizer.
inline const Tokenizer& byte_tokenizer() {
  static const Tokenizer t = Tokenizer::load(std::filesystem::path(LMTUNE_SOURCE_DIR) /
                                             "tests/train/fixtures/byte_tokenizer");
  return t;
}

// Runs `body`; lmtune::Error (the project's user-facing failures) is an expected outcome for bad input.
template <typename F>
int expect_project_errors(F&& body) {
  try {
    body();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace lmtune::fuzz
