// Safetensors reader, writer and element conversions. Validation follows the Rust `safetensors` crate
// (read_metadata + Metadata::validate) and adds the checks it defers or leaves implicit: the header must
// start with '{', duplicate keys are rejected instead of last-wins, and offsets past the data section get
// their own message. All size arithmetic is overflow-checked.
#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_util.h"

namespace lmtune {
namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this host");

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference's MAX_HEADER_SIZE

struct DTypeInfo {
  StDType dtype;
  std::string_view name;
  size_t bits;
};
constexpr std::array<DTypeInfo, 22> kDTypes = {{
    {StDType::BOOL, "BOOL", 8},       {StDType::F4, "F4", 4},
    {StDType::F6_E2M3, "F6_E2M3", 6}, {StDType::F6_E3M2, "F6_E3M2", 6},
    {StDType::U8, "U8", 8},           {StDType::I8, "I8", 8},
    {StDType::F8_E5M2, "F8_E5M2", 8}, {StDType::F8_E4M3, "F8_E4M3", 8},
    {StDType::F8_E8M0, "F8_E8M0", 8}, {StDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {StDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {StDType::I16, "I16", 16},        {StDType::U16, "U16", 16},
    {StDType::F16, "F16", 16},        {StDType::BF16, "BF16", 16},
    {StDType::I32, "I32", 32},        {StDType::U32, "U32", 32},
    {StDType::F32, "F32", 32},        {StDType::C64, "C64", 64},
    {StDType::F64, "F64", 64},        {StDType::I64, "I64", 64},
    {StDType::U64, "U64", 64},
}};

std::string known_dtype_list() {
  std::string s;
  for (const auto& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// Byte length of a tensor of `shape` and `dtype`, or an error text (overflow, partial byte).
std::optional<std::string> tensor_nbytes(const Shape& shape, StDType dtype, uint64_t& nbytes) {
  uint64_t elements = 1;
  for (int64_t d : shape)
    if (d < 0 || !checked_mul(elements, uint64_t(d), elements))
      return "shape " + to_string(shape) + " overflows the element count";
  uint64_t bits = 0;
  if (!checked_mul(elements, st_dtype_bits(dtype), bits))
    return "shape " + to_string(shape) + " × " + std::string(st_dtype_name(dtype)) + " overflows the byte size";
  if (bits % 8 != 0)
    return "shape " + to_string(shape) + " × " + std::string(st_dtype_name(dtype)) +
           " is not a whole number of bytes";
  nbytes = bits / 8;
  return std::nullopt;
}

std::string range_str(uint64_t b, uint64_t e) {
  return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
}

// A JSON value as a non-negative integer that fits int64 (shape entries and offsets).
bool as_index(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return out <= uint64_t(std::numeric_limits<int64_t>::max());
}

struct RawTensor {
  std::string name;
  StDType dtype;
  Shape shape;
  uint64_t begin, end;
};

RawTensor parse_tensor_entry(const std::string& name, const json& v, const std::string& where) {
  std::string ctx = where + ": tensor '" + name + "': ";
  if (!v.is_object()) throw FileError(ctx + "expected an object with dtype, shape and data_offsets, got " + json_type_name(v));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) throw FileError(ctx + "missing field '" + field + "'");
  // Other fields are ignored, as the reference's serde derive ignores unknown fields.
  RawTensor t{name, StDType::F32, {}, 0, 0};
  const json& dt = v["dtype"];
  if (!dt.is_string()) throw FileError(ctx + "dtype must be a string, got " + json_type_name(dt));
  auto parsed = parse_st_dtype(dt.get<std::string>());
  if (!parsed)
    throw FileError(ctx + "unknown dtype '" + dt.get<std::string>() + "' (known: " + known_dtype_list() + ")");
  t.dtype = *parsed;
  const json& sh = v["shape"];
  if (!sh.is_array()) throw FileError(ctx + "shape must be an array, got " + json_type_name(sh));
  for (size_t i = 0; i < sh.size(); ++i) {
    uint64_t d;
    if (!as_index(sh[i], d))
      throw FileError(ctx + "shape entry " + std::to_string(i) + " is " + sh[i].dump() +
                      ", expected a non-negative integer below 2^63");
    t.shape.push_back(int64_t(d));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !as_index(off[0], t.begin) || !as_index(off[1], t.end))
    throw FileError(ctx + "data_offsets must be [begin, end] with non-negative integers, got " + off.dump());
  if (t.begin > t.end) throw FileError(ctx + "data offsets " + range_str(t.begin, t.end) + " have begin > end");
  uint64_t nbytes = 0;
  if (auto problem = tensor_nbytes(t.shape, t.dtype, nbytes)) throw FileError(ctx + *problem);
  if (t.end - t.begin != nbytes)
    throw FileError(ctx + "data offsets " + range_str(t.begin, t.end) + " do not match shape " + to_string(t.shape) +
                    " × " + std::string(st_dtype_name(t.dtype)) + " = " + std::to_string(nbytes) + " bytes");
  return t;
}

}  // namespace

std::string_view st_dtype_name(StDType t) { return kDTypes[size_t(t)].name; }

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

size_t st_dtype_bits(StDType t) { return kDTypes[size_t(t)].bits; }

std::optional<DType> to_lmtune_dtype(StDType t) {
  switch (t) {
    case StDType::F32: return DType::f32;
    case StDType::F16: return DType::f16;
    case StDType::BF16: return DType::bf16;
    case StDType::I32: return DType::i32;
    default: return std::nullopt;
  }
}

StDType to_st_dtype(DType t) {
  switch (t) {
    case DType::f32: return StDType::F32;
    case DType::f16: return StDType::F16;
    case DType::bf16: return StDType::BF16;
    case DType::i32: return StDType::I32;
  }
  return StDType::F32;
}

// ---- SafetensorsTensor ----

int64_t SafetensorsTensor::numel() const { return lmtune::numel(shape); }

DType SafetensorsTensor::dtype() const {
  auto t = to_lmtune_dtype(st_dtype);
  if (!t)
    throw FileError(file.string() + ": unsupported dtype " + std::string(st_dtype_name(st_dtype)) + " in tensor '" +
                    name + "' (lmtune reads F32, F16, BF16 and I32)");
  return *t;
}

std::vector<float> SafetensorsTensor::to_f32() const {
  DType t = dtype();
  if (!is_float(t))
    throw FileError(file.string() + ": unsupported dtype " + std::string(st_dtype_name(st_dtype)) + " in tensor '" +
                    name + "' for conversion to f32 (expected F32, F16 or BF16)");
  return convert_to_f32(data, t);
}

// ---- SafetensorsFile ----

SafetensorsFile::SafetensorsFile(const fs::path& path) : map_(path) {
  const std::string where = path.string();
  auto fail = [&](const std::string& msg) { return FileError(where + ": " + msg); };
  std::span<const std::byte> buf = map_.bytes();
  if (buf.size() < 8)
    throw fail("file is " + std::to_string(buf.size()) + " bytes, too short for the 8-byte header length (truncated?)");
  uint64_t n;
  std::memcpy(&n, buf.data(), 8);
  if (n < 2) throw fail("header length " + std::to_string(n) + " is too small (at least 2 bytes, '{}')");
  if (n > kMaxHeaderSize)
    throw fail("header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderSize) +
               " bytes");
  if (n > buf.size() - 8)
    throw fail("header length " + std::to_string(n) + " exceeds the " + std::to_string(buf.size() - 8) +
               " bytes after the length field (truncated or not a safetensors file)");
  header_size_ = size_t(n);
  std::string_view header(reinterpret_cast<const char*>(buf.data()) + 8, header_size_);
  if (size_t bad = find_invalid_utf8(header); bad != std::string_view::npos)
    throw fail("header is not valid UTF-8 (byte " + std::to_string(bad) + " of the header)");
  if (header.front() != '{') throw fail("header does not start with '{'");
  json j = parse_json_strict(header, where + ": header");
  if (!j.is_object()) throw fail("header is not a JSON object");

  std::vector<RawTensor> raw;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      const json& m = it.value();
      if (m.is_null()) continue;
      if (!m.is_object()) throw fail("__metadata__ must be an object of strings, got " + json_type_name(m));
      for (auto mt = m.begin(); mt != m.end(); ++mt) {
        if (!mt.value().is_string())
          throw fail("__metadata__ key '" + mt.key() + "': expected a string value, got " + json_type_name(mt.value()));
        metadata_[mt.key()] = mt.value().get<std::string>();
      }
      continue;
    }
    raw.push_back(parse_tensor_entry(it.key(), it.value(), where));
  }

  // The data section must be covered exactly, in offset order, without gaps or overlaps.
  const uint64_t data_size = buf.size() - 8 - n;
  for (const RawTensor& t : raw)
    if (t.end > data_size)
      throw fail("tensor '" + t.name + "': data offsets " + range_str(t.begin, t.end) +
                 " extend past the end of the data section (" + std::to_string(data_size) + " bytes; truncated?)");
  std::sort(raw.begin(), raw.end(), [](const RawTensor& a, const RawTensor& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t expected = 0;
  const RawTensor* prev = nullptr;
  for (const RawTensor& t : raw) {
    if (t.begin != expected) {
      std::string after = prev ? "the previous tensor '" + prev->name + "' ends at " + std::to_string(expected)
                               : std::string("the data section starts at 0");
      throw fail("tensor '" + t.name + "': data offsets " + range_str(t.begin, t.end) + " " +
                 (t.begin < expected ? "overlap" : "leave a gap") + ": " + after);
    }
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size)
    throw fail("tensors cover " + std::to_string(expected) + " bytes but the data section has " +
               std::to_string(data_size) + " bytes (trailing data)");

  const std::byte* data = buf.data() + 8 + n;
  tensors_.reserve(raw.size());
  for (RawTensor& t : raw) {
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(SafetensorsTensor{std::move(t.name), t.dtype, std::move(t.shape),
                                         std::span<const std::byte>(data + t.begin, size_t(t.end - t.begin)), path});
  }
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return *t;
  throw FileError(path().string() + ": no tensor named '" + std::string(name) + "'");
}

// ---- SafetensorsCheckpoint ----

SafetensorsCheckpoint::SafetensorsCheckpoint(const fs::path& path) : path_(path) {
  fs::path target = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors.index.json")) target = path / "model.safetensors.index.json";
    else if (fs::exists(path / "model.safetensors")) target = path / "model.safetensors";
    else
      throw FileError(path.string() + ": directory has neither model.safetensors.index.json nor model.safetensors");
  }
  if (target.extension() == ".json") {
    open_index(target);
    return;
  }
  files_.emplace_back(target);
  for (const SafetensorsTensor& t : files_.back().tensors()) by_name_.emplace(t.name, &t);
}

void SafetensorsCheckpoint::open_index(const fs::path& index_path) {
  const std::string where = index_path.string();
  json j = parse_json_strict(read_file_text(index_path), where);
  if (!j.is_object()) throw FileError(where + ": expected a JSON object with 'weight_map'");
  if (!j.contains("weight_map")) throw FileError(where + ": missing 'weight_map'");
  const json& wm = j["weight_map"];
  if (!wm.is_object()) throw FileError(where + ": 'weight_map' must be an object, got " + json_type_name(wm));
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    const json& m = j["metadata"];
    if (!m.is_object()) throw FileError(where + ": 'metadata' must be an object, got " + json_type_name(m));
    for (auto it = m.begin(); it != m.end(); ++it)
      index_metadata_[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
  }
  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    if (!it.value().is_string())
      throw FileError(where + ": weight_map key '" + it.key() + "': expected a shard file name, got " +
                      json_type_name(it.value()));
    std::string shard = it.value().get<std::string>();
    // Shards live next to the index; a path could point anywhere, so only plain file names are accepted.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos)
      throw FileError(where + ": weight_map key '" + it.key() + "': shard '" + shard +
                      "' must be a file name in the index's directory");
    tensors_by_shard[shard].push_back(it.key());
  }
  const fs::path dir = index_path.parent_path();
  files_.reserve(tensors_by_shard.size());  // by_name_ points into files_: no reallocation after this
  for (const auto& [shard, names] : tensors_by_shard) {
    fs::path shard_path = dir / shard;
    std::error_code ec;
    if (!fs::exists(shard_path, ec))
      throw FileError(where + ": shard '" + shard + "' (listed for tensor '" + names.front() +
                      "') does not exist at " + shard_path.string());
    files_.emplace_back(shard_path);
    const SafetensorsFile& f = files_.back();
    for (const std::string& name : names) {
      const SafetensorsTensor* t = f.find(name);
      if (!t)
        throw FileError(where + ": tensor '" + name + "' is mapped to shard '" + shard +
                        "' but that shard has no such tensor");
      by_name_.emplace(name, t);
    }
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

const SafetensorsTensor& SafetensorsCheckpoint::at(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return *t;
  throw FileError(path_.string() + ": no tensor named '" + std::string(name) + "'");
}

// ---- writer ----

namespace {

struct Prepared {
  std::string header;          // JSON padded to a multiple of 8
  std::vector<size_t> order;   // tensors in data order
};

// The header and data order of tensors with the given names, dtypes and shapes (their data sizes follow).
Prepared prepare(std::span<const TensorToStream> tensors, const std::map<std::string, std::string>& metadata,
                 const fs::path& path) {
  const std::string where = path.string();
  std::set<std::string_view> seen;
  std::vector<uint64_t> sizes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToStream& t = tensors[i];
    std::string ctx = where + ": tensor '" + t.name + "': ";
    if (t.name == "__metadata__") throw FileError(ctx + "the name __metadata__ is reserved");
    if (!seen.insert(t.name).second) throw FileError(ctx + "duplicate tensor name");
    if (auto problem = tensor_nbytes(t.shape, t.dtype, sizes[i])) throw FileError(ctx + *problem);
  }
  Prepared p;
  p.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) p.order[i] = i;
  // The reference's order: descending dtype (= alignment), then name (byte-wise).
  std::sort(p.order.begin(), p.order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i : p.order) {
    const TensorToStream& t = tensors[i];
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = std::string(st_dtype_name(t.dtype));
    info["shape"] = t.shape;
    info["data_offsets"] = {offset, offset + sizes[i]};
    header[t.name] = std::move(info);
    offset += sizes[i];
  }
  try {
    p.header = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw FileError(where + ": a tensor name or metadata string is not valid UTF-8: " + e.what());
  }
  p.header.resize((p.header.size() + 7) / 8 * 8, ' ');
  if (p.header.size() > kMaxHeaderSize)
    throw FileError(where + ": header of " + std::to_string(p.header.size()) + " bytes exceeds the limit of " +
                    std::to_string(kMaxHeaderSize));
  return p;
}

// prepare() for tensors whose data is at hand: each one's byte count checked against its shape first.
Prepared prepare(std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata,
                 const fs::path& path) {
  std::vector<TensorToStream> heads;
  heads.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    uint64_t nbytes = 0;
    if (!tensor_nbytes(t.shape, t.dtype, nbytes) && t.data.size() != nbytes)
      throw FileError(path.string() + ": tensor '" + t.name + "': has " + std::to_string(t.data.size()) +
                      " bytes of data but shape " + to_string(t.shape) + " × " + std::string(st_dtype_name(t.dtype)) +
                      " needs " + std::to_string(nbytes));
    heads.push_back({t.name, t.dtype, t.shape});
  }
  return prepare(std::span<const TensorToStream>(heads), metadata, path);
}

}  // namespace

