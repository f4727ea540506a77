// Tests for io/hdf5_file: dataset and attribute round trips, appendable datasets, atomic saves, and clear
// errors for missing objects, wrong types and damaged files.
#include "io/hdf5_file.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>

#include "io/atomic_file.h"
#include "io/io_test_util.h"

namespace lmtune {
namespace {

using testing::file_error_message;
using testing::write_bytes;
using testing::TempDir;

TEST(Hdf5File, DatasetRoundTrips) {
  TempDir dir;
  auto p = dir / "cache.h5";
  {
    Hdf5File f = Hdf5File::create(p);
    f.write("weights/w", std::vector<float>{1.5f, -2, 3, 4, 5, 6}, {2, 3});
    f.write("ids", std::vector<int32_t>{7, -8, 9}, {3});
    f.write("offsets", std::vector<int64_t>{0, 1ll << 40}, {2});
    f.write("mask", std::vector<uint8_t>{1, 0, 1, 1}, {2, 2});
    f.write("tokens", std::vector<uint16_t>{65535, 0, 42}, {3});
    f.write("scalar", std::vector<float>{3.25f}, {});
    f.write("empty", std::vector<float>{}, {0, 4});
    f.close();
    EXPECT_THROW(f.flush(), FileError);  // closed
  }
  Hdf5File f = Hdf5File::open(p);
  Shape s;
  EXPECT_EQ(f.read<float>("weights/w", &s), (std::vector<float>{1.5f, -2, 3, 4, 5, 6}));
  EXPECT_EQ(s, (Shape{2, 3}));
  EXPECT_EQ(f.read<int32_t>("/ids"), (std::vector<int32_t>{7, -8, 9}));
  EXPECT_EQ(f.read<int64_t>("offsets"), (std::vector<int64_t>{0, 1ll << 40}));
  EXPECT_EQ(f.read<uint8_t>("mask", &s), (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(s, (Shape{2, 2}));
  EXPECT_EQ(f.read<uint16_t>("tokens"), (std::vector<uint16_t>{65535, 0, 42}));
  EXPECT_EQ(f.read<float>("scalar", &s), std::vector<float>{3.25f});
  EXPECT_EQ(s, Shape{});
  EXPECT_TRUE(f.read<float>("empty", &s).empty());
  EXPECT_EQ(s, (Shape{0, 4}));
  EXPECT_EQ(f.elem_type("tokens"), H5ElemType::u16);
  EXPECT_EQ(f.list("/"), (std::vector<std::string>{"empty", "ids", "mask", "offsets", "scalar", "tokens", "weights"}));
  EXPECT_EQ(f.list("weights"), std::vector<std::string>{"w"});
  EXPECT_TRUE(f.exists("weights"));
  EXPECT_FALSE(f.is_dataset("weights"));
  EXPECT_TRUE(f.is_dataset("weights/w"));
  EXPECT_FALSE(f.exists("weights/nope/deeper"));
}

TEST(Hdf5File, AttributesRoundTrip) {
  TempDir dir;
  auto p = dir / "ckpt.h5";
  {
    Hdf5File f = Hdf5File::create(p);
    f.create_group("adapter/layers");
    f.create_group("adapter");  // existing: fine
    f.write("adapter/layers/a", std::vector<float>{1, 2}, {2});
    f.set_attr("/", "format", "lmtune-checkpoint");
    f.set_attr("/", "format_version", int64_t(3));
    f.set_attr("adapter", "lora_alpha", 16.0);
    f.set_attr("adapter/layers/a", "note", std::string("ünïcode ✓"));
    f.set_attr("/", "format_version", int64_t(4));  // replaces
  }
  Hdf5File f = Hdf5File::open(p);
  EXPECT_EQ(f.attr_string("/", "format"), "lmtune-checkpoint");
  EXPECT_EQ(f.attr_int("/", "format_version"), 4);
  EXPECT_DOUBLE_EQ(f.attr_double("adapter", "lora_alpha"), 16.0);
  EXPECT_DOUBLE_EQ(f.attr_double("/", "format_version"), 4.0);
  EXPECT_EQ(f.attr_string("adapter/layers/a", "note"), "ünïcode ✓");
  EXPECT_TRUE(f.has_attr("/", "format"));
  EXPECT_FALSE(f.has_attr("/", "missing"));
  EXPECT_FALSE(f.has_attr("/nope", "format"));
  std::string msg = file_error_message([&] { f.attr_string("adapter", "missing"); });
  EXPECT_NE(msg.find("ckpt.h5: attribute 'missing' not found on '/adapter'"), std::string::npos) << msg;
  msg = file_error_message([&] { f.attr_int("adapter", "lora_alpha"); });
  EXPECT_NE(msg.find("attribute 'lora_alpha' on '/adapter' is not an integer"), std::string::npos) << msg;
  msg = file_error_message([&] { f.attr_string("/", "format_version"); });
  EXPECT_NE(msg.find("is not a string"), std::string::npos) << msg;
  msg = file_error_message([&] { f.attr_string("/nowhere", "x"); });
  EXPECT_NE(msg.find("not found on '/nowhere'"), std::string::npos) << msg;
}

TEST(Hdf5File, AppendableMetrics) {
  TempDir dir;
  auto p = dir / "metrics.h5";
  {
    Hdf5File f = Hdf5File::create(p);
    f.create_appendable<int64_t>("metrics/step", 4);
    f.create_appendable<float>("metrics/loss", 4);
    for (int64_t step = 0; step < 10; ++step) {
      f.append("metrics/step", std::vector<int64_t>{step});
      f.append("metrics/loss", std::vector<float>{1.0f / float(step + 1)});
    }
    f.append("metrics/loss", std::vector<float>{});  // no-op
  }
  {
    Hdf5File f = Hdf5File::open(p, /*writable=*/true);  // reopen and keep appending
    f.append("metrics/step", std::vector<int64_t>{10, 11});
    f.append("metrics/loss", std::vector<float>{0.05f, 0.04f});
    std::string msg = file_error_message([&] { f.append("metrics/loss", std::vector<int32_t>{1}); });
    EXPECT_NE(msg.find("dataset '/metrics/loss' holds f32 data, cannot append i32"), std::string::npos) << msg;
  }
  Hdf5File f = Hdf5File::open(p);
  std::vector<int64_t> steps = f.read<int64_t>("metrics/step");
  ASSERT_EQ(steps.size(), 12u);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(steps[size_t(i)], i);
  std::vector<float> loss = f.read<float>("metrics/loss");
  ASSERT_EQ(loss.size(), 12u);
  EXPECT_FLOAT_EQ(loss[3], 0.25f);
  EXPECT_FLOAT_EQ(loss[11], 0.04f);
}

TEST(Hdf5File, ClearErrors) {
  TempDir dir;
  auto p = dir / "errors.h5";
  Hdf5File f = Hdf5File::create(p);
  f.write("a/x", std::vector<float>{1, 2}, {2});
  f.write("fixed", std::vector<float>{1, 2}, {2});
  std::string msg = file_error_message([&] { f.read<float>("a/missing"); });
  EXPECT_NE(msg.find("errors.h5: dataset '/a/missing' not found"), std::string::npos) << msg;
  msg = file_error_message([&] { f.read<float>("nope/deeper/x"); });
  EXPECT_NE(msg.find("dataset '/nope/deeper/x' not found"), std::string::npos) << msg;
  msg = file_error_message([&] { f.read<int32_t>("a/x"); });
  EXPECT_NE(msg.find("dataset '/a/x' holds f32 data, not i32"), std::string::npos) << msg;
  msg = file_error_message([&] { f.write("a/x", std::vector<float>{1}, {1}); });
  EXPECT_NE(msg.find("dataset '/a/x' already exists"), std::string::npos) << msg;
  msg = file_error_message([&] { f.write("b", std::vector<float>{1, 2, 3}, {2, 2}); });
  EXPECT_NE(msg.find("dataset '/b': 3 values do not match shape [2, 2]"), std::string::npos) << msg;
  msg = file_error_message([&] { f.read<float>("a"); });
  EXPECT_NE(msg.find("dataset '/a'"), std::string::npos) << msg;
  msg = file_error_message([&] { f.append("fixed", std::vector<float>{3}); });
  EXPECT_NE(msg.find("dataset '/fixed'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot grow"), std::string::npos) << msg;
  msg = file_error_message([&] { f.create_group("a/x"); });
  EXPECT_NE(msg.find("exists and is a dataset"), std::string::npos) << msg;
  msg = file_error_message([&] { f.list("zzz"); });
  EXPECT_NE(msg.find("group '/zzz' not found"), std::string::npos) << msg;
}

TEST(Hdf5File, MissingAndCorruptedFiles) {
  TempDir dir;
  std::string msg = file_error_message([&] { Hdf5File::open(dir / "missing.h5"); });
  EXPECT_NE(msg.find("missing.h5: no such file"), std::string::npos) << msg;

  write_file_atomic(dir / "text.h5", std::string_view("this is not an HDF5 file at all"));
  msg = file_error_message([&] { Hdf5File::open(dir / "text.h5"); });
  EXPECT_NE(msg.find("text.h5: not an HDF5 file"), std::string::npos) << msg;

  // A real file cut in half: opening or reading must fail cleanly.
  auto good = dir / "good.h5";
  {
    Hdf5File f = Hdf5File::create(good);
    std::vector<float> big(20000, 1.0f);
    f.write("big", big, {20000});
    f.set_attr("/", "k", "v");
  }
  std::string bytes = read_file_text(good);
  auto cut = dir / "cut.h5";
  write_file_atomic(cut, std::string_view(bytes).substr(0, bytes.size() / 2));
  msg = file_error_message([&] {
    Hdf5File f = Hdf5File::open(cut);
    f.read<float>("big");
  });
  EXPECT_NE(msg.find("cut.h5"), std::string::npos) << msg;

  // Garbage over the data and metadata after the superblock.
  std::string mangled = bytes;
  for (size_t i = 200; i < mangled.size(); i += 7) mangled[i] = char(0xA5);
  auto bad = dir / "mangled.h5";
  write_file_atomic(bad, mangled);
  try {
    Hdf5File f = Hdf5File::open(bad);
    f.read<float>("big");
    f.attr_string("/", "k");
    // Damage confined to raw data can go unnoticed (HDF5 has no data checksums by default); that is fine.
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("mangled.h5"), std::string::npos) << e.what();
  }
}

TEST(Hdf5File, AtomicSave) {
  TempDir dir;
  auto p = dir / "state.h5";
  save_hdf5_atomic(p, [](Hdf5File& f) { f.write("v", std::vector<int32_t>{1}, {1}); });
  EXPECT_EQ(Hdf5File::open(p).read<int32_t>("v"), std::vector<int32_t>{1});
  // A failing fill leaves the previous file and no temporary behind.
  EXPECT_THROW(save_hdf5_atomic(p,
                                [](Hdf5File& f) {
                                  f.write("v", std::vector<int32_t>{2}, {1});
                                  throw FileError("simulated failure");
                                }),
               FileError);
  EXPECT_EQ(Hdf5File::open(p).read<int32_t>("v"), std::vector<int32_t>{1});
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
  save_hdf5_atomic(p, [](Hdf5File& f) { f.write("v", std::vector<int32_t>{3}, {1}); });
  EXPECT_EQ(Hdf5File::open(p).read<int32_t>("v"), std::vector<int32_t>{3});
}

// Flips `n` bytes of `file` starting where `needle` first occurs (which must be present).
void flip_bytes_at(const std::filesystem::path& file, const std::string& needle, size_t n) {
  std::string bytes = read_file_text(file);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos) << "pattern not found in " << file;
  for (size_t i = at; i < at + n && i < bytes.size(); ++i) bytes[i] = char(~bytes[i]);
  write_bytes(file, bytes);
}

std::filesystem::path sealed_file(const TempDir& dir, const std::string& name, const std::vector<float>& w) {
  auto p = dir / name;
  save_hdf5_atomic(p, [&](Hdf5File& f) {
    f.write("params/w", w, {int64_t(w.size())});
    f.write("params/ids", std::vector<int64_t>{7, 8, 9}, {3});
    f.set_attr("/", "recipe", "model: some/long-enough-recipe-text");
    f.set_attr("/", "step", int64_t(12));
    f.set_attr("params", "lr", 0.25);
    f.seal();
  });
  return p;
}

TEST(Hdf5File, SealDetectsDamagedDataAndAttributes) {
  TempDir dir;
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * float(i) + 0.5f;
  const std::string w_bytes(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));

