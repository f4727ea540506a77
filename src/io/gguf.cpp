// GGUF reader and writer (see gguf.h). The layout (ggml's docs/gguf.md): magic "GGUF", u32 version, u64 tensor
// count, u64 metadata count, the key/value pairs, the tensor infos, padding to the alignment, the data section.
// Strings are a u64 length and bytes; arrays a u32 element type, a u64 count and the elements.
#include "io/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include "core/error.h"
#include "io/json_util.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxKeyBytes = 65535;           // the spec's limit on key length
constexpr size_t kMaxTensorNameBytes = 63;       // GGML_MAX_NAME - 1: llama.cpp refuses longer names
constexpr int kMaxArrayDepth = 8;                // arrays of arrays ... nested deeper are refused
constexpr uint64_t kMaxMetadataItems = 1 << 23;  // array elements in all: bounds memory (~80 bytes an item)
constexpr int64_t kMaxDim = int64_t(1) << 50;

struct TypeRow {
  uint32_t id;
  GgmlTypeInfo info;
};
// Block sizes as ggml-common.h defines them (type_traits in ggml.c).
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},      {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},      {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 36}},
    {10, {"Q2_K", 256, 84}},    {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},   {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},   {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},        {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},   {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
};

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// Fixed size in the file of a scalar value type, 0 for string and array.
size_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64: return 8;
    case GgufType::string:
    case GgufType::array: return 0;
  }
  return 0;
}
// The least bytes one value of type t takes in the file: bounds counts before anything is allocated.
size_t min_value_bytes(GgufType t) {
  if (t == GgufType::string) return 8;
  if (t == GgufType::array) return 12;
  return scalar_bytes(t);
}

bool valid_value_type(uint32_t t) { return t <= uint32_t(GgufType::f64); }

// Reads the header sequentially; every read is bounds-checked and failures name what was being read.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const fs::path& path) : b_(bytes), path_(path) {}

  [[noreturn]] void fail(const std::string& what, const std::string& problem) const {
    throw FileError(path_.string() + ": " + what + ": " + problem);
  }
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  void need(size_t n, const std::string& what) const {
    if (n > left())
      fail(what, "file truncated (needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                     ", the file has " + std::to_string(b_.size()) + ")");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what, uint64_t max_len) {
    uint64_t n = read<uint64_t>(what + " (string length)");
    if (n > max_len)
      fail(what, "string length " + std::to_string(n) + " exceeds the limit " + std::to_string(max_len));
    need(size_t(n), what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  // A count of items that each take at least `min_bytes`: more than the rest of the file can hold is refused
  // before anything is allocated for them.
  uint64_t read_count(const std::string& what, size_t min_bytes) {
    uint64_t n = read<uint64_t>(what);
    if (min_bytes > 0 && n > left() / min_bytes)
      fail(what, std::to_string(n) + " is more than the rest of the file can hold (" + std::to_string(left()) +
                     " bytes left)");
    return n;
  }

  GgufValue read_value(GgufType type, const std::string& what, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::u8: v.integer = read<uint8_t>(what); break;
      case GgufType::i8: v.integer = uint64_t(int64_t(read<int8_t>(what))); break;
      case GgufType::u16: v.integer = read<uint16_t>(what); break;
      case GgufType::i16: v.integer = uint64_t(int64_t(read<int16_t>(what))); break;
      case GgufType::u32: v.integer = read<uint32_t>(what); break;
      case GgufType::i32: v.integer = uint64_t(int64_t(read<int32_t>(what))); break;
      case GgufType::u64: v.integer = read<uint64_t>(what); break;
      case GgufType::i64: v.integer = read<uint64_t>(what); break;
      case GgufType::f32: v.real = double(read<float>(what)); break;
      case GgufType::f64: v.real = read<double>(what); break;
      case GgufType::boolean: {
        uint8_t x = read<uint8_t>(what);
        if (x > 1) fail(what, "bool value " + std::to_string(x) + " is neither 0 nor 1");
        v.integer = x;
        break;
      }
      case GgufType::string: v.str = read_string(what, left()); break;
      case GgufType::array: read_array(v, what, depth); break;
    }
    return v;
  }

 private:
  void read_array(GgufValue& v, const std::string& what, int depth) {
    if (depth >= kMaxArrayDepth) fail(what, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    uint32_t et = read<uint32_t>(what + " (array element type)");
    if (!valid_value_type(et)) fail(what, "unknown array element type " + std::to_string(et));
    v.elem_type = GgufType(et);
    uint64_t n = read_count(what + " (array length)", min_value_bytes(v.elem_type));
    if (n > kMaxMetadataItems - items_)
      fail(what, "array of " + std::to_string(n) + " elements exceeds the limit of " +
                     std::to_string(kMaxMetadataItems) + " metadata array elements in all");
    items_ += n;
    v.items.reserve(size_t(n));
    for (uint64_t i = 0; i < n; ++i) v.items.push_back(read_value(v.elem_type, what, depth + 1));
  }

  std::span<const std::byte> b_;
  const fs::path& path_;
  size_t pos_ = 0;
  uint64_t items_ = 0;
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Element count and byte size of a tensor; nullopt-like failure through `problem`.
std::string tensor_size(GgmlType type, std::span<const int64_t> dims, uint64_t& elems, uint64_t& bytes) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  elems = 1;
  for (int64_t d : dims)
    if (d < 0 || d > kMaxDim || !checked_mul(elems, uint64_t(d), elems))
      return "dimensions overflow the element count";
  if (!dims.empty() && dims[0] % info.block_elems != 0)
    return "dims[0] = " + std::to_string(dims[0]) + " is not a multiple of " + std::string(info.name) +
           "'s block of " + std::to_string(info.block_elems);
  if (!checked_mul(elems / uint64_t(info.block_elems), info.block_bytes, bytes)) return "byte size overflows";
  return {};
}

std::string dims_str(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) < std::size(names) ? names[uint32_t(t)] : "?";
}

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const TypeRow& r : kTypes)
    if (r.id == id) return r.info;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) {
  for (const TypeRow& r : kTypes)
    if (r.id == uint32_t(t)) return r.info;
  throw ShapeError("unknown ggml type " + std::to_string(uint32_t(t)));
}

