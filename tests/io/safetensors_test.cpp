// Tests for io/safetensors: round trips, byte-exact agreement with the reference writer, a fixture from an
// independent writer, sharded checkpoints, conversions, and a corpus of malformed files that must each give
// a FileError naming the file and the problem.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "io/io_test_util.h"

namespace lmtune {
namespace {

using testing::file_error_message;
using testing::le64;
using testing::TempDir;
using testing::write_bytes;

template <class T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

std::vector<float> floats_of(const SafetensorsTensor& t) { return t.to_f32(); }

// ---- writer / reader round trip ----

TEST(Safetensors, RoundTripKeepsEverything) {
  TempDir dir;
  std::vector<float> b = {1, 2, 3, 4}, a = {-1.5f, 0.25f, 1e-8f};
  std::vector<std::byte> h = convert_from_f32(std::vector<float>{0.5f, -3.0f}, DType::f16);
  std::vector<std::byte> z = convert_from_f32(std::vector<float>{1.0f, 2.5f, -0.125f}, DType::bf16);
  std::vector<uint8_t> u = {1, 2, 3, 4, 5};
  std::vector<int64_t> i = {-42};
  std::vector<TensorToWrite> tensors = {
      {"b", StDType::F32, {2, 2}, as_bytes_of(b)},   {"a", StDType::F32, {3}, as_bytes_of(a)},
      {"h", StDType::F16, {2}, h},                   {"z", StDType::BF16, {3}, z},
      {"u", StDType::U8, {5}, as_bytes_of(u)},       {"i", StDType::I64, {1}, as_bytes_of(i)},
      {"scalar", StDType::F32, {}, as_bytes_of(std::vector<float>{7.0f})},
      {"empty", StDType::F32, {0, 3}, {}},
  };
  // `scalar` points at a temporary vector: give it storage that outlives the write.
  std::vector<float> scalar = {7.0f};
  tensors[6].data = as_bytes_of(scalar);
  auto p = dir / "model.safetensors";
  write_safetensors(p, tensors, {{"format", "pt"}, {"note", "ünïcode"}});

  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "ünïcode");
  EXPECT_EQ(f.header_size() % 8, 0u);
  // File order = the reference's: descending dtype alignment, then name.
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"i", "a", "b", "empty", "scalar", "z", "h", "u"}));
  // Every tensor's data is aligned to its element size within the file.
  const std::byte* file_start = f.tensors()[0].data.data() - 8 - f.header_size();
  for (const auto& t : f.tensors())
    EXPECT_EQ(size_t(t.data.data() - file_start) % (st_dtype_bits(t.st_dtype) / 8), 0u) << t.name;

  EXPECT_EQ(f.at("b").shape, (Shape{2, 2}));
  EXPECT_EQ(f.at("b").dtype(), DType::f32);
  EXPECT_EQ(floats_of(f.at("b")), b);
  EXPECT_EQ(floats_of(f.at("a")), a);
  EXPECT_EQ(floats_of(f.at("h")), (std::vector<float>{0.5f, -3.0f}));
  EXPECT_EQ(floats_of(f.at("z")), (std::vector<float>{1.0f, 2.5f, -0.125f}));
  EXPECT_EQ(f.at("scalar").shape, Shape{});
  EXPECT_EQ(floats_of(f.at("scalar")), std::vector<float>{7.0f});
  EXPECT_EQ(f.at("empty").numel(), 0);
  EXPECT_TRUE(f.at("empty").data.empty());
  EXPECT_EQ(f.at("u").st_dtype, StDType::U8);
  EXPECT_EQ(std::memcmp(f.at("u").data.data(), u.data(), 5), 0);
  EXPECT_EQ(f.find("missing"), nullptr);
  std::string msg = file_error_message([&] { f.at("missing"); });
  EXPECT_NE(msg.find("model.safetensors: no tensor named 'missing'"), std::string::npos) << msg;
}

