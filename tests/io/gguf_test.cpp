// GGUF container: write → read round trip of every value type and several tensor types, malformed files (each a
// clean FileError naming the file and what is wrong), and agreement with the independent reader @huggingface/gguf.
#include <gtest/gtest.h>

#include <random>

#include "common/gguf_oracle.h"
#include "io/gguf.h"
#include "io/io_test_util.h"

namespace lmtune {
namespace {
using testing::file_error_message;
using testing::TempDir;
namespace fs = std::filesystem;

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = std::byte(rng() & 0xff);
  return b;
}

// Metadata holding every value type, nested arrays and an empty array.
GgufMetadata every_type() {
  GgufMetadata m;
  m.emplace_back("general.architecture", GgufValue::of_string("llama"));
  m.emplace_back("general.alignment", GgufValue::of_u32(64));
  m.emplace_back("t.u8", GgufValue::of(GgufType::u8, 255));
  m.emplace_back("t.i8", GgufValue::of(GgufType::i8, uint64_t(int64_t(-128))));
  m.emplace_back("t.u16", GgufValue::of(GgufType::u16, 65535));
  m.emplace_back("t.i16", GgufValue::of(GgufType::i16, uint64_t(int64_t(-32768))));
  m.emplace_back("t.u32", GgufValue::of_u32(4000000000u));
  m.emplace_back("t.i32", GgufValue::of_i32(-2000000000));
  m.emplace_back("t.u64", GgufValue::of_u64(18446744073709551615ull));
  m.emplace_back("t.i64", GgufValue::of(GgufType::i64, uint64_t(INT64_MIN)));
  m.emplace_back("t.f32", GgufValue::of_f32(0.1f));
  m.emplace_back("t.f64", GgufValue::of_f64(-1e-300));
  m.emplace_back("t.bool", GgufValue::of_bool(true));
  m.emplace_back("t.string", GgufValue::of_string("héllo {{ messages }}\n"));
  m.emplace_back("t.strings", GgufValue::of_strings({"a", "", "Ġthe", "<0x0A>"}));
  m.emplace_back("t.f32s", GgufValue::of_f32s({1.5f, -0.0f, 3e38f}));
  m.emplace_back("t.i32s", GgufValue::of_i32s({1, -2, 3}));
  m.emplace_back("t.empty", GgufValue::of_array(GgufType::u8, {}));
  m.emplace_back("t.nested",
                 GgufValue::of_array(GgufType::array, {GgufValue::of_i32s({1, 2}), GgufValue::of_i32s({})}));
  m.emplace_back("t.bools",
                 GgufValue::of_array(GgufType::boolean, {GgufValue::of_bool(false), GgufValue::of_bool(true)}));
  return m;
}

struct Tensors {
  std::vector<std::vector<std::byte>> data;
  std::vector<GgufTensorToWrite> list;
  void add(std::string name, GgmlType type, std::vector<int64_t> dims) {
    data.push_back(random_bytes(gguf_tensor_bytes(type, dims), uint32_t(data.size() + 1)));
    list.push_back({std::move(name), type, std::move(dims), {}});
    for (size_t i = 0; i < list.size(); ++i) list[i].data = data[i];
  }
};

Tensors some_tensors() {
  Tensors t;
  t.add("token_embd.weight", GgmlType::F16, {8, 5});
  t.add("blk.0.attn_q.weight", GgmlType::Q8_0, {64, 3});
  t.add("blk.0.ffn_down.weight", GgmlType::Q4_K, {256, 2});
  t.add("output_norm.weight", GgmlType::F32, {7});
  t.add("x.4d", GgmlType::BF16, {2, 3, 1, 2});
  return t;
}

TEST(Gguf, RoundTripKeepsEverything) {
  TempDir dir;
  const GgufMetadata m = every_type();
  Tensors t = some_tensors();
  write_gguf(dir / "a.gguf", m, t.list);
  GgufFile f(dir / "a.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.metadata().size(), m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, m[i].first);
    EXPECT_TRUE(f.metadata()[i].second == m[i].second) << m[i].first;
  }
  ASSERT_EQ(f.tensors().size(), t.list.size());
  for (size_t i = 0; i < t.list.size(); ++i) {
    const GgufTensor& r = f.tensors()[i];
    EXPECT_EQ(r.name, t.list[i].name);
    EXPECT_EQ(r.type, t.list[i].type);
    EXPECT_EQ(r.dims, t.list[i].dims);
    EXPECT_EQ(r.offset % 64, 0u);
    ASSERT_EQ(r.data.size(), t.data[i].size());
    EXPECT_TRUE(std::equal(r.data.begin(), r.data.end(), t.data[i].begin())) << r.name;
  }
  EXPECT_EQ(f.tensor("x.4d").shape(), (Shape{2, 1, 3, 2}));
  // Typed getters.
  EXPECT_EQ(f.get_int("t.i8"), -128);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000);
  EXPECT_FLOAT_EQ(float(f.get_float("t.f32")), 0.1f);
  EXPECT_EQ(f.get_strings("t.strings")[2], "Ġthe");
  EXPECT_EQ(f.get_ints("t.i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.opt_bool("t.bool"), true);
  EXPECT_FALSE(f.opt_int("missing.key"));
  EXPECT_NE(file_error_message([&] { f.get_int("t.u64"); }).find("does not fit"), std::string::npos);
  EXPECT_NE(file_error_message([&] { f.get_string("t.u8"); }).find("key 't.u8': expected a string, found a u8"),
            std::string::npos);
  EXPECT_NE(file_error_message([&] { f.tensor("nope"); }).find("tensor 'nope' not found"), std::string::npos);
  // The file is exactly what serialize_gguf makes.
  std::vector<std::byte> bytes = serialize_gguf(m, t.list);
  std::vector<std::byte> on_disk = read_file_bytes(dir / "a.gguf");
  EXPECT_EQ(bytes, on_disk);
}

TEST(Gguf, WriterRejectsBadInput) {
  TempDir dir;
  Tensors t;
  t.add("a", GgmlType::F32, {4});
  auto expect_error = [&](const GgufMetadata& m, std::vector<GgufTensorToWrite> tensors, const std::string& what) {
    EXPECT_THROW(write_gguf(dir / "bad.gguf", m, tensors), Error) << what;
    EXPECT_FALSE(fs::exists(dir / "bad.gguf")) << what;
  };
  expect_error({{"k", GgufValue::of_u32(1)}, {"k", GgufValue::of_u32(2)}}, {}, "duplicate key");
  expect_error({{"general.alignment", GgufValue::of_u32(3)}}, {}, "alignment 3");
  expect_error({}, {t.list[0], t.list[0]}, "duplicate tensor");
  expect_error({}, {{std::string(64, 'x'), GgmlType::F32, {4}, t.data[0]}}, "long name");
  expect_error({}, {{"a", GgmlType::F32, {5}, t.data[0]}}, "wrong data size");
  expect_error({}, {{"a", GgmlType::Q8_0, {16}, t.data[0]}}, "partial block");
  expect_error({}, {{"a", GgmlType::F32, {1, 1, 1, 1, 4}, t.data[0]}}, "5 dims");
}

// ---- malformed files --------------------------------------------------------------------------------------------

// Builds GGUF bytes by hand, independently of the writer.
struct Builder {
  std::string s;
  Builder& u32(uint32_t v) {
    s.append(reinterpret_cast<const char*>(&v), 4);
    return *this;
  }
  Builder& u64(uint64_t v) {
    s += testing::le64(v);
    return *this;
  }
  Builder& str(const std::string& x) {
    u64(x.size());
    s += x;
    return *this;
  }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    s = "GGUF";
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Builder& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad(size_t align = 32) {
    s.append((align - s.size() % align) % align, '\0');
    return *this;
  }
  Builder& zeros(size_t n) {
    s.append(n, '\0');
    return *this;
  }
};

TEST(Gguf, TruncatedAtEveryByteIsAnError) {
  TempDir dir;
  Tensors t = some_tensors();
  std::vector<std::byte> full = serialize_gguf(every_type(), t.list);
  std::string bytes(reinterpret_cast<const char*>(full.data()), full.size());
  for (size_t n = 0; n < bytes.size(); ++n) {
    testing::write_bytes(dir / "t.gguf", bytes.substr(0, n));
    std::string msg = file_error_message([&] { GgufFile f(dir / "t.gguf"); });
    EXPECT_NE(msg.find((dir / "t.gguf").string()), std::string::npos) << "prefix " << n << ": " << msg;
  }
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* message;  // a substring the error must hold
};

std::vector<BadCase> bad_cases() {
  auto B = [] { return Builder(); };
  std::string kv_key = "general.architecture";
  return {
      {"empty", "", "header (magic): file truncated"},
      {"magic", "GGUX" + std::string(20, '\0'), "not a GGUF file"},
      {"version1", B().header(0, 0, 1).s, "GGUF version 1 is not supported"},
      {"version4", B().header(0, 0, 4).s, "unsupported GGUF version 4"},
      {"big_endian", B().header(0, 0, 0x03000000).s, "big-endian"},
      {"huge_tensor_count", B().header(uint64_t(1) << 62, 0).s, "header (tensor count): 4611686018427387904 is more"},
      {"huge_kv_count", B().header(0, ~uint64_t(0)).s, "header (metadata count)"},
      {"huge_key_length", B().header(0, 1).u64(uint64_t(1) << 40).zeros(16).s,
       "metadata entry 0 (key): string length"},
      {"key_past_end", B().header(0, 1).u64(100).s + "abcdefgh", "metadata entry 0 (key): file truncated"},
      {"empty_key", B().header(0, 1).str("").u32(4).u32(1).s, "empty key"},
      {"non_utf8_key", B().header(0, 1).str("a\xff").u32(4).u32(1).s, "key is not valid UTF-8"},
      {"duplicate_key", B().header(0, 2).kv_u32("a", 1).kv_u32("a", 2).s, "key 'a': duplicate key"},
      {"bad_value_type", B().header(0, 1).str("a").u32(13).s, "key 'a': unknown value type 13"},
      {"bool_2", B().header(0, 1).str("a").u32(7).s + "\x02", "key 'a': bool value 2"},
      {"huge_string", B().header(0, 1).str("a").u32(8).u64(~uint64_t(0) >> 1).s, "key 'a': string length"},
      {"huge_array", B().header(0, 1).str("a").u32(9).u32(6).u64(uint64_t(1) << 61).s,
       "key 'a' (array length): 2305843009213693952 is more"},
      {"array_bad_elem", B().header(0, 1).str("a").u32(9).u32(77).u64(0).s, "unknown array element type 77"},
      {"deep_array",
       [&] {
         Builder b = B().header(0, 1).str("a").u32(9);
         for (int i = 0; i < 9; ++i) b.u32(9).u64(1);
         return b.u32(4).u64(0).s;
       }(),
       "nested deeper than 8"},
      {"alignment_type", B().header(0, 1).str("general.alignment").u32(10).u64(32).s,
       "key 'general.alignment': must be a u32"},
      {"alignment_zero", B().header(0, 1).kv_u32("general.alignment", 0).s, "0 is not a power of two"},
      {"alignment_3", B().header(0, 1).kv_u32("general.alignment", 3).s, "3 is not a power of two"},
      {"empty_name", B().header(1, 0).tensor("", {4}, 0, 0).pad().zeros(16).s, "empty tensor name"},
      {"long_name", B().header(1, 0).tensor(std::string(64, 'n'), {4}, 0, 0).pad().zeros(16).s,
       "tensor info 0 (name): string length 64 exceeds the limit 63"},
      {"non_utf8_name", B().header(1, 0).tensor("w\xc0\x80", {4}, 0, 0).pad().zeros(16).s, "not valid UTF-8"},
      {"dup_name", B().header(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad().zeros(48).s,
       "tensor 'w': duplicate tensor name"},
      {"zero_dims", B().header(1, 0).tensor("w", {}, 0, 0).pad().zeros(16).s, "tensor 'w': 0 dimensions"},
      {"five_dims", B().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(16).s, "5 dimensions"},
      {"huge_dim", B().header(1, 0).tensor("w", {uint64_t(1) << 60}, 0, 0).s, "dimension 1152921504606846976"},
      {"dims_overflow", B().header(1, 0).tensor("w", {1ull << 40, 1ull << 40}, 0, 0).pad().s, "overflow"},
      {"removed_type", B().header(1, 0).tensor("w", {4}, 4, 0).pad().zeros(16).s, "unknown ggml type 4"},
      {"unknown_type", B().header(1, 0).tensor("w", {4}, 99, 0).pad().zeros(16).s,
       "tensor 'w': unknown ggml type 99"},
      {"partial_block", B().header(1, 0).tensor("w", {100}, 12, 0).pad().zeros(512).s,
       "not a multiple of Q4_K's block of 256"},
      {"misaligned", B().header(1, 0).tensor("w", {4}, 0, 4).pad().zeros(64).s,
       "tensor 'w': offset 4 is not a multiple of the alignment 32"},
      {"past_end", B().header(1, 0).tensor("w", {4}, 0, 0).pad().zeros(15).s,
       "tensor 'w': data [0, 16) ends past the data section of 15 bytes"},
      {"offset_past_end", B().header(1, 0).tensor("w", {4}, 0, 1ull << 62).pad().zeros(16).s, "ends past"},
      {"no_data_section", B().header(1, 0).tensor("w", {4}, 0, 0).s, "file truncated before the data section"},
      {"overlap", B().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad().zeros(96).s,
       "tensor 'b': data at offset 32 overlaps tensor 'a' [0, 64)"},
      {"same_offset", B().header(2, 0).tensor("a", {4}, 0, 0).tensor("b", {4}, 0, 0).pad().zeros(32).s, "overlaps"},
      {"kv_truncated", B().header(0, 1).str(kv_key).u32(4).s, "key 'general.architecture': file truncated"},
  };
}

TEST(Gguf, MalformedFilesGiveCleanErrors) {
  TempDir dir;
  for (const BadCase& c : bad_cases()) {
    const fs::path p = dir / (std::string(c.name) + ".gguf");
    testing::write_bytes(p, c.bytes);
    std::string msg = file_error_message([&] { GgufFile f(p); });
    EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.name << ": got \"" << msg << "\"";
  }
}

TEST(Gguf, AcceptsWhatIsValid) {
  TempDir dir;
  // Version 2, no tensors and no padding after the metadata; zero-size tensors may share an offset.
  testing::write_bytes(dir / "v2.gguf", Builder().header(0, 1, 2).kv_u32("a", 7).s);
  EXPECT_EQ(GgufFile(dir / "v2.gguf").get_int("a"), 7);
  testing::write_bytes(dir / "z.gguf",
                       Builder().header(2, 0).tensor("a", {0}, 0, 0).tensor("b", {0, 3}, 0, 0).pad().s);
  EXPECT_EQ(GgufFile(dir / "z.gguf").tensors().size(), 2u);
}

TEST(Gguf, FindModelInDirectory) {
  TempDir dir;
  EXPECT_FALSE(find_gguf_model(dir.path()));
  testing::write_bytes(dir / "m.gguf", "");
  EXPECT_EQ(find_gguf_model(dir.path()), dir / "m.gguf");
  EXPECT_EQ(find_gguf_model(dir / "m.gguf"), dir / "m.gguf");
  testing::write_bytes(dir / "n.gguf", "");
  EXPECT_NE(file_error_message([&] { find_gguf_model(dir.path()); }).find("several GGUF files (m.gguf, n.gguf)"),
            std::string::npos);
  testing::write_bytes(dir / "model.safetensors", "");
  EXPECT_FALSE(find_gguf_model(dir.path()));  // a HF directory
}

TEST(GgufOracle, HuggingFaceReaderAgrees) {
  if (auto why = test::gguf_oracle_unavailable()) GTEST_SKIP() << "GGUF oracle unavailable: " << *why;
  TempDir dir;
  Tensors t = some_tensors();
  write_gguf(dir / "a.gguf", every_type(), t.list);
  test::expect_oracle_agrees(dir / "a.gguf");
}

}  // namespace
}  // namespace lmtune