// ---- GgufValue ------------------------------------------------------------------------------------------------
GgufValue GgufValue::of(GgufType type, uint64_t integer) {
  GgufValue v;
  v.type = type;
  v.integer = integer;
  return v;
}
GgufValue GgufValue::of_f32(float x) {
  GgufValue v;
  v.type = GgufType::f32;
  v.real = double(x);
  return v;
}
GgufValue GgufValue::of_f64(double x) {
  GgufValue v;
  v.type = GgufType::f64;
  v.real = x;
  return v;
}
GgufValue GgufValue::of_string(std::string s) {
  GgufValue v;
  v.type = GgufType::string;
  v.str = std::move(s);
  return v;
}
GgufValue GgufValue::of_array(GgufType elem_type, std::vector<GgufValue> items) {
  GgufValue v;
  v.type = GgufType::array;
  v.elem_type = elem_type;
  v.items = std::move(items);
  return v;
}
GgufValue GgufValue::of_strings(const std::vector<std::string>& strings) {
  std::vector<GgufValue> items;
  items.reserve(strings.size());
  for (const std::string& s : strings) items.push_back(of_string(s));
  return of_array(GgufType::string, std::move(items));
}
GgufValue GgufValue::of_f32s(const std::vector<float>& values) {
  std::vector<GgufValue> items;
  items.reserve(values.size());
  for (float x : values) items.push_back(of_f32(x));
  return of_array(GgufType::f32, std::move(items));
}
GgufValue GgufValue::of_i32s(const std::vector<int32_t>& values) {
  std::vector<GgufValue> items;
  items.reserve(values.size());
  for (int32_t x : values) items.push_back(of_i32(x));
  return of_array(GgufType::i32, std::move(items));
}
bool GgufValue::is_integer() const {
  return type != GgufType::boolean && scalar_bytes(type) > 0 && type != GgufType::f32 && type != GgufType::f64;
}
bool GgufValue::is_signed() const {
  return type == GgufType::i8 || type == GgufType::i16 || type == GgufType::i32 || type == GgufType::i64;
}

