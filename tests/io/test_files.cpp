// tests/io/test_files.cpp: io::clobber_problem, what no output may be written over: an HDF5 file (wherever its
// signature sits), and for an appended log any file that is not a ringtrain log.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "io/files.h"
#include "io/hdf5.h"

namespace ringtrain::io {
namespace {
namespace fs = std::filesystem;

fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("rt_files_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// An HDF5 file with `userblock` bytes before its signature (0: none).
void write_hdf5(const fs::path& p, hsize_t userblock) {
  const std::lock_guard<std::recursive_mutex> guard(h5::lock());
  const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (userblock > 0) H5Pset_userblock(fcpl, userblock);
  const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Fclose(f);
  H5Pclose(fcpl);
}

TEST(ClobberProblem, AnHdf5FileIsNeverWrittenOverWhereverItsSignatureSits) {
  const fs::path dir = scratch();
  write_hdf5(dir / "plain.h5", 0);
  write_hdf5(dir / "userblock.h5", 512);
  for (const char* name : {"plain.h5", "userblock.h5"})
    for (bool append : {false, true}) {
      const std::string e = clobber_problem("--trace", (dir / name).string(), append);
      EXPECT_NE(e.find("--trace '" + (dir / name).string() + "' is an HDF5 file"), std::string::npos) << name << e;
    }
  fs::remove_all(dir);
}

TEST(ClobberProblem, AnAppendedLogGoesOnlyOntoARingtrainLog) {
  const fs::path dir = scratch();
  write_text(dir / "run.jsonl", "{\"type\": \"plan\", \"program\": \"train_resnet\"}\n");
  write_text(dir / "manifest.json", "{\n  \"train\": {}\n}\n");
  write_text(dir / "notes.txt", "some notes\n");
  EXPECT_EQ(clobber_problem("--log-jsonl", (dir / "run.jsonl").string(), true), "");
  EXPECT_EQ(clobber_problem("--log-jsonl", (dir / "missing.jsonl").string(), true), "");
  EXPECT_EQ(clobber_problem("--trace", (dir / "notes.txt").string(), false), "");  // replaced, not appended to
  for (const char* name : {"manifest.json", "notes.txt"})
    EXPECT_NE(clobber_problem("--log-jsonl", (dir / name).string(), true), "") << name;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::io