TEST(Safetensors, UnsupportedDtypeFailsOnlyWhenConverted) {
  TempDir dir;
  std::vector<double> d = {1.0, 2.0};
  std::vector<TensorToWrite> tensors = {{"model.x", StDType::F64, {2}, as_bytes_of(d)}};
  write_safetensors(dir / "f64.safetensors", tensors);
  SafetensorsFile f(dir / "f64.safetensors");  // loading is fine
  EXPECT_EQ(f.at("model.x").st_dtype, StDType::F64);
  EXPECT_EQ(f.at("model.x").data.size(), 16u);
  std::string msg = file_error_message([&] { f.at("model.x").dtype(); });
  EXPECT_NE(msg.find("f64.safetensors: unsupported dtype F64 in tensor 'model.x'"), std::string::npos) << msg;
  msg = file_error_message([&] { f.at("model.x").to_f32(); });
  EXPECT_NE(msg.find("unsupported dtype F64 in tensor 'model.x'"), std::string::npos) << msg;
}

TEST(Safetensors, DtypeTableMatchesReference) {
  EXPECT_EQ(parse_st_dtype("F8_E4M3"), StDType::F8_E4M3);
  EXPECT_EQ(parse_st_dtype("BOOL"), StDType::BOOL);
  EXPECT_EQ(parse_st_dtype("f32"), std::nullopt);  // names are case-sensitive
  EXPECT_EQ(parse_st_dtype("F128"), std::nullopt);
  EXPECT_EQ(st_dtype_bits(StDType::F4), 4u);
  EXPECT_EQ(st_dtype_bits(StDType::F6_E3M2), 6u);
  EXPECT_EQ(st_dtype_bits(StDType::C64), 64u);
  EXPECT_EQ(st_dtype_name(StDType::U64), "U64");
  for (int i = 0; i <= int(StDType::U64); ++i)
    EXPECT_EQ(parse_st_dtype(st_dtype_name(StDType(i))), StDType(i));
  EXPECT_EQ(to_st_dtype(DType::bf16), StDType::BF16);
  EXPECT_EQ(to_lmtune_dtype(StDType::I64), std::nullopt);
}

// The byte sequences below are the expected outputs of the reference crate's own serialization tests
// (test_serialization, test_serialization_forced_alignement, test_empty).
std::vector<std::byte> to_bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(std::byte(b));
  return out;
}

