// Tests for io/atomic_file: atomic replacement, cleanup of abandoned temporaries, reads and memory maps.
#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include "io/io_test_util.h"

namespace lmtune {
namespace {

using testing::file_error_message;
using testing::TempDir;

size_t count_entries(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFile, WritesAndReplaces) {
  TempDir dir;
  auto p = dir / "a.txt";
  write_file_atomic(p, std::string_view("first"));
  EXPECT_EQ(read_file_text(p), "first");
  write_file_atomic(p, std::string_view("second, longer"));
  EXPECT_EQ(read_file_text(p), "second, longer");
  EXPECT_EQ(count_entries(dir.path()), 1u);  // no temporary left behind
  auto bytes = read_file_bytes(p);
  EXPECT_EQ(bytes.size(), 14u);
  EXPECT_EQ(char(bytes[0]), 's');
}

TEST(AtomicFile, Crc32IsTheStandardOne) {
  auto bytes = [](std::string_view s) { return std::as_bytes(std::span(s)); };
  EXPECT_EQ(crc32(bytes("")), 0u);
  EXPECT_EQ(crc32(bytes("123456789")), 0xCBF43926u);  // the CRC-32/ISO-HDLC check value (zlib's crc32)
  EXPECT_EQ(crc32(bytes("56789"), crc32(bytes("1234"))), 0xCBF43926u);
  EXPECT_NE(crc32(bytes("123456780")), 0xCBF43926u);
}

TEST(AtomicFile, AbandonedWriterKeepsOldFile) {
  TempDir dir;
  auto p = dir / "keep.txt";
  write_file_atomic(p, std::string_view("old"));
  {
    AtomicFileWriter w(p);
    w.write(std::string_view("partial new contents"));
    EXPECT_TRUE(std::filesystem::exists(w.temp_path()));
    EXPECT_EQ(w.temp_path().parent_path(), p.parent_path());
  }  // destroyed without commit, as when an exception unwinds a writer
  EXPECT_EQ(read_file_text(p), "old");
  EXPECT_EQ(count_entries(dir.path()), 1u);
}

TEST(AtomicFile, WriteAfterCommitThrows) {
  TempDir dir;
  AtomicFileWriter w(dir / "x");
  w.write(std::string_view("x"));
  w.commit();
  EXPECT_THROW(w.write(std::string_view("y")), FileError);
  EXPECT_THROW(w.commit(), FileError);
}

TEST(AtomicFile, ErrorsNameThePath) {
  TempDir dir;
  auto missing = dir / "nope.txt";
  std::string msg = file_error_message([&] { read_file_text(missing); });
  EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  msg = file_error_message([&] { write_file_atomic(dir / "no_dir" / "f.txt", std::string_view("x")); });
  EXPECT_NE(msg.find("no_dir/f.txt"), std::string::npos) << msg;
  msg = file_error_message([&] { read_file_text(dir.path()); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(AtomicFile, AtomicRenamePublishes) {
  TempDir dir;
  auto tmp = temp_path_next_to(dir / "final.bin");
  EXPECT_EQ(tmp.parent_path(), dir.path());
  EXPECT_NE(temp_path_next_to(dir / "final.bin"), tmp);  // unique per call
  write_file_atomic(tmp, std::string_view("payload"));
  atomic_rename(tmp, dir / "final.bin");
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_EQ(read_file_text(dir / "final.bin"), "payload");
  EXPECT_THROW(atomic_rename(dir / "missing", dir / "final.bin"), FileError);
}

// A process killed mid-write leaves its temporary behind; the next write of the same file removes it (and only
// temporaries of that file).
TEST(AtomicFile, NextWriteRemovesStaleTemporaries) {
  TempDir dir;
  const auto stale = dir / ".adapter_model.safetensors.tmp.Ab12Cd";
  const auto stale_renamed = dir / ".adapter_model.safetensors.tmp.4242.0";
  const auto other = dir / ".other.bin.tmp.Zz99Yy";
  for (const auto& p : {stale, stale_renamed, other}) write_file_atomic(p, std::string_view("partial"));
  write_file_atomic(dir / "adapter_model.safetensors", std::string_view("new"));
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(stale_renamed));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_EQ(read_file_text(dir / "adapter_model.safetensors"), "new");
  write_file_atomic(dir / ".metrics.h5.tmp.1.0", std::string_view("partial"));
  auto tmp = temp_path_next_to(dir / "metrics.h5");
  write_file_atomic(tmp, std::string_view("payload"));
  atomic_rename(tmp, dir / "metrics.h5");
  EXPECT_FALSE(std::filesystem::exists(dir / ".metrics.h5.tmp.1.0"));
}

TEST(MappedFile, MapsContentsAndEmptyFiles) {
  TempDir dir;
  write_file_atomic(dir / "m", std::string_view("mapped"));
  MappedFile m(dir / "m");
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(char(m.bytes()[5]), 'd');
  MappedFile moved = std::move(m);
  EXPECT_EQ(moved.size(), 6u);
  EXPECT_EQ(m.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  write_file_atomic(dir / "empty", std::string_view(""));
  MappedFile e(dir / "empty");
  EXPECT_EQ(e.size(), 0u);
  EXPECT_TRUE(e.bytes().empty());
  EXPECT_THROW(MappedFile(dir / "missing"), FileError);
}

}  // namespace
}  // namespace lmtune
