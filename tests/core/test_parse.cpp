// tests/core/test_parse.cpp: numbers from text are read exactly or refused (core/parse.h); the flags built
// on them (runtime/config/cli.h) are swept program by program in tests/apps/flag_sweep.py.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/parse.h"

using namespace ringtrain;

TEST(Parse, IntegersAreReadExactlyOrRefused) {
  EXPECT_EQ(to_number<uint64_t>("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(to_number<uint64_t>("18446744073709551616"), std::nullopt);  // saturated before
  EXPECT_EQ(to_number<uint64_t>("-1"), std::nullopt);                    // wrapped to 2^64-1 before
  EXPECT_EQ(to_number<int>("4294967301"), std::nullopt);                 // truncated to 5 before
  EXPECT_EQ(to_number<int>("-2147483648"), std::numeric_limits<int>::min());
  EXPECT_EQ(to_number<int>("010"), 10);  // decimal, never octal
  for (const char* bad : {"", " 5", "5 ", "+5", "0x10", "1e3", "1.0", "abc", "5a", "-", "nan"})
    EXPECT_EQ(to_number<int64_t>(bad), std::nullopt) << "'" << bad << "'";
}

TEST(Parse, FloatsAreFinite) {
  EXPECT_EQ(to_number<double>("1e3"), 1000.0);
  EXPECT_EQ(to_number<double>("-0.25"), -0.25);
  for (const char* bad : {"", "nan", "inf", "-inf", "1e309", "0x1p3", "1.5x", " 1", "+1"})
    EXPECT_EQ(to_number<double>(bad), std::nullopt) << "'" << bad << "'";
}

TEST(Parse, RangesNameTheFlagAndTheRange) {
  EXPECT_EQ(parse_number<int>("--threads", "64", {0, 1024}), 64);
  try {
    parse_number<int>("--threads", "4096", {0, 1024});
    FAIL() << "4096 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--threads: expected an integer in [0, 1024], got '4096'");
    EXPECT_TRUE(e.permanent());
  }
  EXPECT_EQ(number_problem<double>("0", {0.0, 1e6, true}), "expected a finite number in (0, 1e+06], got '0'");
  EXPECT_EQ(number_problem<double>("1e-9", {0.0, 1e6, true}), "");
}

TEST(Parse, ListsCheckEveryItem) {
  EXPECT_EQ(parse_number_list<int>("--pipeline-split", "0,9,18", {0, 1 << 20}), (std::vector<int>{0, 9, 18}));
  for (const char* bad : {"", "0,", ",0", "0,,9", "0,4294967301", "0;9", "0, 9"})
    EXPECT_THROW(parse_number_list<int>("--pipeline-split", bad, {0, 1 << 20}), Error) << "'" << bad << "'";
  try {
    parse_number_list<int>("--pipeline-split", "0,4294967301", {0, 1 << 20});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item 2 of '0,4294967301' is '4294967301'"), std::string::npos) << e.what();
  }
}

TEST(Parse, BytesTakeTheUnitsPeopleWrite) {
  EXPECT_EQ(parse_bytes("--max-memory", "512"), 512);
  EXPECT_EQ(parse_bytes("--max-memory", "1K"), 1024);
  EXPECT_EQ(parse_bytes("--max-memory", "1.5k"), 1536);
  EXPECT_EQ(parse_bytes("--max-memory", "8G"), int64_t{8} << 30);
  EXPECT_EQ(parse_bytes("--max-memory", "1g"), int64_t{1} << 30);
  EXPECT_EQ(parse_bytes("--max-memory", "2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("--max-memory", "300MB"), 300000000);
  EXPECT_EQ(parse_bytes("--max-memory", "300mb"), 300000000);
  EXPECT_EQ(parse_bytes("--max-memory", "16MiB"), int64_t{16} << 20);
  EXPECT_EQ(parse_bytes("--max-memory", "1e3"), 1000);
  EXPECT_EQ(parse_bytes("--max-memory", "2e3K"), 2048000);
  EXPECT_EQ(parse_bytes("--max-memory", "1T"), int64_t{1} << 40);
  for (const char* bad : {"", "abc", "-1", "nan", "inf", "1e30", "10XB", "0.5", "1.5B", "M", "9E", "1e19", "-5M"}) try {
      parse_bytes("--max-memory", bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--max-memory: ", 0), 0u) << e.what();
    }
}
