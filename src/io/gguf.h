// GGUF (llama.cpp's model file) reading, memory-mapped, and writing, atomic. The reader treats the file as untrusted:
// every count, length, dimension, offset and size is checked against the file's size before anything is allocated,
// tensors must be aligned, inside the data section and must not overlap, and unknown value or tensor types are
// refused. Every problem throws FileError("<path>: <what> '<key or tensor>': <problem>"). The rules are listed in
// docs/formats.md ("GGUF"). Tensors are exposed as raw bytes + ggml type + dims; conversion happens elsewhere.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "io/atomic_file.h"

namespace lmtune {

// Metadata value types (gguf_type in ggml's gguf.h).
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "u8", ..., "array"

// Tensor element types (ggml_type). Every id ggml defines today; the removed ones (4, 5, 31-33, 36-38) are refused.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};
struct GgmlTypeInfo {
  std::string_view name;  // "F32", "Q4_K", ... (ggml_type_name in upper case, as gguf-py's GGMLQuantizationType)
  int64_t block_elems;    // elements per block along dims[0]
  size_t block_bytes;
};
// nullopt for an id ggml does not define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType t);

// One metadata value. Integers keep their exact value whatever their width (`integer` holds signed types
// sign-extended and unsigned ones as is), floats their value widened to double (an f32 round-trips exactly).
struct GgufValue {
  GgufType type = GgufType::u32;
  GgufType elem_type = GgufType::u8;  // arrays only
  uint64_t integer = 0;               // u8..i64 and bool
  double real = 0;                    // f32, f64
  std::string str;                    // string (raw bytes; not checked for UTF-8, as llama.cpp does not)
  std::vector<GgufValue> items;       // array

  static GgufValue of(GgufType type, uint64_t integer);  // an integer type or bool
  static GgufValue of_u32(uint32_t v) { return of(GgufType::u32, v); }
  static GgufValue of_i32(int32_t v) { return of(GgufType::i32, uint64_t(int64_t(v))); }
  static GgufValue of_u64(uint64_t v) { return of(GgufType::u64, v); }
  static GgufValue of_bool(bool v) { return of(GgufType::boolean, v ? 1 : 0); }
  static GgufValue of_f32(float v);
  static GgufValue of_f64(double v);
  static GgufValue of_string(std::string v);
  static GgufValue of_array(GgufType elem_type, std::vector<GgufValue> items);
  static GgufValue of_strings(const std::vector<std::string>& v);
  static GgufValue of_f32s(const std::vector<float>& v);
  static GgufValue of_i32s(const std::vector<int32_t>& v);

  bool is_integer() const;  // u8..i64 (not bool)
  bool is_signed() const;
  bool operator==(const GgufValue&) const = default;
};

// A tensor inside a mapped file; `data` stays valid while the GgufFile lives (moves keep it valid).
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  uint64_t offset = 0;        // from the start of the data section
  std::span<const std::byte> data;

  // Row-major shape (dims reversed): a [rows, cols] matrix has dims {cols, rows}.
  Shape shape() const;
  int64_t numel() const;
};

// A validated, memory-mapped GGUF file (version 2 or 3, little-endian).
class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return map_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts in the file

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // Typed getters: a missing key (for the non-optional ones) or one of another type throws FileError naming the
  // file and key. Integer getters accept every integer type whose value fits.
  int64_t get_int(std::string_view key) const;
  std::optional<int64_t> opt_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // f32, f64 or an integer
  std::optional<double> opt_float(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;
  // Arrays of one element type; `expect` checks the element type (nullopt: any integer type for int arrays).
  const std::vector<GgufValue>& get_array(std::string_view key, std::optional<GgufType> expect) const;
  std::vector<std::string> get_strings(std::string_view key) const;
  std::vector<int64_t> get_ints(std::string_view key) const;
  std::vector<float> get_floats(std::string_view key) const;  // f32 elements
  [[noreturn]] void fail_key(std::string_view key, const std::string& problem) const;

  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // throws FileError naming the file and tensor

 private:
  MappedFile map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> key_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// What the writer needs of a tensor: its name, type, ggml-order dims; the bytes come from `data` or a fill callback.
struct GgufTensorToWrite {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;
  std::span<const std::byte> data;  // write_gguf only: exactly gguf_tensor_bytes(type, dims) bytes
};
using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

// Bytes of a tensor of `type` with ggml-order `dims`; throws ShapeError when dims[0] is not a multiple of the block.
size_t gguf_tensor_bytes(GgmlType type, std::span<const int64_t> dims);

// Writes a GGUF v3 file atomically: the metadata in the given order (general.alignment, if present, must be a
// power-of-two u32 and sets the alignment; otherwise 32), the tensor infos in the given order, each tensor's data
// at the next aligned offset (zero padding). Duplicate keys or names, names over 63 bytes, more than 4 dims and
// data of the wrong size throw.
void write_gguf(const std::filesystem::path& path, const GgufMetadata& metadata,
                std::span<const GgufTensorToWrite> tensors);
// The same file, with tensor i's bytes written by fill(i, out) in file order (one tensor in memory at a time).
void write_gguf_streamed(const std::filesystem::path& path, const GgufMetadata& metadata,
                         std::span<const GgufTensorToWrite> tensors,
                         const std::function<void(size_t, std::span<std::byte>)>& fill);
// The file contents in memory (tests).
std::vector<std::byte> serialize_gguf(const GgufMetadata& metadata, std::span<const GgufTensorToWrite> tensors);

// The GGUF file a --model argument names: the path itself when it is a .gguf file, or the one .gguf file in a
// directory that holds no .safetensors file; nullopt otherwise (a HF model directory). A directory with several
// .gguf files and no safetensors throws FileError listing them.
std::optional<std::filesystem::path> find_gguf_model(const std::filesystem::path& path);

}  // namespace lmtune
