// Atomic file replacement, whole-file reads and memory maps over POSIX calls (open/fsync/rename/mmap), so
// every error can name the path and the errno text.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& path, const std::string& what, int err) {
  throw FileError(path.string() + ": " + what + ": " + std::strerror(err));
}

fs::path parent_dir(const fs::path& path) {
  fs::path dir = path.parent_path();
  return dir.empty() ? fs::path(".") : dir;
}

void fsync_dir_of(const fs::path& path) { fsync_path(parent_dir(path)); }

// Temporary files of earlier writes of `path` that a killed process left behind (".<name>.tmp.*"): once a new
// version is in place they hold nothing anyone can use. Best effort: a failure to remove one is not an error.
void remove_stale_temps(const fs::path& path) {
  const std::string prefix = "." + path.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent_dir(path), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
  }
}

// Closes a descriptor on scope exit unless released.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

fs::path temp_path_next_to(const fs::path& path) {
  static std::atomic<unsigned> counter{0};
  std::string name = "." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(counter.fetch_add(1));
  return parent_dir(path) / name;
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open for fsync", errno);
  FdGuard guard{fd};
  // Some filesystems refuse fsync on directories (EINVAL); the rename is then as durable as they allow.
  if (::fsync(fd) != 0 && errno != EINVAL) fail(path, "fsync failed", errno);
}

void atomic_rename(const fs::path& from, const fs::path& to) {
  fsync_path(from);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    throw FileError(to.string() + ": cannot rename " + from.string() + " over it: " + std::strerror(err));
  }
  fsync_dir_of(to);
  remove_stale_temps(to);
}

AtomicFileWriter::AtomicFileWriter(fs::path path) : path_(std::move(path)) {
  std::string templ = (parent_dir(path_) / ("." + path_.filename().string() + ".tmp.XXXXXX")).string();
  fd_ = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd_ < 0) fail(path_, "cannot create temporary file " + templ, errno);
  temp_path_ = templ;
  // mkstemp creates 0600; published files get the usual rw-r--r--.
  ::fchmod(fd_, 0644);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw FileError(path_.string() + ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path_, "write failed", errno);
    }
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw FileError(path_.string() + ": commit called twice");
  if (::fsync(fd_) != 0) fail(path_, "fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close failed", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail(path_, "cannot rename temporary file over it", errno);
  committed_ = true;
  fsync_dir_of(path_);
  remove_stale_temps(path_);
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  AtomicFileWriter w(path);
  w.write(bytes);
  w.commit();
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  AtomicFileWriter w(path);
  w.write(text);
  w.commit();
}

namespace {

template <class Container>
Container read_whole(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat", errno);
  if (S_ISDIR(st.st_mode)) throw FileError(path.string() + ": is a directory");
  Container out;
  out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "read failed", errno);
    }
    if (n == 0) break;
    const auto* b = reinterpret_cast<const typename Container::value_type*>(buf);
    out.insert(out.end(), b, b + n);
  }
  return out;
}

}  // namespace

namespace {



}  // namespace

uint32_t crc32(std::span<const std::byte> bytes, uint32_t crc) {
  // zlib takes at most 4 GiB per call.
  constexpr size_t kChunk = size_t(1) << 30;
  for (size_t i = 0; i < bytes.size(); i += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - i);
    crc = uint32_t(::crc32(uLong(crc), reinterpret_cast<const Bytef*>(bytes.data() + i), uInt(n)));
  }
  return crc;
}

std::string read_file_text(const fs::path& path) { return read_whole<std::string>(path); }
std::vector<std::byte> read_file_bytes(const fs::path& path) { return read_whole<std::vector<std::byte>>(path); }

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) throw FileError(path.string() + ": not a regular file");
  size_ = size_t(st.st_size);
  if (size_ == 0) return;  // mmap of length 0 is an error; an empty span is the right answer
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    size_ = 0;
    fail(path, "mmap failed", errno);
  }
  data_ = p;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release() {
  if (data_) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace lmtune