// ---- GgufTensor -----------------------------------------------------------------------------------------------
Shape GgufTensor::shape() const { return Shape(dims.rbegin(), dims.rend()); }
int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ---- GgufFile -------------------------------------------------------------------------------------------------
GgufFile::GgufFile(const fs::path& path) : map_(path) {
  Reader r(map_.bytes(), map_.path());
  const uint32_t magic = r.read<uint32_t>("header (magic)");
  if (magic != kMagic) r.fail("header", "not a GGUF file (the magic bytes are not \"GGUF\")");
  version_ = r.read<uint32_t>("header (version)");
  if (version_ == 1)
    r.fail("header", "GGUF version 1 is not supported (re-convert the model with a current llama.cpp)");
  if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3)
    r.fail("header", "big-endian GGUF files are not supported");
  if (version_ != 2 && version_ != 3) r.fail("header", "unsupported GGUF version " + std::to_string(version_));
  const uint64_t n_tensors = r.read_count("header (tensor count)", 8 + 1 + 4 + 8 + 4 + 8);
  const uint64_t n_kv = r.read_count("header (metadata count)", 8 + 1 + 4);

  metadata_.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string at = "metadata entry " + std::to_string(i);
    std::string key = r.read_string(at + " (key)", kMaxKeyBytes);
    if (key.empty()) r.fail(at, "empty key");
    if (find_invalid_utf8(key) != std::string_view::npos) r.fail(at, "key is not valid UTF-8");
    const std::string what = "key '" + key + "'";
    if (key_index_.count(key)) r.fail(what, "duplicate key");
    const uint32_t type = r.read<uint32_t>(what + " (value type)");
    if (!valid_value_type(type)) r.fail(what, "unknown value type " + std::to_string(type));
    GgufValue v = r.read_value(GgufType(type), what, 0);
    key_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::u32)
      fail_key("general.alignment", "must be a u32, not " + std::string(gguf_type_name(a->type)));
    if (a->integer == 0 || !std::has_single_bit(a->integer))
      fail_key("general.alignment", std::to_string(a->integer) + " is not a power of two");
    alignment_ = a->integer;
  }

  tensors_.reserve(size_t(n_tensors));
  std::vector<uint64_t> sizes;  // bytes of each tensor; placed once the data section is known
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string at = "tensor info " + std::to_string(i);
    GgufTensor t;
    t.name = r.read_string(at + " (name)", kMaxTensorNameBytes);
    if (t.name.empty()) r.fail(at, "empty tensor name");
    if (find_invalid_utf8(t.name) != std::string_view::npos) r.fail(at, "tensor name is not valid UTF-8");
    const std::string what = "tensor '" + t.name + "'";
    if (tensor_index_.count(t.name)) r.fail(what, "duplicate tensor name");
    const uint32_t n_dims = r.read<uint32_t>(what + " (dimension count)");
    if (n_dims < 1 || n_dims > 4) r.fail(what, std::to_string(n_dims) + " dimensions (1 to 4 are allowed)");
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = r.read<uint64_t>(what + " (dimensions)");
      if (dim > uint64_t(kMaxDim)) r.fail(what, "dimension " + std::to_string(dim) + " is too large");
      t.dims.push_back(int64_t(dim));
    }
    const uint32_t type = r.read<uint32_t>(what + " (type)");
    if (!ggml_type_info(type)) r.fail(what, "unknown ggml type " + std::to_string(type));
    t.type = GgmlType(type);
    t.offset = r.read<uint64_t>(what + " (offset)");
    if (t.offset % alignment_ != 0)
      r.fail(what, "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                       std::to_string(alignment_));
    uint64_t elems = 0, bytes = 0;
    if (std::string problem = tensor_size(t.type, t.dims, elems, bytes); !problem.empty())
      r.fail(what, dims_str(t.dims) + " " + std::string(ggml_type_info(t.type).name) + ": " + problem);
    sizes.push_back(bytes);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  data_offset_ = align_up(r.pos(), alignment_);
  const uint64_t file_size = map_.size();
  if (!tensors_.empty() && data_offset_ > file_size)
    r.fail("data section", "file truncated before the data section (starts at " + std::to_string(data_offset_) +
                               ", the file has " + std::to_string(file_size) + " bytes)");
  const uint64_t data_size = tensors_.empty() ? 0 : file_size - data_offset_;
  std::vector<const GgufTensor*> by_offset;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    const uint64_t bytes = sizes[i];
    if (t.offset > data_size || bytes > data_size - t.offset)
      r.fail("tensor '" + t.name + "'", "data [" + std::to_string(t.offset) + ", " +
                                            std::to_string(t.offset + bytes) + ") ends past the data section of " +
                                            std::to_string(data_size) + " bytes (file truncated?)");
    t.data = map_.bytes().subspan(size_t(data_offset_ + t.offset), size_t(bytes));
    by_offset.push_back(&t);
  }
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& prev = *by_offset[i - 1];
    const GgufTensor& cur = *by_offset[i];
    if (!prev.data.empty() && !cur.data.empty() && cur.offset < prev.offset + prev.data.size())
      r.fail("tensor '" + cur.name + "'", "data at offset " + std::to_string(cur.offset) + " overlaps tensor '" +
                                              prev.name + "' [" + std::to_string(prev.offset) + ", " +
                                              std::to_string(prev.offset + prev.data.size()) + ")");
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(std::string(key));
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

