// Helpers shared by the io tests: a fresh temporary directory per test and byte-building utilities.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace lmtune::testing {

// A unique empty directory under the build tree, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info ? info->test_suite_name() : "io") + "." + (info ? info->name() : "test");
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::path(LMTUNE_BINARY_DIR) / "test_tmp" / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// The message of the FileError thrown by f, or a failure if none (or another type) is thrown.
template <class F>
std::string file_error_message(F&& f) {
  try {
    f();
  } catch (const FileError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected FileError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected FileError, nothing thrown";
  return "";
}

}  // namespace lmtune::testing