TEST(Safetensors, SerializationMatchesReferenceBytes) {
  std::vector<float> data = {0, 1, 2, 3, 4, 5};
  std::vector<TensorToWrite> one = {{"attn.0", StDType::F32, {1, 2, 3}, as_bytes_of(data)}};
  EXPECT_EQ(serialize_safetensors(one),
            to_bytes({64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100, 116, 121,
                      112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 50,
                      44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44,
                      50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0,
                      0, 160, 64}));
  std::vector<TensorToWrite> padded = {{"attn0", StDType::F32, {1, 1, 2, 3}, as_bytes_of(data)}};
  EXPECT_EQ(serialize_safetensors(padded),
            to_bytes({72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116, 121, 112,
                      101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 49, 44, 50,
                      44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44,
                      50, 52, 93, 125, 125, 32, 32, 32, 32, 32, 32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0,
                      0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64}));
  EXPECT_EQ(serialize_safetensors({}), to_bytes({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  EXPECT_EQ(serialize_safetensors({}, {{"framework", "pt"}}),
            to_bytes({40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
                      95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
                      116, 34, 125, 125, 32, 32, 32, 32, 32}));
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  std::vector<float> four = {1, 2, 3, 4};
  auto p = dir / "bad.safetensors";
  auto write = [&](std::vector<TensorToWrite> t) { write_safetensors(p, t); };
  std::string msg = file_error_message([&] { write({{"w", StDType::F32, {3}, as_bytes_of(four)}}); });
  EXPECT_NE(msg.find("bad.safetensors: tensor 'w': has 16 bytes of data but shape [3] × F32 needs 12"),
            std::string::npos) << msg;
  msg = file_error_message([&] {
    write({{"w", StDType::F32, {4}, as_bytes_of(four)}, {"w", StDType::F32, {4}, as_bytes_of(four)}});
  });
  EXPECT_NE(msg.find("tensor 'w': duplicate tensor name"), std::string::npos) << msg;
  msg = file_error_message([&] { write({{"__metadata__", StDType::F32, {4}, as_bytes_of(four)}}); });
  EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  msg = file_error_message([&] { write({{"w", StDType::F32, {-4}, as_bytes_of(four)}}); });
  EXPECT_NE(msg.find("overflows"), std::string::npos) << msg;
  msg = file_error_message([&] { write({{"bad\xff", StDType::F32, {4}, as_bytes_of(four)}}); });
  EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(p));  // nothing published on failure
}

// ---- a file from an independent writer (scripts/make_safetensors_fixture.py) ----

TEST(Safetensors, FixtureFromIndependentWriter) {
  SafetensorsFile f(std::filesystem::path(LMTUNE_SOURCE_DIR) / "tests/io/fixtures/tiny.safetensors");
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.header_size() % 8, 3u);  // unpadded: data is not aligned, which the reader must handle
  EXPECT_EQ(f.at("a.weight").shape, (Shape{2, 3}));
  EXPECT_EQ(f.at("a.weight").to_f32(), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f}));
  EXPECT_EQ(f.at("b.bias").dtype(), DType::f16);
  EXPECT_EQ(f.at("b.bias").to_f32(), (std::vector<float>{0.5f, -1.0f, 65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(f.at("c.norm").dtype(), DType::bf16);
  EXPECT_EQ(f.at("c.norm").to_f32(), (std::vector<float>{1.5f, -2.0f, 0.15625f, 256.0f}));
  const auto& ids = f.at("d.ids");
  EXPECT_EQ(ids.st_dtype, StDType::I64);
  int64_t v[2];
  std::memcpy(v, ids.data.data(), 16);
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v[1], -9);
  EXPECT_EQ(f.at("e.empty").shape, (Shape{0, 4}));
  EXPECT_TRUE(f.at("e.empty").to_f32().empty());
}

// ---- conversions ----

TEST(Safetensors, Conversions) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, std::numeric_limits<float>::infinity()};
  auto h = convert_from_f32(v, DType::f16);
  ASSERT_EQ(h.size(), v.size() * 2);
  auto back = convert_to_f32(h, DType::f16);
  EXPECT_EQ(back[2], 1.0f);
  EXPECT_EQ(back[3], -2.5f);
  EXPECT_EQ(back[4], 65504.0f);
  EXPECT_NEAR(back[5], 1e-7f, 6e-8f);  // f16 subnormal
  EXPECT_TRUE(std::isinf(back[6]));
  EXPECT_TRUE(std::signbit(back[1]));
  // bf16 rounds to nearest even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.
  auto b = convert_from_f32(std::vector<float>{1.0f + std::ldexp(1.0f, -8), 3.0f}, DType::bf16);
  EXPECT_EQ(convert_to_f32(b, DType::bf16), (std::vector<float>{1.0f, 3.0f}));
  // f16 -> bf16 directly.
  auto hb = convert_dtype(convert_from_f32(std::vector<float>{0.5f, -4.0f}, DType::f16), DType::f16, DType::bf16);
  EXPECT_EQ(convert_to_f32(hb, DType::bf16), (std::vector<float>{0.5f, -4.0f}));
  auto same = convert_dtype(h, DType::f16, DType::f16);
  EXPECT_EQ(same, h);
  auto ints = convert_from_f32(std::vector<float>{2.6f, -1e20f, NAN}, DType::i32);
  EXPECT_EQ(convert_to_f32(ints, DType::i32), (std::vector<float>{3.0f, -2147483648.0f, 0.0f}));
  // Every finite f16 value survives f16 -> f32 -> f16 (covers the subnormal range, 2^-24 .. 2^-14).
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu)) continue;  // NaN payloads are not preserved
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(bits))), bits) << std::hex << bits;
  }
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -15)), 0x0200);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to 2^-24: ties to even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  std::vector<std::byte> odd(3);
  EXPECT_THROW(convert_to_f32(odd, DType::f16), ShapeError);
}

// ---- malformed corpus ----

std::string st_bytes(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

struct MalformedCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> expected;  // substrings of the message (the file name is checked for all cases)
};