std::vector<std::byte> serialize_safetensors(std::span<const TensorToWrite> tensors,
                                             const std::map<std::string, std::string>& metadata,
                                             const fs::path& path_for_errors) {
  Prepared p = prepare(tensors, metadata, path_for_errors);
  uint64_t n = p.header.size();
  size_t total = 8 + p.header.size();
  for (size_t i : p.order) total += tensors[i].data.size();
  std::vector<std::byte> out(total);
  std::byte* dst = out.data();
  std::memcpy(dst, &n, 8);
  std::memcpy(dst + 8, p.header.data(), p.header.size());
  dst += 8 + p.header.size();
  for (size_t i : p.order) {
    if (!tensors[i].data.empty()) std::memcpy(dst, tensors[i].data.data(), tensors[i].data.size());
    dst += tensors[i].data.size();
  }
  return out;
}

void write_safetensors(const fs::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  Prepared p = prepare(tensors, metadata, path);
  AtomicFileWriter w(path);
  uint64_t n = p.header.size();
  w.write(&n, 8);
  w.write(std::string_view(p.header));
  for (size_t i : p.order) w.write(tensors[i].data);
  w.commit();
}

void write_safetensors_streamed(const fs::path& path, std::span<const TensorToStream> tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t, std::span<std::byte>)>& fill) {
  Prepared p = prepare(tensors, metadata, path);
  AtomicFileWriter w(path);
  uint64_t n = p.header.size();
  w.write(&n, 8);
  w.write(std::string_view(p.header));
  std::vector<std::byte> data;
  for (size_t i : p.order) {
    uint64_t nbytes = 0;
    tensor_nbytes(tensors[i].shape, tensors[i].dtype, nbytes);
    data.resize(nbytes);
    fill(i, data);
    w.write(data);
  }
  w.commit();
}

