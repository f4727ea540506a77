// HDF5 wrapper implementation. HDF5 reports failures as negative return values plus an error stack; each
// failing call is turned into a FileError carrying the innermost stack message, with HDF5's automatic
// printing to stderr switched off once per process.
#include "io/hdf5_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "core/error.h"
#include "io/atomic_file.h"

namespace lmtune {
namespace fs = std::filesystem;

static_assert(std::is_same_v<hid_t, int64_t>, "Hdf5File stores hid_t as int64_t");

namespace {

void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A file whose close failed (a full disk while flushing) stays registered half torn down, and HDF5's
    // clean-up at exit crashes closing it again. Every Hdf5File closes itself, so that clean-up is not needed;
    // this must precede the library's initialization, which the next call performs.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// HDF5's file-driver messages run over several lines with the time, descriptor and buffer addresses; keep the
// operation and the system's reason: "file write failed: No space left on device".
std::string tidy_hdf5_message(std::string desc) {
  const std::string key = "error message = '";
  if (const size_t at = desc.find(key); at != std::string::npos) {
    const size_t end = desc.find('\'', at + key.size());
    const std::string reason = desc.substr(at + key.size(), end == std::string::npos ? end : end - at - key.size());
    desc = desc.substr(0, desc.find_first_of(":,")) + ": " + reason;
  }
  std::replace(desc.begin(), desc.end(), '\n', ' ');
  return desc;
}

// The most specific message on HDF5's error stack (the innermost frame), then clears the stack.
std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* out) -> herr_t {
        if (n == 0 && err->desc) *static_cast<std::string*>(out) = err->desc;
        return 0;
      },
      &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "HDF5 call failed" : tidy_hdf5_message(text);
}

std::string normalize(const std::string& object) {
  if (object.empty() || object == "/") return "/";
  return object[0] == '/' ? object : "/" + object;
}

// Owns one hid_t and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  Closer closer_;
};

template <class T>
struct TypeOf;
template <> struct TypeOf<float> {
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
  static hid_t file() { return H5T_IEEE_F32LE; }
  static constexpr H5ElemType elem = H5ElemType::f32;
};
template <> struct TypeOf<int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
  static constexpr H5ElemType elem = H5ElemType::i32;
};
template <> struct TypeOf<int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
  static constexpr H5ElemType elem = H5ElemType::i64;
};
template <> struct TypeOf<uint8_t> {
  static hid_t mem() { return H5T_NATIVE_UINT8; }
  static hid_t file() { return H5T_STD_U8LE; }
  static constexpr H5ElemType elem = H5ElemType::u8;
};
template <> struct TypeOf<uint16_t> {
  static hid_t mem() { return H5T_NATIVE_UINT16; }
  static hid_t file() { return H5T_STD_U16LE; }
  static constexpr H5ElemType elem = H5ElemType::u16;
};

// Properties that create missing parent groups and leave timestamps out (so identical contents give
// identical files).
Handle link_create_props() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

}  // namespace

std::string_view h5_elem_type_name(H5ElemType t) {
  switch (t) {
    case H5ElemType::f32: return "f32";
    case H5ElemType::i32: return "i32";
    case H5ElemType::i64: return "i64";
    case H5ElemType::u8: return "u8";
    case H5ElemType::u16: return "u16";
  }
  return "?";
}

// Builds "<file>: <object>: <problem>[: <hdf5 message>]".
#define LMTUNE_H5_FAIL(object, problem) \
  throw FileError(path_.string() + ": " + std::string(object) + ": " + (problem) + ": " + hdf5_error_text())

Hdf5File Hdf5File::create(const fs::path& path) {
  silence_hdf5();
  Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_obj_track_times(fcpl.get(), 0);
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT);
  if (id < 0) throw FileError(path.string() + ": cannot create HDF5 file: " + hdf5_error_text());
  return Hdf5File(path, id);
}

