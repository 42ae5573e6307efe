// tests/io/test_hdf5.cpp: H5_CHECK, the HDF5 adapter of the checking macros (io/hdf5.h).
#include <gtest/gtest.h>

#include "io/hdf5.h"

namespace ringtrain {
namespace {

TEST(Check, H5CheckTranslatesHdf5ErrorStack) {
  h5::silence_errors();
  try {
    H5_CHECK(H5Fopen("/nonexistent/ringtrain-missing.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "no exception";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("HDF5 error"), std::string::npos) << what;
    EXPECT_NE(what.find("H5Fopen(\"/nonexistent/ringtrain-missing.h5\""), std::string::npos) << what;
    EXPECT_NE(what.find("unable to open file"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ringtrain
