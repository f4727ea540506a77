// Safetensors reading (memory-mapped, single file or sharded with model.safetensors.index.json) and writing
// (atomic), validated as strictly as the reference implementation (the Rust `safetensors` crate); the rules
// are listed in docs/formats.md. Tensors are exposed as raw little-endian bytes + dtype + shape; conversion
// to lmtune tensors happens elsewhere. Every problem throws FileError("<path>: <problem>").
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "io/atomic_file.h"

namespace lmtune {

// Every dtype the format defines, in the reference's order of increasing alignment (the writer sorts
// tensors by descending position in this list, then by name, as the reference does).
enum class StDType : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

std::string_view st_dtype_name(StDType t);             // "F32", "BF16", ...
std::optional<StDType> parse_st_dtype(std::string_view name);  // exact, case-sensitive names only
size_t st_dtype_bits(StDType t);                       // F4: 4, F6_*: 6, BOOL: 8, ...
// The lmtune dtype for F32, F16, BF16 and I32; nullopt for the others.
std::optional<DType> to_lmtune_dtype(StDType t);
StDType to_st_dtype(DType t);

// One tensor inside a mapped file. `data` stays valid while the SafetensorsFile that produced it lives.
struct SafetensorsTensor {
  std::string name;
  StDType st_dtype = StDType::F32;
  Shape shape;
  std::span<const std::byte> data;
  std::filesystem::path file;  // for error messages

  int64_t numel() const;
  // The lmtune dtype; throws FileError "<file>: unsupported dtype F64 in tensor 'name' ..." for the others.
  DType dtype() const;
  // Elements widened to f32 (F32, F16, BF16 only; other dtypes throw as dtype() does).
  std::vector<float> to_f32() const;
};

// A validated, memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return map_.path(); }
  // Tensors in file order (ascending data offsets).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  const SafetensorsTensor& at(std::string_view name) const;  // throws FileError naming the file and tensor
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // The header's "__metadata__" (empty when absent or null).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t header_size() const { return header_size_; }  // N, the JSON header's length in bytes

 private:
  MappedFile map_;
  size_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: one .safetensors file, or the shards a model.safetensors.index.json names.
class SafetensorsCheckpoint {
 public:
  // `path` is a .safetensors file, an index .json file, or a directory holding model.safetensors.index.json
  // or model.safetensors (the index wins when both exist).
  explicit SafetensorsCheckpoint(const std::filesystem::path& path);

  // Tensor names, sorted.
  std::vector<std::string> names() const;
  size_t size() const { return by_name_.size(); }
  const SafetensorsTensor* find(std::string_view name) const;
  const SafetensorsTensor& at(std::string_view name) const;  // throws FileError naming the checkpoint
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // The index's "metadata" object flattened to strings (numbers such as total_size are printed); empty for
  // a single file.
  const std::map<std::string, std::string>& index_metadata() const { return index_metadata_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void open_index(const std::filesystem::path& index_path);
  std::filesystem::path path_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, const SafetensorsTensor*> by_name_;
  std::map<std::string, std::string> index_metadata_;
};

struct TensorToWrite {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
  std::span<const std::byte> data;  // little-endian, row-major; must be numel × dtype size bytes
};

// The complete file contents as the reference writes them: tensors sorted by descending dtype alignment then
// name, compact JSON header ("__metadata__" first, then each tensor's dtype, shape, data_offsets) padded
// with spaces to a multiple of 8 bytes so every tensor's data is aligned in a mapped file.
// `path_for_errors` only names the destination in error messages.
std::vector<std::byte> serialize_safetensors(std::span<const TensorToWrite> tensors,
                                             const std::map<std::string, std::string>& metadata = {},
                                             const std::filesystem::path& path_for_errors = "<memory>");
// Writes serialize_safetensors(...) to `path` atomically (see AtomicFileWriter).
void write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor whose bytes are made while its file is written.
struct TensorToStream {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
};
// The same file as write_safetensors, with tensor i's bytes written by fill(i, out) (out: numel × dtype size
// bytes), called once per tensor in file order: one tensor's bytes in memory at a time.
void write_safetensors_streamed(const std::filesystem::path& path, std::span<const TensorToStream> tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t, std::span<std::byte>)>& fill);

// f32 <-> f16 <-> bf16 (and i32) conversions of raw little-endian element bytes (round to nearest even).
// Throws ShapeError when the byte count is not a multiple of the element size.
std::vector<float> convert_to_f32(std::span<const std::byte> bytes, DType dtype);
std::vector<std::byte> convert_from_f32(std::span<const float> values, DType dtype);
std::vector<std::byte> convert_dtype(std::span<const std::byte> bytes, DType from, DType to);

}  // namespace lmtune
