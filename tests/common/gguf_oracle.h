// The independent GGUF reader of the tests: tests/scripts/gguf_dump.mjs runs @huggingface/gguf (fetched by
// scripts/fetch_fixtures.sh) under node and prints a file's header as JSON; lmtune_dump prints lmtune's reading of
// the same file in the same form, so a test compares the two whole. Tests skip, saying why, where node or the
// package is missing.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/gguf.h"

namespace lmtune::test {

inline std::filesystem::path gguf_dump_script() {
  return std::filesystem::path(LMTUNE_SOURCE_DIR) / "tests/scripts/gguf_dump.mjs";
}

// Why the oracle cannot run here, or nullopt when it can.
inline std::optional<std::string> gguf_oracle_unavailable() {
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
  auto pkg = std::filesystem::path(LMTUNE_SOURCE_DIR) / "tests/fixtures/npm/node_modules/@huggingface/gguf";
  if (!std::filesystem::exists(pkg / "package.json"))
    return "@huggingface/gguf is not installed in " + pkg.parent_path().string() + " (run scripts/fetch_fixtures.sh)";
  return std::nullopt;
}

// The oracle's JSON for `file`; a failure of the oracle (it refused the file) is a test failure.
inline nlohmann::json gguf_oracle_dump(const std::filesystem::path& file) {
  std::string cmd = "node '" + gguf_dump_script().string() + "' '" + file.string() + "' 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[65536];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    if (pclose(p) != 0) ADD_FAILURE() << "@huggingface/gguf failed on " << file << ": " << out.substr(0, 2000);
  }
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "gguf_dump.mjs printed no JSON: " << out.substr(0, 2000);
    return {};
  }
}

// A value as the oracle prints it: 64-bit integers as strings (BigInt), other numbers as numbers.
inline nlohmann::json gguf_value_json(const GgufValue& v) {
  switch (v.type) {
    case GgufType::u64: return std::to_string(v.integer);
    case GgufType::i64: return std::to_string(int64_t(v.integer));
    case GgufType::boolean: return v.integer != 0;
    case GgufType::f32: case GgufType::f64: return v.real;
    case GgufType::string: return v.str;
    case GgufType::array: {
      nlohmann::json a = nlohmann::json::array();
      for (const GgufValue& item : v.items) a.push_back(gguf_value_json(item));
      return a;
    }
    default: return v.is_signed() ? nlohmann::json(int64_t(v.integer)) : nlohmann::json(v.integer);
  }
}

inline nlohmann::json lmtune_dump(const GgufFile& f) {
  nlohmann::json metadata = nlohmann::json::object();
  for (const auto& [key, v] : f.metadata()) {
    metadata[key] = {{"type", uint32_t(v.type)}, {"value", gguf_value_json(v)}};
    if (v.type == GgufType::array) metadata[key]["sub_type"] = uint32_t(v.elem_type);
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const GgufTensor& t : f.tensors()) {
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : t.dims) shape.push_back(std::to_string(d));
    tensors.push_back({{"name", t.name}, {"type", uint32_t(t.type)}, {"shape", shape},
                       {"offset", std::to_string(t.offset)}});
  }
  return {{"version", f.version()}, {"tensor_data_offset", std::to_string(f.data_offset())},
          {"metadata", metadata}, {"tensors", tensors}};
}

// Expects the oracle to read `file` exactly as lmtune does.
inline void expect_oracle_agrees(const std::filesystem::path& file) {
  nlohmann::json theirs = gguf_oracle_dump(file);
  nlohmann::json ours = lmtune_dump(GgufFile(file));
  EXPECT_EQ(theirs["version"], ours["version"]);
  EXPECT_EQ(theirs["tensor_data_offset"], ours["tensor_data_offset"]);
  EXPECT_EQ(theirs["tensors"], ours["tensors"]);
  ASSERT_TRUE(theirs["metadata"].is_object());
  EXPECT_EQ(theirs["metadata"].size(), ours["metadata"].size());
  for (const auto& [key, value] : ours["metadata"].items())
    EXPECT_EQ(theirs["metadata"].value(key, nlohmann::json()), value) << "key " << key;
}

}  // namespace lmtune::test