void GgufFile::fail_key(std::string_view key, const std::string& problem) const {
  throw FileError(path().string() + ": key '" + std::string(key) + "': " + problem);
}

namespace {
std::string type_desc(const GgufValue& v) {
  if (v.type == GgufType::array) return "an array of " + std::string(gguf_type_name(v.elem_type));
  return "a " + std::string(gguf_type_name(v.type));
}
// An integer value as int64, if it fits.
std::optional<int64_t> int_value(const GgufValue& v) {
  if (!v.is_integer()) return std::nullopt;
  if (!v.is_signed() && v.integer > uint64_t(INT64_MAX)) return std::nullopt;
  return int64_t(v.integer);
}
}  // namespace

std::optional<int64_t> GgufFile::opt_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto i = int_value(*v);
  if (!i)
    fail_key(key, v->is_integer() ? "value does not fit a signed 64-bit integer"
                                  : "expected an integer, found " + type_desc(*v));
  return i;
}
int64_t GgufFile::get_int(std::string_view key) const {
  auto v = opt_int(key);
  if (!v) fail_key(key, "missing");
  return *v;
}
std::optional<double> GgufFile::opt_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type == GgufType::f32 || v->type == GgufType::f64) return v->real;
  if (auto i = int_value(*v)) return double(*i);
  fail_key(key, "expected a number, found " + type_desc(*v));
}
double GgufFile::get_float(std::string_view key) const {
  auto v = opt_float(key);
  if (!v) fail_key(key, "missing");
  return *v;
}
std::optional<bool> GgufFile::opt_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::boolean) fail_key(key, "expected a bool, found " + type_desc(*v));
  return v->integer != 0;
}
std::optional<std::string> GgufFile::opt_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::string) fail_key(key, "expected a string, found " + type_desc(*v));
  return v->str;
}
std::string GgufFile::get_string(std::string_view key) const {
  auto v = opt_string(key);
  if (!v) fail_key(key, "missing");
  return *v;
}
const std::vector<GgufValue>& GgufFile::get_array(std::string_view key, std::optional<GgufType> expect) const {
  const GgufValue* v = find(key);
  if (!v) fail_key(key, "missing");
  if (v->type != GgufType::array) fail_key(key, "expected an array, found " + type_desc(*v));
  const bool ok = expect ? v->elem_type == *expect : GgufValue::of(v->elem_type, 0).is_integer();
  if (!ok)
    fail_key(key, "expected an array of " + std::string(expect ? gguf_type_name(*expect) : "integers") + ", found " +
                      type_desc(*v));
  return v->items;
}
std::vector<std::string> GgufFile::get_strings(std::string_view key) const {
  std::vector<std::string> out;
  for (const GgufValue& v : get_array(key, GgufType::string)) out.push_back(v.str);
  return out;
}
std::vector<int64_t> GgufFile::get_ints(std::string_view key) const {
  std::vector<int64_t> out;
  for (const GgufValue& v : get_array(key, std::nullopt)) {
    auto i = int_value(v);
    if (!i) fail_key(key, "element " + std::to_string(out.size()) + " does not fit a signed 64-bit integer");
    out.push_back(*i);
  }
  return out;
}
std::vector<float> GgufFile::get_floats(std::string_view key) const {
  std::vector<float> out;
  for (const GgufValue& v : get_array(key, GgufType::f32)) out.push_back(float(v.real));
  return out;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw FileError(path().string() + ": tensor '" + std::string(name) + "' not found");
  return *t;
}