std::vector<MalformedCase> malformed_cases() {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  return {
      {"empty_file", "", {"file is 0 bytes, too short"}},
      {"truncated_length", std::string("\x10\0\0", 3), {"file is 3 bytes, too short"}},
      {"truncated_header", le64(100) + R"({"a":{"dtype")", {"header length 100 exceeds the 13 bytes after"}},
      {"truncated_data", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", 5),
       {"tensor 'a'", "extend past the end of the data section (5 bytes"}},
      {"header_length_zero", le64(0), {"header length 0 is too small"}},
      {"header_length_one", le64(1) + "{", {"header length 1 is too small"}},
      {"header_length_huge", le64(1ull << 62) + "{}", {"exceeds the limit of 100000000"}},
      {"header_length_max", le64(~0ull) + "{}", {"exceeds the limit"}},
      {"header_over_limit", le64(100'000'001) + "{}", {"header length 100000001 exceeds the limit"}},
      {"non_utf8_header", st_bytes("{\"a\xff\":1}", 0), {"header is not valid UTF-8 (byte 3"}},
      {"overlong_utf8", st_bytes("{\"\xc0\xaf\":1}", 0), {"not valid UTF-8"}},
      {"surrogate_utf8", st_bytes("{\"\xed\xa0\x80\":1}", 0), {"not valid UTF-8"}},
      {"bad_json", st_bytes(R"({"a":)", 0), {"header: not valid JSON"}},
      {"trailing_garbage", st_bytes(R"({} x)", 0), {"not valid JSON"}},
      {"nul_padding", st_bytes(std::string("{}\0\0\0\0\0\0", 8), 0), {"not valid JSON: NUL byte at position 2"}},
      {"not_object_array", st_bytes("[1,2]", 0), {"header does not start with '{'"}},
      {"leading_space", st_bytes(" {}", 0), {"does not start with '{'"}},
      {"tensor_not_object", st_bytes(R"({"a":5})", 0), {"tensor 'a': expected an object", "an integer"}},
      {"missing_dtype", st_bytes(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), {"tensor 'a': missing field 'dtype'"}},
      {"missing_offsets", st_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", 4), {"missing field 'data_offsets'"}},
      {"unknown_dtype", st_bytes(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
       {"tensor 'a': unknown dtype 'F128'", "known: BOOL, F4"}},
      {"lowercase_dtype", st_bytes(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4),
       {"unknown dtype 'f32'"}},
      {"dtype_not_string", st_bytes(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
       {"dtype must be a string"}},
      {"overlapping", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 +
                               R"(,"data_offsets":[4,12]}})", 12),
       {"tensor 'b': data offsets [4, 12) overlap", "previous tensor 'a' ends at 8"}},
      {"same_offsets", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 +
                                R"(,"data_offsets":[0,8]}})", 8),
       {"data offsets [0, 8) overlap"}},
      {"gapped", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 +
                          R"(,"data_offsets":[12,20]}})", 20),
       {"tensor 'b': data offsets [12, 20) leave a gap", "'a' ends at 8"}},
      {"not_starting_at_zero", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[4,12]}})", 12),
       {"tensor 'a': data offsets [4, 12) leave a gap: the data section starts at 0"}},
      {"beyond_end", st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
       {"tensor 'a': data offsets [0, 16) extend past the end of the data section (8 bytes"}},
      {"huge_offsets", st_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", 1),
       {"tensor 'a': data_offsets must be"}},
      {"begin_after_end", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[8,0]}})", 8),
       {"tensor 'a': data offsets [8, 0) have begin > end"}},
      {"offsets_arity", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8,16]}})", 8), {"data_offsets must be"}},
      {"offsets_negative", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[-8,0]}})", 8), {"data_offsets must be"}},
      {"size_mismatch",
       st_bytes(R"({"model.layers.0.q_proj.weight":{"dtype":"F32","shape":[8,8],"data_offsets":[0,100]}})", 100),
       {"tensor 'model.layers.0.q_proj.weight': data offsets [0, 100) do not match shape [8, 8] × F32 = 256 bytes"}},
      {"overflowing_shape",
       st_bytes(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", 4),
       {"tensor 'a': shape [1099511627776, 1099511627776] overflows the element count"}},
      {"overflowing_bytes",
       st_bytes(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
       {"overflows the byte size"}},
      {"shape_beyond_int64",
       st_bytes(R"({"a":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0),
       {"shape entry 0 is 9223372036854775808"}},
      {"negative_shape", st_bytes(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8),
       {"tensor 'a': shape entry 1 is -1, expected a non-negative integer"}},
      {"float_shape", st_bytes(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       {"shape entry 0 is 2.5"}},
      {"integral_float_shape", st_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
       {"shape entry 0 is 2.0"}},
      {"string_shape", st_bytes(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8),
       {"shape entry 0 is \"2\""}},
      {"shape_not_array", st_bytes(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8),
       {"shape must be an array"}},
      {"partial_byte", st_bytes(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
       {"shape [3] × F4 is not a whole number of bytes"}},
      {"metadata_number", st_bytes(R"({"__metadata__":{"format":"pt","n":1}})", 0),
       {"__metadata__ key 'n': expected a string value, got an integer"}},
      {"metadata_not_object", st_bytes(R"({"__metadata__":["pt"]})", 0), {"__metadata__ must be an object"}},
      {"duplicate_tensor",
       st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"a":{)" + f32x2 + R"(,"data_offsets":[8,16]}})", 16),
       {"duplicate key 'a'"}},
      {"duplicate_field", st_bytes(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4),
       {"duplicate key 'dtype'"}},
      {"trailing_data", st_bytes(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", 16),
       {"tensors cover 8 bytes but the data section has 16 bytes"}},
      {"no_tensors_but_data", st_bytes("{}", 4), {"tensors cover 0 bytes but the data section has 4"}},
  };
}

TEST(SafetensorsMalformed, EachCaseGivesAClearFileError) {
  TempDir dir;
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.name);
    auto p = dir / (std::string(c.name) + ".safetensors");
    write_bytes(p, c.bytes);
    std::string msg = file_error_message([&] { SafetensorsFile f(p); });
    EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << "message must start with the path: " << msg;
    for (const std::string& s : c.expected) EXPECT_NE(msg.find(s), std::string::npos) << msg;
  }
}

