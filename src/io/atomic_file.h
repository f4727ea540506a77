// File helpers shared by every lmtune writer and reader: atomic replacement of a file (a crash or a full disk
// leaves either the old file or the new one, never a torn mix), whole-file reads, read-only memory maps and a
// CRC-32 for checksums stored inside files. All failures throw FileError("<path>: <problem>").
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lmtune {

// Writes a file atomically: data goes to a temporary file in the destination's directory (same filesystem,
// so the final rename is atomic), which is fsynced, renamed over `path`, and the directory is fsynced so the
// rename itself is durable. If the writer is destroyed without commit() the temporary file is removed.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::span<const std::byte> bytes) { write(bytes.data(), bytes.size()); }
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Makes the new contents visible at path(). No writes are allowed afterwards.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// One-shot forms of AtomicFileWriter.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// A name for a temporary file next to `path` (same directory, hidden, unique per process and call).
std::filesystem::path temp_path_next_to(const std::filesystem::path& path);
// fsyncs `from`, renames it to `to` (replacing it) and fsyncs the directory of `to`. For writers that produce
// a complete file through another library (HDF5) and then publish it.
void atomic_rename(const std::filesystem::path& from, const std::filesystem::path& to);
// fsync of a file or directory by path.
void fsync_path(const std::filesystem::path& path);

// CRC-32 (zlib's crc32) of `bytes`, continuing from `crc` (0 to start).
uint32_t crc32(std::span<const std::byte> bytes, uint32_t crc = 0);

std::string read_file_text(const std::filesystem::path& path);
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

// A read-only, private memory map of a whole file (RAII). An empty file maps to an empty span.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release();
  std::filesystem::path path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lmtune