// ---- conversions ----

namespace {

size_t element_count(size_t nbytes, DType dtype, const char* op) {
  size_t es = dtype_size(dtype);
  if (nbytes % es != 0)
    throw ShapeError(std::string(op) + ": " + std::to_string(nbytes) + " bytes is not a multiple of the " +
                     std::string(dtype_name(dtype)) + " element size " + std::to_string(es));
  return nbytes / es;
}

// Round to nearest and clamp to the int32 range; NaN becomes 0 (a plain cast would be undefined behaviour).
int32_t saturate_i32(float v) {
  if (!(v == v)) return 0;
  double r = std::nearbyint(double(v));
  if (r <= -2147483648.0) return std::numeric_limits<int32_t>::min();
  if (r >= 2147483647.0) return std::numeric_limits<int32_t>::max();
  return int32_t(r);
}

}  // namespace

std::vector<float> convert_to_f32(std::span<const std::byte> bytes, DType dtype) {
  size_t n = element_count(bytes.size(), dtype, "convert_to_f32");
  std::vector<float> out(n);
  const std::byte* p = bytes.data();
  switch (dtype) {
    case DType::f32: if (n) std::memcpy(out.data(), p, n * 4); break;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); out[i] = f16_to_f32(h); }
      break;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_f32(h); }
      break;
    case DType::i32:
      for (size_t i = 0; i < n; ++i) { int32_t v; std::memcpy(&v, p + 4 * i, 4); out[i] = float(v); }
      break;
  }
  return out;
}

std::vector<std::byte> convert_from_f32(std::span<const float> values, DType dtype) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  std::byte* p = out.data();
  switch (dtype) {
    case DType::f32: if (!values.empty()) std::memcpy(p, values.data(), values.size() * 4); break;
    case DType::f16:
      for (size_t i = 0; i < values.size(); ++i) { uint16_t h = f32_to_f16(values[i]); std::memcpy(p + 2 * i, &h, 2); }
      break;
    case DType::bf16:
      for (size_t i = 0; i < values.size(); ++i) { uint16_t h = f32_to_bf16(values[i]); std::memcpy(p + 2 * i, &h, 2); }
      break;
    case DType::i32:
      for (size_t i = 0; i < values.size(); ++i) { int32_t v = saturate_i32(values[i]); std::memcpy(p + 4 * i, &v, 4); }
      break;
  }
  return out;
}

std::vector<std::byte> convert_dtype(std::span<const std::byte> bytes, DType from, DType to) {
  if (from == to) {
    element_count(bytes.size(), from, "convert_dtype");
    return {bytes.begin(), bytes.end()};
  }
  std::vector<float> f = convert_to_f32(bytes, from);
  return convert_from_f32(f, to);
}

}  // namespace lmtune