  auto good = sealed_file(dir, "good.h5", w);
  Hdf5File::open(good).verify_seal();
  EXPECT_EQ(Hdf5File::open(good).read<float>("params/w"), w);

  // 64 flipped bytes inside the data: HDF5 itself reads them as (huge) values; the seal must not.
  auto data = sealed_file(dir, "data.h5", w);
  flip_bytes_at(data, w_bytes.substr(32, 16), 64);
  std::string msg = file_error_message([&] { Hdf5File::open(data).verify_seal(); });
  EXPECT_NE(msg.find("data.h5: dataset '/params/w': checksum mismatch"), std::string::npos) << msg;
  msg = file_error_message([&] { Hdf5File::open(data).read<float>("params/w"); });
  EXPECT_NE(msg.find("data.h5: dataset '/params/w': checksum mismatch"), std::string::npos) << msg;
  EXPECT_EQ(Hdf5File::open(data).read<int64_t>("params/ids"), (std::vector<int64_t>{7, 8, 9}));

  // A changed attribute value (a string in the global heap, which HDF5 does not checksum).
  auto attr = sealed_file(dir, "attr.h5", w);
  flip_bytes_at(attr, "long-enough", 1);
  msg = file_error_message([&] { Hdf5File::open(attr).verify_seal(); });
  EXPECT_NE(msg.find("attr.h5: attributes: checksum mismatch"), std::string::npos) << msg;