// ---- writer ---------------------------------------------------------------------------------------------------
size_t gguf_tensor_bytes(GgmlType type, std::span<const int64_t> dims) {
  uint64_t elems = 0, bytes = 0;
  if (std::string problem = tensor_size(type, dims, elems, bytes); !problem.empty())
    throw ShapeError("GGUF tensor " + dims_str(dims) + " " + std::string(ggml_type_info(type).name) + ": " + problem);
  return size_t(bytes);
}

namespace {

class Out {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    buf.insert(buf.end(), b, b + n);
  }
  template <class T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void value(const GgufValue& v, const std::string& key) {
    switch (v.type) {
      case GgufType::u8:
      case GgufType::i8:
      case GgufType::boolean: put<uint8_t>(uint8_t(v.integer)); break;
      case GgufType::u16:
      case GgufType::i16: put<uint16_t>(uint16_t(v.integer)); break;
      case GgufType::u32:
      case GgufType::i32: put<uint32_t>(uint32_t(v.integer)); break;
      case GgufType::u64:
      case GgufType::i64: put<uint64_t>(v.integer); break;
      case GgufType::f32: put<float>(float(v.real)); break;
      case GgufType::f64: put<double>(v.real); break;
      case GgufType::string: string(v.str); break;
      case GgufType::array:
        put<uint32_t>(uint32_t(v.elem_type));
        put<uint64_t>(v.items.size());
        for (const GgufValue& item : v.items) {
          if (item.type != v.elem_type)
            throw ShapeError("write_gguf: key '" + key + "': array of " + std::string(gguf_type_name(v.elem_type)) +
                             " holds a " + std::string(gguf_type_name(item.type)));
          value(item, key);
        }
        break;
    }
  }
  std::vector<std::byte> buf;
};

struct Layout {
  std::vector<std::byte> header;  // everything before the data section, padding included
  std::vector<uint64_t> offsets;  // of each tensor in the data section
  std::vector<size_t> sizes;
  uint64_t alignment = kDefaultAlignment;
};

Layout layout(const GgufMetadata& metadata, std::span<const GgufTensorToWrite> tensors, const fs::path& path) {
  auto fail = [&](const std::string& problem) { throw FileError(path.string() + ": write_gguf: " + problem); };
  Layout l;
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors.size());
  o.put<uint64_t>(metadata.size());
  std::set<std::string> keys;
  for (const auto& [key, value] : metadata) {
    if (key.empty() || key.size() > kMaxKeyBytes || find_invalid_utf8(key) != std::string_view::npos)
      fail("invalid key '" + key + "'");
    if (!keys.insert(key).second) fail("duplicate key '" + key + "'");
    if (key == "general.alignment") {
      if (value.type != GgufType::u32 || value.integer == 0 || !std::has_single_bit(value.integer))
        fail("general.alignment must be a power-of-two u32");
      l.alignment = value.integer;
    }
    o.string(key);
    o.put<uint32_t>(uint32_t(value.type));
    o.value(value, key);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensorToWrite& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxTensorNameBytes || find_invalid_utf8(t.name) != std::string_view::npos)
      fail("invalid tensor name '" + t.name + "' (1 to 63 bytes of UTF-8)");
    if (!names.insert(t.name).second) fail("duplicate tensor name '" + t.name + "'");
    if (t.dims.empty() || t.dims.size() > 4) fail("tensor '" + t.name + "' needs 1 to 4 dims");
    const size_t bytes = gguf_tensor_bytes(t.type, t.dims);
    o.string(t.name);
    o.put<uint32_t>(uint32_t(t.dims.size()));
    for (int64_t d : t.dims) o.put<uint64_t>(uint64_t(d));
    o.put<uint32_t>(uint32_t(t.type));
    o.put<uint64_t>(offset);
    l.offsets.push_back(offset);
    l.sizes.push_back(bytes);
    offset = align_up(offset + bytes, l.alignment);
  }
  o.buf.resize(size_t(align_up(o.buf.size(), l.alignment)));
  l.header = std::move(o.buf);
  return l;
}

