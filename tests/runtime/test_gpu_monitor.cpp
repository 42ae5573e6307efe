// GpuMonitor against a fake NVML library (tests/runtime/fake_nvml.c) and without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "runtime/telemetry/gpu_monitor.h"

namespace ringtrain::runtime {
namespace {

TEST(GpuMonitor, MissingLibraryIsReportedNotThrown) {
  GpuMonitor m("0000:65:00.0", 0, "/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(m.available());
  EXPECT_NE(m.reason().find("NVML library '/nonexistent/libnvidia-ml.so.1' not loaded"), std::string::npos)
      << m.reason();
  EXPECT_FALSE(m.sample().has_value());
}

TEST(GpuMonitor, ReadsTheDeviceAtItsPciBusId) {
  GpuMonitor m("0000:65:00.0", 3, RINGTRAIN_FAKE_NVML);
  ASSERT_TRUE(m.available()) << m.reason();
  auto s = m.sample();
  ASSERT_TRUE(s.has_value()) << m.reason();
  EXPECT_EQ(s->util_pct, 87);
  EXPECT_EQ(s->mem_used_bytes, 12.0 * (1ull << 30));
  EXPECT_EQ(s->mem_total_bytes, 150.0 * (1ull << 30));
  EXPECT_EQ(s->temperature_c, 61);
  EXPECT_DOUBLE_EQ(s->power_w, 412.5);
}

TEST(GpuMonitor, AnUnsupportedQueryLeavesOnlyItsFieldEmpty) {
  GpuMonitor m("0000:65:00.0", 0, RINGTRAIN_FAKE_NVML);
  ASSERT_TRUE(m.available()) << m.reason();
  setenv("FAKE_NVML_NO_POWER", "1", 1);
  auto s = m.sample();
  unsetenv("FAKE_NVML_NO_POWER");
  ASSERT_TRUE(s.has_value()) << m.reason();
  EXPECT_TRUE(std::isnan(s->power_w));
  EXPECT_EQ(s->util_pct, 87);
  EXPECT_EQ(s->temperature_c, 61);
}

TEST(GpuMonitor, UnknownDeviceNamesIt) {
  GpuMonitor by_bus("0000:17:00.0", 0, RINGTRAIN_FAKE_NVML);
  EXPECT_FALSE(by_bus.available());
  EXPECT_NE(by_bus.reason().find("no device at PCI bus id 0000:17:00.0: Not Found"), std::string::npos)
      << by_bus.reason();
  GpuMonitor by_index("", 2, RINGTRAIN_FAKE_NVML);
  EXPECT_NE(by_index.reason().find("no device index 2"), std::string::npos) << by_index.reason();
  GpuMonitor index0("", 0, RINGTRAIN_FAKE_NVML);
  EXPECT_TRUE(index0.available()) << index0.reason();
}

TEST(GpuMonitor, LibraryWithoutNvmlSymbolsNamesTheMissingOne) {
  GpuMonitor m("", 0, "libz.so.1");  // loads, but is not NVML
  EXPECT_FALSE(m.available());
  EXPECT_NE(m.reason().find("lacks nvmlInit_v2"), std::string::npos) << m.reason();
}

}  // namespace
}  // namespace ringtrain::runtime