  // A file written without seal() cannot pass for a sealed one.
  auto plain = dir / "plain.h5";
  save_hdf5_atomic(plain, [&](Hdf5File& f) { f.write("w", w, {64}); });
  msg = file_error_message([&] { Hdf5File::open(plain).verify_seal(); });
  EXPECT_NE(msg.find("plain.h5: not sealed"), std::string::npos) << msg;
}

// What a full disk does to the writers, in a child process whose files may not grow past 16 KiB (RLIMIT_FSIZE with
// SIGXFSZ ignored: writes fail with EFBIG, as with ENOSPC). Returns 0 when every failure was a clean FileError
// naming the file and the cause, else a bit per failed expectation.
int full_disk_writes(const TempDir& dir) {
  int bad = 0;
  auto expect_clean = [&](int bit, const std::string& file, const std::function<void()>& f) {
    try {
      f();
      bad |= bit;
    } catch (const FileError& e) {
      const std::string msg = e.what();
      if (msg.find(file) == std::string::npos || msg.find("File too large") == std::string::npos) bad |= bit;
      if (std::count(msg.begin(), msg.end(), '\n') != 0) bad |= bit;
      std::fprintf(stderr, "%s\n", msg.c_str());
    }
  };
  expect_clean(1, "a.h5", [&] {
    save_hdf5_atomic(dir / "a.h5", [](Hdf5File& f) { f.write("big", std::vector<float>(20000, 1.0f), {20000}); });
  });
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) bad |= 2;  // the temporary is removed
  expect_clean(4, "m.h5", [&] {
    Hdf5File f = Hdf5File::create(dir / "m.h5");
    f.create_appendable<float>("x", 256);
    for (int i = 0; i < 1000; ++i) {
      f.append<float>("x", std::vector<float>(64, 1.0f));
      f.flush();
    }
  });
  return bad;
}

TEST(Hdf5File, FullDiskFailsCleanlyAndTheProcessExitsNormally) {
  TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{16384, 16384};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(99);
    // exit(), not _Exit(): HDF5's own clean-up at exit is where a mishandled failure used to crash.
    std::exit(10 + full_disk_writes(dir));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_FALSE(WIFSIGNALED(status)) << "child killed by signal " << WTERMSIG(status);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 99) << "setrlimit failed";
  EXPECT_EQ(WEXITSTATUS(status), 10) << "failed expectations (bits): " << WEXITSTATUS(status) - 10;
}

}  // namespace
}  // namespace lmtune
