// tests/runtime/test_cli.cpp: the shared training flags (runtime/config/cli.h) as a user gives them: parsed into
// TrainerOptions, refused naming the flag, shown by --help, and recorded by the options (runtime/config/options.h).
// No MPI, no files.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/config/cli.h"
#include "runtime/config/options.h"
#include "test_util.h"

using namespace ringtrain;
using namespace ringtrain::runtime;

namespace {

// Parses `args` with the shared flags into `o`, as a Trainer app does; CLI11's errors pass through.
void parse_into(TrainerOptions& o, std::vector<std::string> args) {
  CLI::App app{"t"};
  std::string data;
  add_trainer_flags(app, o, data);
  args.insert(args.begin(), "t");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST(Tf32Flag, OnByDefaultAndOffLandsInTheOptions) {
  TrainerOptions on;
  parse_into(on, {"--data", "d"});
  EXPECT_TRUE(on.tf32);
  EXPECT_EQ(on.flags["tf32"], "on");
  TrainerOptions off;
  parse_into(off, {"--data", "d", "--tf32", "off"});
  EXPECT_FALSE(off.tf32);
  EXPECT_EQ(off.flags["tf32"], "off");  // what a checkpoint's "flags" keeps
  TrainerOptions last;
  parse_into(last, {"--tf32", "off", "--tf32", "on"});  // the last value wins, as for every flag
  EXPECT_TRUE(last.tf32);
}

TEST(Tf32Flag, ABadValueIsAUsageErrorNamingTheFlag) {
  TrainerOptions o;
  std::string message;
  try {
    parse_into(o, {"--tf32", "maybe"});
  } catch (const CLI::ParseError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("--tf32: maybe not in {on,off}"), std::string::npos) << "'" << message << "'";
  // The parser behind the flag names it too, with the values it takes.
  const std::string e = ringtrain::testing::error_of([] { parse_on_off("maybe", "--tf32"); });
  EXPECT_NE(e.find("--tf32: 'maybe' is not one of on, off"), std::string::npos) << e;
  EXPECT_TRUE(parse_on_off("on", "--tf32"));
  EXPECT_FALSE(parse_on_off("off", "--tf32"));
}

TEST(Tf32Flag, HelpShowsItsChoicesDefaultAndWhatItDoes) {
  CLI::App app{"t"};
  TrainerOptions o;
  std::string data;
  add_trainer_flags(app, o, data);
  const std::string help = app.help();
  EXPECT_NE(help.find("--tf32 TEXT:{on,off}=on"), std::string::npos) << help;
  EXPECT_NE(help.find("TF32 tensor cores"), std::string::npos) << help;
  // An app's own default shows as the default.
  CLI::App other{"t"};
  TrainerOptions own;
  own.tf32 = false;
  add_trainer_flags(other, own, data);
  EXPECT_NE(other.help().find("--tf32 TEXT:{on,off}=off"), std::string::npos) << other.help();
}

// The checkpoints' configuration and what the ranks must agree on carry it, as they carry --precision.
TEST(Tf32Flag, TheRecordedConfigurationCarriesIt) {
  TrainerOptions o;
  EXPECT_EQ(o.to_json()["tf32"], "on");
  o.tf32 = false;
  EXPECT_EQ(o.to_json()["tf32"], "off");
  EXPECT_EQ(rank_agreement(o)["tf32"], "off");
}
