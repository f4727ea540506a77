// A small RAII wrapper over the HDF5 C API for the files lmtune writes for itself (tokenized dataset caches,
// checkpoints, metrics): groups, n-d datasets of f32/i32/i64/u8/u16, appendable 1-D datasets for metrics
// rows, string and scalar attributes, CRC-32 seals against silent damage, and an atomic save helper. HDF5's
// own error printing is turned off; every failure throws FileError("<file>: <object>: <problem>"). Conventions
// are in docs/formats.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/shape.h"

namespace lmtune {

// Element types of lmtune's HDF5 datasets (stored little-endian).
enum class H5ElemType { f32, i32, i64, u8, u16 };
std::string_view h5_elem_type_name(H5ElemType t);

template <class T>
concept H5Element = std::is_same_v<T, float> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, uint8_t> || std::is_same_v<T, uint16_t>;

class Hdf5File {
 public:
  // Creates (truncating) a file for writing.
  static Hdf5File create(const std::filesystem::path& path);
  // Opens an existing file; throws FileError if it is missing, not HDF5, or damaged.
  static Hdf5File open(const std::filesystem::path& path, bool writable = false);

  Hdf5File(Hdf5File&& other) noexcept;
  Hdf5File& operator=(Hdf5File&& other) noexcept;
  Hdf5File(const Hdf5File&) = delete;
  Hdf5File& operator=(const Hdf5File&) = delete;
  ~Hdf5File();

  const std::filesystem::path& path() const { return path_; }
  // Flushes and closes; further calls throw. Errors while closing are reported (the destructor ignores them).
  void close();
  void flush();

  // Object paths are absolute or relative to the root ("meta/tokenizer" == "/meta/tokenizer").
  void create_group(const std::string& group);  // creates missing parents; existing groups are fine
  bool exists(const std::string& object) const;  // group or dataset
  bool is_dataset(const std::string& object) const;
  std::vector<std::string> list(const std::string& group = "/") const;  // member names, sorted

  // Writes a new dataset (parents created). data.size() must equal numel(shape); shape [] is a scalar.
  template <H5Element T>
  void write(const std::string& dataset, std::span<const T> data, const Shape& shape);
  template <H5Element T>
  void write(const std::string& dataset, const std::vector<T>& data, const Shape& shape) {
    write(dataset, std::span<const T>(data), shape);
  }
  // Reads a whole dataset; its stored type must be T. `shape_out`, when given, receives its shape. A dataset
  // with a "crc32" attribute (see seal()) must match it, or the read throws naming the dataset.
  template <H5Element T>
  std::vector<T> read(const std::string& dataset, Shape* shape_out = nullptr) const;
  Shape shape(const std::string& dataset) const;
  H5ElemType elem_type(const std::string& dataset) const;

  // Appendable 1-D datasets (chunked, unlimited length): metrics columns, growing id lists.
  template <H5Element T>
  void create_appendable(const std::string& dataset, size_t chunk_elements = 1024);
  template <H5Element T>
  void append(const std::string& dataset, std::span<const T> values);
  template <H5Element T>
  void append(const std::string& dataset, const std::vector<T>& values) {
    append(dataset, std::span<const T>(values));
  }

  // Attributes on a group or dataset ("/" is the root group). Setting replaces an existing attribute.
  void set_attr(const std::string& object, const std::string& name, const std::string& value);
  void set_attr(const std::string& object, const std::string& name, const char* value) {
    set_attr(object, name, std::string(value));
  }
  void set_attr(const std::string& object, const std::string& name, double value);
  void set_attr(const std::string& object, const std::string& name, int64_t value);
  bool has_attr(const std::string& object, const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;
  double attr_double(const std::string& object, const std::string& name) const;  // float or integer attributes
  int64_t attr_int(const std::string& object, const std::string& name) const;     // integer attributes

  // Seals a finished file: each dataset gets attribute "crc32" (CRC-32 of its little-endian element bytes) and
  // the root gets "attrs_crc32" (CRC-32 of every other attribute of every group and dataset, as text). Flipped
  // bytes in data or metadata then fail verify_seal() instead of being read as values.
  void seal();
  // Checks every dataset and the attributes against the seal; throws FileError naming the file and the damaged
  // dataset (or "attributes") when they differ or a checksum is missing.
  void verify_seal() const;

 private:
  Hdf5File(std::filesystem::path path, int64_t id) : path_(std::move(path)), id_(id) {}
  int64_t file_id() const;
  template <H5Element T>
  std::vector<T> read_unchecked(const std::string& dataset, Shape* shape_out) const;
  uint32_t dataset_crc(const std::string& dataset) const;
  std::vector<std::string> all_objects() const;  // every group and dataset, "/" first, depth-first
  std::string attributes_text(const std::string& object) const;
  uint32_t attributes_crc() const;
  std::filesystem::path path_;
  int64_t id_ = -1;  // hid_t
};

// Writes an HDF5 file atomically: `fill` populates a new file at a temporary path next to `path`, which is
// then closed, fsynced and renamed over `path`. On any exception the temporary file is removed and the
// previous file at `path` is untouched.
void save_hdf5_atomic(const std::filesystem::path& path, const std::function<void(Hdf5File&)>& fill);

}  // namespace lmtune
