// Tests for core/device.h: parsing and naming devices, clean "no CUDA device" detection.
#include <gtest/gtest.h>

#include "core/check.h"
#include "core/device.h"
#include "core/ops.h"
#include "test_util.h"

namespace ringtrain {
namespace {

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", ""}) {
    try {
      parse_device(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, DetectionNeverCrashesAndExplainsAbsence) {
  const CudaStatus& status = cuda_status();
  EXPECT_EQ(status.built_with_cuda, RINGTRAIN_WITH_CUDA == 1);
  EXPECT_EQ(cuda_device_count(), status.device_count);
  EXPECT_EQ(static_cast<int>(status.devices.size()), status.device_count);
  if (status.device_count == 0) {
    EXPECT_FALSE(cuda_available());
    EXPECT_FALSE(status.reason.empty());
  } else {
    EXPECT_GT(status.devices[0].total_memory_bytes, 0);
    EXPECT_GE(status.devices[0].compute_major, 7);
  }
  if (status.built_with_cuda) {
    // The CUDA build links and queries cuDNN, cuBLAS and NCCL even without a device.
    EXPECT_GT(status.runtime_version, 0);
    EXPECT_GT(status.cudnn_version, 0);
    EXPECT_GT(status.nccl_version, 0);
  }
}

TEST(Device, CudaTensorWithoutDeviceIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  try {
    Tensor::zeros(Shape{2}, DType::F32, Device::cuda(0));
    FAIL() << "allocated on a missing device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

TEST(Device, StreamsAndEventsWithoutDeviceAreErrorsNotCrashes) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this checks the no-device path";
  EXPECT_THROW(Stream::create(Device::cuda(0)), Error);
  EXPECT_THROW(set_current_device(Device::cuda(0)), Error);
  EXPECT_NO_THROW(set_current_device(Device::cpu()));
  EXPECT_EQ(current_stream().handle(), nullptr);
}

}  // namespace
}  // namespace ringtrain
