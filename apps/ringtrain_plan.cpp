// apps/ringtrain_plan: train_resnet's flags (apps/model_app.h), and what --layout auto would choose for them,
// printed without training; with --hosts, --ranks-per-host, --link and --device-memory it answers for a world it
// does not run in (runtime/layout/layout_probe.h):
//   ./ringtrain_plan --synthetic -a resnet50 --image-size 64 --global-batch 1024 --hosts 64 --ranks-per-host 8
//       --link 100Gbit --device-memory 80G --scaling
#include <CLI/CLI.hpp>
#include <string>

#include "apps/model_app.h"
#include "comm/world.h"
#include "core/check.h"
#include "runtime/config/cli.h"
#include "runtime/layout/layout_probe.h"

using namespace ringtrain;

namespace {

// ringtrain_plan's own flags: the world to plan for, where it is not the one it runs in.
void add_what_if_flags(CLI::App& app, runtime::LayoutWhatIf& w) {
  runtime::add_number(app, "--hosts", w.hosts, "plan for this many hosts (0: the hosts it runs on)", 0, 1 << 20);
  runtime::add_number(app, "--ranks-per-host", w.ranks_per_host,
                      "plan for this many ranks on each host (0: as many as it runs with)", 0, 1 << 16);
  app.add_option_function<std::string>(
      "--link", [&w](const std::string& v) { w.link_rate = runtime::parse_link_rate(v, "--link"); },
      "the link between hosts: 100Gbit, 25Gbps, 10GB/s (default: measured between the hosts it runs on, else "
      "--link-calibration's)");
  app.add_option_function<std::string>(
      "--link-latency", [&w](const std::string& v) { w.link_latency = runtime::parse_latency(v, "--link-latency"); },
      "the latency between hosts a message pays: 20us, 0.1ms (default: measured, else the calibration's)");
  app.add_option_function<std::string>(
      "--intra-link", [&w](const std::string& v) { w.intra_rate = runtime::parse_link_rate(v, "--intra-link"); },
      "the link between the ranks of one host (NVLink: 400GB/s; default: measured)");
  app.add_option_function<std::string>(
      "--intra-latency", [&w](const std::string& v) { w.intra_latency = runtime::parse_latency(v, "--intra-latency"); },
      "the latency between the ranks of one host (default: measured)");
  runtime::add_bytes(app, "--device-memory", w.device_memory,
                     "each rank's memory budget (80G; default: --max-memory, else this machine's)", 1);
  app.add_option("--save-link", w.save_link,
                 "write the link measured between the ranks it runs on here, for --link-calibration");
  app.add_flag("--scaling", w.scaling,
               "also the best layout on 1, 2, 4, ... hosts up to --hosts, as many images a rank (weak scaling): "
               "speed-up, efficiency, communication share, from the same measurements");
}
}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "The layout --layout auto would choose for train_resnet's flags, printed without training; "
      "--hosts, --ranks-per-host, --link and --device-memory ask about a world it does not run in"};
  runtime::TrainerOptions options;
  options.program = "ringtrain_plan";
  std::string data_dir;
  apps::ModelFlags f;
  runtime::LayoutWhatIf what_if;
  apps::add_model_flags(app, options, data_dir, f);
  add_what_if_flags(app, what_if);
  RT_PARSE_FLAGS(app, argc, argv);
  RT_CHECK(app.count("--layout") == 0 || options.layout_auto, "ringtrain_plan plans the layout: --layout given does ",
           "not apply to it");
  options.layout_auto = true;
  if (!what_if.save_link.empty()) options.written_files.emplace_back("--save-link", what_if.save_link);
  return comm::run_main(argc, argv, runtime::kTrainerMemoryHint, [&](comm::World& world) {
    apps::ModelRun run = apps::prepare_run(world, options, data_dir, f);
    run.trainer->plan_layout(*run.model, *run.data, what_if);
    return 0;
  });
} catch (...) {
  return runtime::main_error("ringtrain_plan", runtime::kTrainerMemoryHint);  // no exception escapes main
}