Hdf5File Hdf5File::open(const fs::path& path, bool writable) {
  silence_hdf5();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw FileError(path.string() + ": no such file");
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 == 0) throw FileError(path.string() + ": not an HDF5 file (no HDF5 signature)");
  if (is_h5 < 0) throw FileError(path.string() + ": cannot read as HDF5: " + hdf5_error_text());
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw FileError(path.string() + ": cannot open HDF5 file (damaged or truncated?): " + hdf5_error_text());
  return Hdf5File(path, id);
}

Hdf5File::Hdf5File(Hdf5File&& other) noexcept : path_(std::move(other.path_)), id_(other.id_) { other.id_ = -1; }

Hdf5File& Hdf5File::operator=(Hdf5File&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0) H5Fclose(id_);
    path_ = std::move(other.path_);
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

Hdf5File::~Hdf5File() {
  if (id_ >= 0) {
    H5Fclose(id_);
    H5Eclear2(H5E_DEFAULT);
  }
}

int64_t Hdf5File::file_id() const {
  if (id_ < 0) throw FileError(path_.string() + ": HDF5 file is closed");
  return id_;
}

void Hdf5File::close() {
  hid_t id = file_id();
  id_ = -1;
  if (H5Fclose(id) < 0) LMTUNE_H5_FAIL("/", "closing failed");
}

void Hdf5File::flush() {
  if (H5Fflush(file_id(), H5F_SCOPE_GLOBAL) < 0) LMTUNE_H5_FAIL("/", "flush failed");
}