TEST(SafetensorsMalformed, AcceptedEdgeCases) {
  TempDir dir;
  // Null metadata, extra fields in a tensor entry (ignored, as by the reference), unpadded header, no tensors.
  auto p = dir / "edge.safetensors";
  write_bytes(p, st_bytes(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}})", 2));
  SafetensorsFile f(p);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.at("a").data.size(), 2u);
  write_bytes(p, st_bytes("{}", 0));
  EXPECT_TRUE(SafetensorsFile(p).tensors().empty());
  // Several empty tensors may share an offset.
  write_bytes(p, st_bytes(R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                          R"("e2":{"dtype":"F16","shape":[3,0],"data_offsets":[0,0]},)"
                          R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_EQ(SafetensorsFile(p).tensors().size(), 3u);
}

// ---- sharded checkpoints ----

class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<TensorToWrite> s1 = {{"embed.weight", StDType::F32, {2, 2}, as_bytes_of(w1)},
                                     {"layers.0.w", StDType::F32, {4}, as_bytes_of(w2)}};
    std::vector<TensorToWrite> s2 = {{"layers.1.w", StDType::F32, {4}, as_bytes_of(w3)}};
    write_safetensors(dir / "model-00001-of-00002.safetensors", s1);
    write_safetensors(dir / "model-00002-of-00002.safetensors", s2);
  }
  void write_index(const std::string& weight_map) {
    write_bytes(dir / "model.safetensors.index.json",
                R"({"metadata":{"total_size":48},"weight_map":)" + weight_map + "}");
  }
  const std::string good_map = R"({"embed.weight":"model-00001-of-00002.safetensors",)"
                               R"("layers.0.w":"model-00001-of-00002.safetensors",)"
                               R"("layers.1.w":"model-00002-of-00002.safetensors"})";
  TempDir dir;
  std::vector<float> w1 = {1, 2, 3, 4}, w2 = {5, 6, 7, 8}, w3 = {9, 10, 11, 12};
};