// Writes the header, then each tensor's bytes (from fill) and its padding, to `sink`.
template <class Sink>
void emit(const Layout& l, std::span<const GgufTensorToWrite> tensors,
          const std::function<void(size_t, std::span<std::byte>)>& fill, Sink&& sink) {
  sink(std::span<const std::byte>(l.header));
  std::vector<std::byte> buf;
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (l.offsets[i] > at) {
      buf.assign(size_t(l.offsets[i] - at), std::byte{0});
      sink(std::span<const std::byte>(buf));
    }
    buf.assign(l.sizes[i], std::byte{0});
    fill(i, buf);
    sink(std::span<const std::byte>(buf));
    at = l.offsets[i] + l.sizes[i];
  }
}

std::function<void(size_t, std::span<std::byte>)> copy_data(std::span<const GgufTensorToWrite> tensors,
                                                            const Layout& l, const fs::path& path) {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].data.size() != l.sizes[i])
      throw FileError(path.string() + ": write_gguf: tensor '" + tensors[i].name + "' has " +
                      std::to_string(tensors[i].data.size()) + " bytes of data, its dims and type need " +
                      std::to_string(l.sizes[i]));
  return [tensors](size_t i, std::span<std::byte> out) {
    std::copy(tensors[i].data.begin(), tensors[i].data.end(), out.begin());
  };
}

}  // namespace

void write_gguf_streamed(const fs::path& path, const GgufMetadata& metadata,
                         std::span<const GgufTensorToWrite> tensors,
                         const std::function<void(size_t, std::span<std::byte>)>& fill) {
  Layout l = layout(metadata, tensors, path);
  AtomicFileWriter w(path);
  emit(l, tensors, fill, [&](std::span<const std::byte> b) { w.write(b); });
  w.commit();
}

void write_gguf(const fs::path& path, const GgufMetadata& metadata, std::span<const GgufTensorToWrite> tensors) {
  Layout l = layout(metadata, tensors, path);
  write_gguf_streamed(path, metadata, tensors, copy_data(tensors, l, path));
}

std::vector<std::byte> serialize_gguf(const GgufMetadata& metadata, std::span<const GgufTensorToWrite> tensors) {
  Layout l = layout(metadata, tensors, "<memory>");
  std::vector<std::byte> out;
  emit(l, tensors, copy_data(tensors, l, "<memory>"),
       [&](std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

std::optional<fs::path> find_gguf_model(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".gguf") return path;
    return std::nullopt;
  }
  std::vector<fs::path> ggufs;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const fs::path& p = entry.path();
    if (p.extension() == ".safetensors" || p.filename() == "config.json") return std::nullopt;
    if (p.extension() == ".gguf") ggufs.push_back(p);
  }
  if (ggufs.empty()) return std::nullopt;
  if (ggufs.size() > 1) {
    std::sort(ggufs.begin(), ggufs.end());
    std::string list;
    for (const fs::path& p : ggufs) list += (list.empty() ? "" : ", ") + p.filename().string();
    throw FileError(path.string() + ": the directory holds several GGUF files (" + list +
                    "); pass one of them as the model");
  }
  return ggufs[0];
}

}  // namespace lmtune