bool Hdf5File::exists(const std::string& object) const {
  std::string p = normalize(object);
  if (p == "/") return true;
  // H5Lexists fails (rather than answering false) when a parent is missing, so walk the path.
  size_t pos = 0;
  while ((pos = p.find('/', pos + 1)) != std::string::npos) {
    htri_t r = H5Lexists(file_id(), p.substr(0, pos).c_str(), H5P_DEFAULT);
    if (r <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  htri_t r = H5Lexists(file_id(), p.c_str(), H5P_DEFAULT);
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

bool Hdf5File::is_dataset(const std::string& object) const {
  if (!exists(object)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(file_id(), normalize(object).c_str(), &info, H5P_DEFAULT) < 0)
    LMTUNE_H5_FAIL(normalize(object), "cannot inspect object");
  return info.type == H5O_TYPE_DATASET;
}

void Hdf5File::create_group(const std::string& group) {
  std::string p = normalize(group);
  if (exists(p)) {
    if (is_dataset(p)) throw FileError(path_.string() + ": " + p + ": exists and is a dataset, not a group");
    return;
  }
  Handle lcpl = link_create_props();
  Handle g(H5Gcreate2(file_id(), p.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.ok()) LMTUNE_H5_FAIL(p, "cannot create group");
}

std::vector<std::string> Hdf5File::list(const std::string& group) const {
  std::string p = normalize(group);
  if (!exists(p)) throw FileError(path_.string() + ": group '" + p + "' not found");
  Handle g(H5Gopen2(file_id(), p.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.ok()) LMTUNE_H5_FAIL(p, "cannot open group");
  std::vector<std::string> names;
  H5Literate(
      g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      },
      &names);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

std::vector<hsize_t> to_dims(const Shape& shape) { return {shape.begin(), shape.end()}; }

}  // namespace

template <H5Element T>
void Hdf5File::write(const std::string& dataset, std::span<const T> data, const Shape& shape) {
  std::string p = normalize(dataset);
  for (int64_t d : shape)
    if (d < 0) throw FileError(path_.string() + ": dataset '" + p + "': negative dimension in shape " + to_string(shape));
  if (int64_t(data.size()) != numel(shape))
    throw FileError(path_.string() + ": dataset '" + p + "': " + std::to_string(data.size()) +
                    " values do not match shape " + to_string(shape));
  if (exists(p)) throw FileError(path_.string() + ": dataset '" + p + "' already exists");
  std::vector<hsize_t> dims = to_dims(shape);
  Handle space(shape.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr),
               H5Sclose);
  if (!space.ok()) LMTUNE_H5_FAIL(p, "cannot create dataspace");
  Handle lcpl = link_create_props();
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl.get(), 0);
  Handle ds(H5Dcreate2(file_id(), p.c_str(), TypeOf<T>::file(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (!ds.ok()) LMTUNE_H5_FAIL("dataset '" + p + "'", "cannot create");
  if (!data.empty() && H5Dwrite(ds.get(), TypeOf<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    LMTUNE_H5_FAIL("dataset '" + p + "'", "write failed");
}

namespace {

// Maps a stored HDF5 type onto lmtune's element types; false for anything else.
bool elem_type_of(hid_t type, H5ElemType& out) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) { out = H5ElemType::f32; return true; }
  if (cls != H5T_INTEGER) return false;
  bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  if (is_signed && size == 4) { out = H5ElemType::i32; return true; }
  if (is_signed && size == 8) { out = H5ElemType::i64; return true; }
  if (!is_signed && size == 1) { out = H5ElemType::u8; return true; }
  if (!is_signed && size == 2) { out = H5ElemType::u16; return true; }
  return false;
}

}  // namespace

// Opens a dataset or throws a FileError that says whether it is missing.
#define LMTUNE_OPEN_DATASET(handle, p)                                                                   \
  if (!exists(p)) throw FileError(path_.string() + ": dataset '" + (p) + "' not found");                 \
  Handle handle(H5Dopen2(file_id(), (p).c_str(), H5P_DEFAULT), H5Dclose);                                \
  if (!handle.ok()) LMTUNE_H5_FAIL("dataset '" + (p) + "'", "cannot open (not a dataset, or damaged)")

Shape Hdf5File::shape(const std::string& dataset) const {
  std::string p = normalize(dataset);
  LMTUNE_OPEN_DATASET(ds, p);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 0) LMTUNE_H5_FAIL("dataset '" + p + "'", "cannot read dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

H5ElemType Hdf5File::elem_type(const std::string& dataset) const {
  std::string p = normalize(dataset);
  LMTUNE_OPEN_DATASET(ds, p);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  H5ElemType t;
  if (!type.ok() || !elem_type_of(type.get(), t))
    throw FileError(path_.string() + ": dataset '" + p + "': stored element type is not one of f32, i32, i64, u8, u16");
  return t;
}

template <H5Element T>
std::vector<T> Hdf5File::read_unchecked(const std::string& dataset, Shape* shape_out) const {
  std::string p = normalize(dataset);
  H5ElemType stored = elem_type(p);
  if (stored != TypeOf<T>::elem)
    throw FileError(path_.string() + ": dataset '" + p + "' holds " + std::string(h5_elem_type_name(stored)) +
                    " data, not " + std::string(h5_elem_type_name(TypeOf<T>::elem)));
  Shape s = shape(p);
  LMTUNE_OPEN_DATASET(ds, p);
  std::vector<T> out(size_t(numel(s)));
  if (!out.empty() && H5Dread(ds.get(), TypeOf<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    LMTUNE_H5_FAIL("dataset '" + p + "'", "read failed (damaged file?)");
  if (shape_out) *shape_out = std::move(s);
  return out;
}

namespace {

constexpr const char* kCrcAttr = "crc32";
constexpr const char* kAttrsCrcAttr = "attrs_crc32";

template <class T>
uint32_t crc_of(const std::vector<T>& v) {
  return crc32(std::as_bytes(std::span<const T>(v)));
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

template <H5Element T>
std::vector<T> Hdf5File::read(const std::string& dataset, Shape* shape_out) const {
  std::string p = normalize(dataset);
  std::vector<T> out = read_unchecked<T>(p, shape_out);
  if (has_attr(p, kCrcAttr)) {
    const auto stored = uint32_t(attr_int(p, kCrcAttr));
    if (const uint32_t actual = crc_of(out); actual != stored)
      throw FileError(path_.string() + ": dataset '" + p + "': checksum mismatch (crc32 stored " + hex32(stored) +
                      ", data gives " + hex32(actual) + "): the file is damaged");
  }
  return out;
}

template <H5Element T>
void Hdf5File::create_appendable(const std::string& dataset, size_t chunk_elements) {
  std::string p = normalize(dataset);
  if (exists(p)) throw FileError(path_.string() + ": dataset '" + p + "' already exists");
  hsize_t dims[1] = {0}, max_dims[1] = {H5S_UNLIMITED}, chunk[1] = {std::max<hsize_t>(chunk_elements, 1)};
  Handle space(H5Screate_simple(1, dims, max_dims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 1, chunk);
  H5Pset_obj_track_times(dcpl.get(), 0);
  Handle lcpl = link_create_props();
  Handle ds(H5Dcreate2(file_id(), p.c_str(), TypeOf<T>::file(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (!ds.ok()) LMTUNE_H5_FAIL("dataset '" + p + "'", "cannot create");
}

template <H5Element T>
void Hdf5File::append(const std::string& dataset, std::span<const T> values) {
  std::string p = normalize(dataset);
  H5ElemType stored = elem_type(p);
  if (stored != TypeOf<T>::elem)
    throw FileError(path_.string() + ": dataset '" + p + "' holds " + std::string(h5_elem_type_name(stored)) +
                    " data, cannot append " + std::string(h5_elem_type_name(TypeOf<T>::elem)));
  Shape s = shape(p);
  if (s.size() != 1) throw FileError(path_.string() + ": dataset '" + p + "' is not 1-D, cannot append");
  if (values.empty()) return;
  LMTUNE_OPEN_DATASET(ds, p);
  hsize_t old_len = hsize_t(s[0]), n = values.size(), new_len = old_len + n;
  if (H5Dset_extent(ds.get(), &new_len) < 0)
    LMTUNE_H5_FAIL("dataset '" + p + "'", "cannot grow (not created with create_appendable?)");
  Handle file_space(H5Dget_space(ds.get()), H5Sclose);
  H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &old_len, nullptr, &n, nullptr);
  Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (H5Dwrite(ds.get(), TypeOf<T>::mem(), mem_space.get(), file_space.get(), H5P_DEFAULT, values.data()) < 0)
    LMTUNE_H5_FAIL("dataset '" + p + "'", "append failed");
}

// ---- attributes ----

#define LMTUNE_OPEN_OBJECT(handle, p)                                                              \
  if (!exists(p)) throw FileError(path_.string() + ": object '" + (p) + "' not found");             \
  Handle handle(H5Oopen(file_id(), (p).c_str(), H5P_DEFAULT), H5Oclose);                            \
  if (!handle.ok()) LMTUNE_H5_FAIL("object '" + (p) + "'", "cannot open")

namespace {

// Creates (replacing) a scalar attribute of `type` and writes `value` with memory type `mem`.
void write_scalar_attr(hid_t obj, const std::string& name, hid_t type, hid_t mem, const void* value, bool& ok) {
  ok = false;
  if (H5Aexists(obj, name.c_str()) > 0 && H5Adelete(obj, name.c_str()) < 0) return;
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return;
  ok = H5Awrite(attr.get(), mem, value) >= 0;
}

}  // namespace

void Hdf5File::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  std::string p = normalize(object);
  LMTUNE_OPEN_OBJECT(obj, p);
  // Variable-length UTF-8 strings: what h5py writes for Python str, so tools read them back as text.
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* ptr = value.c_str();
  bool ok;
  write_scalar_attr(obj.get(), name, type.get(), type.get(), &ptr, ok);
  if (!ok) LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "write failed");
}

void Hdf5File::set_attr(const std::string& object, const std::string& name, double value) {
  std::string p = normalize(object);
  LMTUNE_OPEN_OBJECT(obj, p);
  bool ok;
  write_scalar_attr(obj.get(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, ok);
  if (!ok) LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "write failed");
}

void Hdf5File::set_attr(const std::string& object, const std::string& name, int64_t value) {
  std::string p = normalize(object);
  LMTUNE_OPEN_OBJECT(obj, p);
  bool ok;
  write_scalar_attr(obj.get(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, ok);
  if (!ok) LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "write failed");
}

bool Hdf5File::has_attr(const std::string& object, const std::string& name) const {
  std::string p = normalize(object);
  if (!exists(p)) return false;
  htri_t r = H5Aexists_by_name(file_id(), p.c_str(), name.c_str(), H5P_DEFAULT);
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

#define LMTUNE_OPEN_ATTR(handle, p, name)                                                                      \
  if (!has_attr(p, name)) throw FileError(path_.string() + ": attribute '" + (name) + "' not found on '" + (p) + "'"); \
  Handle handle(H5Aopen_by_name(file_id(), (p).c_str(), (name).c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose); \
  if (!handle.ok()) LMTUNE_H5_FAIL("attribute '" + (name) + "' on '" + (p) + "'", "cannot open")

std::string Hdf5File::attr_string(const std::string& object, const std::string& name) const {
  std::string p = normalize(object);
  LMTUNE_OPEN_ATTR(attr, p, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw FileError(path_.string() + ": attribute '" + name + "' on '" + p + "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    char* s = nullptr;
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    if (H5Aread(attr.get(), mem.get(), &s) < 0) LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "read failed");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  // Fixed-length strings (as other tools may write): strip the padding.
  std::string out(H5Tget_size(type.get()), '\0');
  if (H5Aread(attr.get(), type.get(), out.data()) < 0)
    LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "read failed");
  out.erase(std::find(out.begin(), out.end(), '\0'), out.end());
  while (!out.empty() && out.back() == ' ' && H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) out.pop_back();
  return out;
}

double Hdf5File::attr_double(const std::string& object, const std::string& name) const {
  std::string p = normalize(object);
  LMTUNE_OPEN_ATTR(attr, p, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw FileError(path_.string() + ": attribute '" + name + "' on '" + p + "' is not a number");
  double v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "read failed");
  return v;
}

int64_t Hdf5File::attr_int(const std::string& object, const std::string& name) const {
  std::string p = normalize(object);
  LMTUNE_OPEN_ATTR(attr, p, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw FileError(path_.string() + ": attribute '" + name + "' on '" + p + "' is not an integer");
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0)
    LMTUNE_H5_FAIL("attribute '" + name + "' on '" + p + "'", "read failed");
  return v;
}

// ---- integrity seal ----

uint32_t Hdf5File::dataset_crc(const std::string& dataset) const {
  switch (elem_type(dataset)) {
    case H5ElemType::f32: return crc_of(read_unchecked<float>(dataset, nullptr));
    case H5ElemType::i32: return crc_of(read_unchecked<int32_t>(dataset, nullptr));
    case H5ElemType::i64: return crc_of(read_unchecked<int64_t>(dataset, nullptr));
    case H5ElemType::u8: return crc_of(read_unchecked<uint8_t>(dataset, nullptr));
    case H5ElemType::u16: return crc_of(read_unchecked<uint16_t>(dataset, nullptr));
  }
  return 0;
}

std::vector<std::string> Hdf5File::all_objects() const {
  std::vector<std::string> out{"/"};
  for (size_t i = 0; i < out.size(); ++i) {
    if (i > 0 && is_dataset(out[i])) continue;
    const std::string prefix = out[i] == "/" ? "/" : out[i] + "/";
    for (const std::string& name : list(out[i])) out.push_back(prefix + name);
  }
  return out;
}

// "<object>@<name>=<value>" lines for every attribute but the checksums; numbers as exact text.
std::string Hdf5File::attributes_text(const std::string& object) const {
  LMTUNE_OPEN_OBJECT(obj, object);
  std::vector<std::string> names;
  hsize_t idx = 0;
  herr_t rc = H5Aiterate2(
      obj.get(), H5_INDEX_NAME, H5_ITER_INC, &idx,
      [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      },
      &names);
  if (rc < 0) LMTUNE_H5_FAIL(object, "cannot list attributes");
  std::string text;
  for (const std::string& name : names) {
    if (name == kCrcAttr || name == kAttrsCrcAttr) continue;
    Handle attr(H5Aopen(obj.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
    Handle type(attr.ok() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    if (!type.ok()) LMTUNE_H5_FAIL("attribute '" + name + "' on '" + object + "'", "cannot open");
    std::string value;
    switch (H5Tget_class(type.get())) {
      case H5T_STRING: value = attr_string(object, name); break;
      case H5T_INTEGER: value = std::to_string(attr_int(object, name)); break;
      case H5T_FLOAT: {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%a", attr_double(object, name));
        value = buf;
        break;
      }
      default: value = "?";
    }
    text += object + "@" + name + "=" + value + "\n";
  }
  return text;
}

uint32_t Hdf5File::attributes_crc() const {
  uint32_t crc = 0;
  for (const std::string& object : all_objects()) {
    const std::string text = attributes_text(object);
    crc = crc32(std::as_bytes(std::span(text)), crc);
  }
  return crc;
}

void Hdf5File::seal() {
  for (const std::string& object : all_objects())
    if (is_dataset(object)) set_attr(object, kCrcAttr, int64_t(dataset_crc(object)));
  set_attr("/", kAttrsCrcAttr, int64_t(attributes_crc()));
}

void Hdf5File::verify_seal() const {
  if (!has_attr("/", kAttrsCrcAttr)) throw FileError(path_.string() + ": not sealed (no attribute 'attrs_crc32')");
  for (const std::string& object : all_objects()) {
    if (!is_dataset(object)) continue;
    if (!has_attr(object, kCrcAttr))
      throw FileError(path_.string() + ": dataset '" + object + "' has no checksum (attribute 'crc32'): damaged");
    if (const auto stored = uint32_t(attr_int(object, kCrcAttr)), actual = dataset_crc(object); actual != stored)
      throw FileError(path_.string() + ": dataset '" + object + "': checksum mismatch (crc32 stored " +
                      hex32(stored) + ", data gives " + hex32(actual) + "): the file is damaged");
  }
  if (const auto stored = uint32_t(attr_int("/", kAttrsCrcAttr)), actual = attributes_crc(); actual != stored)
    throw FileError(path_.string() + ": attributes: checksum mismatch (attrs_crc32 stored " + hex32(stored) +
                    ", attributes give " + hex32(actual) + "): the file is damaged");
}

// ---- explicit instantiations for the supported element types ----

#define LMTUNE_H5_INSTANTIATE(T)                                                                     \
  template void Hdf5File::write<T>(const std::string&, std::span<const T>, const Shape&);            \
  template std::vector<T> Hdf5File::read<T>(const std::string&, Shape*) const;                       \
  template void Hdf5File::create_appendable<T>(const std::string&, size_t);                          \
  template void Hdf5File::append<T>(const std::string&, std::span<const T>);
LMTUNE_H5_INSTANTIATE(float)
LMTUNE_H5_INSTANTIATE(int32_t)
LMTUNE_H5_INSTANTIATE(int64_t)
LMTUNE_H5_INSTANTIATE(uint8_t)
LMTUNE_H5_INSTANTIATE(uint16_t)

// ---- atomic save ----

void save_hdf5_atomic(const fs::path& path, const std::function<void(Hdf5File&)>& fill) {
  fs::path tmp = temp_path_next_to(path);
  try {
    Hdf5File f = Hdf5File::create(tmp);
    fill(f);
    f.close();
    atomic_rename(tmp, path);
  } catch (const FileError& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw FileError(path.string() + ": not written, any previous version is kept: " + e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace lmtune