TEST_F(ShardedCheckpoint, ReadsAllShards) {
  write_index(good_map);
  for (const auto& p : {dir.path(), dir / "model.safetensors.index.json"}) {
    SafetensorsCheckpoint ck(p);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"embed.weight", "layers.0.w", "layers.1.w"}));
    EXPECT_EQ(ck.files().size(), 2u);
    EXPECT_EQ(ck.at("layers.1.w").to_f32(), w3);
    EXPECT_EQ(ck.at("embed.weight").to_f32(), w1);
    EXPECT_EQ(ck.index_metadata().at("total_size"), "48");
    EXPECT_NE(ck.at("layers.1.w").file.string().find("model-00002-of-00002"), std::string::npos);
  }
  SafetensorsCheckpoint moved = SafetensorsCheckpoint(dir.path());
  EXPECT_EQ(moved.at("layers.0.w").to_f32(), w2);  // views survive moves
}

TEST_F(ShardedCheckpoint, SingleFileAndDirectory) {
  SafetensorsCheckpoint one(dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(one.size(), 1u);
  EXPECT_TRUE(one.index_metadata().empty());
  std::string msg = file_error_message([&] { SafetensorsCheckpoint ck(dir.path()); });
  EXPECT_NE(msg.find("neither model.safetensors.index.json nor model.safetensors"), std::string::npos) << msg;
  std::filesystem::copy_file(dir / "model-00001-of-00002.safetensors", dir / "model.safetensors");
  EXPECT_EQ(SafetensorsCheckpoint(dir.path()).size(), 2u);
  msg = file_error_message([&] { SafetensorsCheckpoint(dir.path()).at("nope"); });
  EXPECT_NE(msg.find("no tensor named 'nope'"), std::string::npos) << msg;
}

TEST_F(ShardedCheckpoint, MissingShardFile) {
  write_index(R"({"embed.weight":"model-00001-of-00002.safetensors","lm_head.weight":"model-00003-of-00003.safetensors"})");
  std::string msg = file_error_message([&] { SafetensorsCheckpoint ck(dir.path()); });
  EXPECT_NE(msg.find("model.safetensors.index.json: shard 'model-00003-of-00003.safetensors' (listed for tensor "
                     "'lm_head.weight') does not exist"), std::string::npos) << msg;
}

TEST_F(ShardedCheckpoint, TensorMissingFromShard) {
  write_index(R"({"embed.weight":"model-00001-of-00002.safetensors","layers.9.w":"model-00002-of-00002.safetensors"})");
  std::string msg = file_error_message([&] { SafetensorsCheckpoint ck(dir.path()); });
  EXPECT_NE(msg.find("index.json: tensor 'layers.9.w' is mapped to shard 'model-00002-of-00002.safetensors' but "
                     "that shard has no such tensor"), std::string::npos) << msg;
}

TEST_F(ShardedCheckpoint, MalformedIndex) {
  struct Case { std::string index; std::string expected; };
  std::vector<Case> cases = {
      {R"({"weight_map":)", "not valid JSON"},
      {R"([1])", "expected a JSON object with 'weight_map'"},
      {R"({"metadata":{}})", "missing 'weight_map'"},
      {R"({"weight_map":[]})", "'weight_map' must be an object"},
      {R"({"weight_map":{"a":1}})", "weight_map key 'a': expected a shard file name"},
      {R"({"weight_map":{"a":"../model-00001-of-00002.safetensors"}})", "must be a file name in the index's directory"},
      {R"({"weight_map":{"a":"x.safetensors","a":"y.safetensors"}})", "duplicate key 'a'"},
      {R"({"metadata":5,"weight_map":{}})", "'metadata' must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.index);
    write_bytes(dir / "model.safetensors.index.json", c.index);
    std::string msg = file_error_message([&] { SafetensorsCheckpoint ck(dir.path()); });
    EXPECT_NE(msg.find("model.safetensors.index.json: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
  }
}

TEST_F(ShardedCheckpoint, MalformedShardNamesTheShard) {
  write_index(good_map);
  write_bytes(dir / "model-00002-of-00002.safetensors", le64(3) + "{}");
  std::string msg = file_error_message([&] { SafetensorsCheckpoint ck(dir.path()); });
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors: header length 3 exceeds"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lmtune
