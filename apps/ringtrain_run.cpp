// apps/ringtrain_run: the elastic supervisor. It launches a training job with mpirun and, when the job
// fails, finds out what failed, drops the hosts that are gone, and relaunches on the survivors from the
// newest complete checkpoint — keeping the global batch by raising --accum-steps — up to --max-restarts
// times; errors a restart cannot fix end the run at once:
//
//   ringtrain_run --hostfile hosts --np 8 --max-restarts 3 -- ./train_resnet --data /shards -a resnet50
//       --checkpoint-dir ckpt --checkpoint-every-min 10
//
// On the emulated cluster (scripts/cluster.sh) it runs inside node0 and takes the cluster's mpirun options:
//   scripts/cluster.sh exec node0 ./build/ringtrain_run --mpirun-args "$(scripts/cluster.sh mpirun-args)"
//       --np 2 -- ./build/train_resnet ...
// Inside a Slurm allocation without --hostfile the hosts are the allocation's (scontrol show hostnames).
//
// The job tells it what it needs through event lines (comm::kEventPrefix, only under a supervisor): its
// plan, each step, each checkpoint, and every rank's error with whether a restart can fix it. Hosts are
// probed through the same launch agent mpirun uses (--mca plm_rsh_agent, else ssh; srun under Slurm).
// The decisions live in runtime/tools/supervisor.h; this file drives the processes. Every restart is one line on
// stdout and a record in the JSONL log (the job's --log-jsonl unless --log-jsonl is given here).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "core/parse.h"
#include "io/files.h"
#include "runtime/cluster/process.h"
#include "runtime/config/cli.h"
#include "runtime/tools/supervisor.h"

using namespace ringtrain;
using namespace ringtrain::runtime::supervisor;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void say(const std::string& text) {
  std::printf("ringtrain_run: %s\n", text.c_str());
  std::fflush(stdout);
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string names(const std::vector<Host>& hosts) {
  std::vector<std::string> n;
  for (const auto& h : hosts) n.push_back(h.slots > 1 ? detail::str_cat(h.name, " (", h.slots, ")") : h.name);
  return join(n, ", ");
}

// A child process with its stdout and stderr on pipes (or /dev/null).
struct Child {
  pid_t pid = -1;
  int out = -1, err = -1;
};

Child spawn(const std::vector<std::string>& argv, bool capture) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (capture) RT_CHECK(::pipe(out) == 0 && ::pipe(err) == 0, "ringtrain_run: pipe failed: ", std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  RT_CHECK(pid >= 0, "ringtrain_run: fork failed: ", std::strerror(errno));
  if (pid == 0) {
    if (capture) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::close(out[0]);
      ::close(err[0]);
      ::close(out[1]);
      ::close(err[1]);
    } else {
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ringtrain_run: cannot run '%s': %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  Child c{pid, -1, -1};
  if (capture) {
    ::close(out[1]);
    ::close(err[1]);
    c.out = out[0];
    c.err = err[0];
  }
  return c;
}

int exit_status_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The liveness probe: `true` run on each host through the launch agent, all at once, `timeout_s` at most.
// Returns the hosts that did not answer.
std::vector<std::string> probe(const std::vector<Host>& hosts, const std::vector<std::string>& agent,
                               double timeout_s) {
  char self[256] = {0};
  ::gethostname(self, sizeof self - 1);
  std::vector<std::pair<std::string, pid_t>> running;
  std::vector<std::string> dead;
  for (const auto& h : hosts) {
    if (h.name == self || h.name == "localhost" || h.name == "127.0.0.1") continue;  // this host is alive
    std::vector<std::string> argv = agent;
    if (!agent.empty() && agent[0] == "srun")
      argv.push_back("--nodelist=" + h.name);
    else
      argv.push_back(h.name);
    argv.push_back("true");
    running.emplace_back(h.name, spawn(argv, false).pid);
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (auto& [name, pid] : running) {
    int status = 0;
    for (;;) {
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid) break;
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (status != 0) dead.push_back(name);
  }
  return dead;
}

struct Options {
  std::string hostfile, mpirun_args, mpirun = "mpirun", log_jsonl;
  int np = 0, max_restarts = 3, min_np = 1, max_np = 0;
  double restart_delay = 0, probe_timeout = 15;
  bool allow_batch_change = false;
  std::vector<std::string> command;
};

// The training command's flags, once its files and ringtrain_run's are checked: no output of the run (the
// restart log, the job's log, trace, checkpoint folder, --save-link) lands on anything it reads (--data's
// folder, --resume's checkpoint, --link-calibration, the hostfile) or on another output; the restart log may
// be the job's own --log-jsonl only (its default), and must be a JSON-lines log if it exists.
JobFlags checked_job_flags(const Options& o, const MpirunArgs& m) {
  JobFlags f = read_job_flags(o.command);
  const std::string job = "the training command's ";
  io::RunFiles files;
  files.reads("--hostfile", !o.hostfile.empty() ? o.hostfile : m.hostfile);
  for (const auto& [flag, path] : f.files) {
    if (flag == "--data")
      files.reads_folder(job + flag, path);
    else if (flag == "--link-calibration")
      files.reads(job + flag, path);
    else
      files.writes(job + flag, path);
  }
  files.reads(job + "--resume", f.resume == "auto" ? "" : f.resume);
  files.writes_folder(job + "--checkpoint-dir", f.checkpoint_dir);
  files.writes(job + "--log-jsonl", f.log_jsonl);
  files.writes("--log-jsonl", o.log_jsonl).may_share("--log-jsonl", job + "--log-jsonl");
  files.check();
  const std::string log = !o.log_jsonl.empty() ? o.log_jsonl : f.log_jsonl;
  if (const std::string p = io::clobber_problem(!o.log_jsonl.empty() ? "--log-jsonl" : job + "--log-jsonl", log, true);
      !p.empty())
    RT_THROW(p);
  return f;
}

// The hosts: --hostfile, else the hostfile inside --mpirun-args, else the Slurm allocation, else this host.
std::vector<Host> initial_hosts(const Options& o, const MpirunArgs& m, std::string& source) {
  const std::string file = !o.hostfile.empty() ? o.hostfile : m.hostfile;
  if (!file.empty()) {
    io::require_regular_file(file, "--hostfile");
    std::ifstream in(file);
    RT_CHECK(in.good(), "--hostfile: cannot read '", file, "'");
    std::stringstream text;
    text << in.rdbuf();
    source = "hostfile " + file;
    return parse_hostfile(text.str(), file);
  }
  if (const char* nodelist = std::getenv("SLURM_JOB_NODELIST")) {
    const std::string cmd = detail::str_cat("scontrol show hostnames '", nodelist, "'");
    std::FILE* p = ::popen(cmd.c_str(), "r");
    RT_CHECK(p, "ringtrain_run: cannot run scontrol to list the Slurm allocation's hosts");
    std::string text;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, p)) > 0;) text.append(buffer, n);
    RT_CHECK(::pclose(p) == 0, "ringtrain_run: '", cmd, "' failed");
    std::vector<Host> hosts = parse_hostfile(text, "scontrol show hostnames");
    const char* per_node = std::getenv("SLURM_NTASKS_PER_NODE");  // a number; else the ranks spread evenly
    const std::optional<int> given = per_node ? to_number<int>(per_node) : std::nullopt;
    const int slots =
        given && *given > 0 ? *given : (o.np + static_cast<int>(hosts.size()) - 1) / static_cast<int>(hosts.size());
    for (auto& h : hosts) h.slots = slots;
    source = detail::str_cat("the Slurm allocation (", nodelist, ")");
    return hosts;
  }
  char self[256] = {0};
  ::gethostname(self, sizeof self - 1);
  source = "this host";
  return {Host{self, std::max(o.np, o.max_np)}};
}

std::vector<std::string> probe_agent(const MpirunArgs& m) {
  if (!m.agent.empty()) {
    std::vector<std::string> agent = split_words(m.agent.substr(0, m.agent.find(':')));
    if (!agent.empty() && fs::path(agent[0]).filename() == "ssh")
      agent.insert(agent.begin() + 1, {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10"});
    return agent;
  }
  if (std::getenv("SLURM_JOB_ID")) return {"srun", "--nodes=1", "--ntasks=1", "--overlap", "--quiet"};
  return {"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
}

// A fresh folder under /tmp for the launches' hostfiles, removed with everything in it at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    char name[] = "/tmp/ringtrain_run.XXXXXX";
    RT_CHECK(::mkdtemp(name), "ringtrain_run: cannot make a folder under /tmp: ", std::strerror(errno));
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// The restart records. The file must take appends now: a log that cannot be written is an error before
// anything is launched, not a warning at the end of the run.
class Log {
 public:
  Log(const std::string& path, const std::string& flag) : path_(path), flag_(flag) {
    if (path_.empty()) return;
    io::require_regular_if_exists(path_, flag);
    std::ofstream out(path_, std::ios::app);
    if (!out.good())
      RT_THROW(flag, ": cannot append to '", path_, "': ", std::strerror(errno),
               fs::exists(fs::path(path_).parent_path().empty() ? fs::path(".") : fs::path(path_).parent_path())
                   ? ""
                   : " (its folder does not exist)");
  }
  // A record that cannot be written (a full disk) is said at once, and the run's exit status says it too
  // (lost()): it was a warning only when the open failed, and nothing when the write did.
  void write(json record) {
    if (path_.empty()) return;
    record["time"] = unix_now();
    try {
      io::write_text(path_, record.dump() + "\n", flag_, true);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ringtrain_run: error: %s: its '%s' record is lost\n", e.what(),
                   record.value("type", "").c_str());
      lost_ = true;
    }
  }
  bool lost() const { return lost_; }

 private:
  std::string path_, flag_;
  bool lost_ = false;
};

// One launch: runs mpirun, echoes the job's lines (not the event lines), and gathers what failed.
struct Launch {
  Failure failure;
  bool ok = false;
  int64_t resumed_step = -1;
  std::string resumed_from;
  json plan;
  Clock::time_point end, last_step_at, first_step_at;
  bool stepped = false;
  std::vector<std::pair<int64_t, Clock::time_point>> checkpoints;  // (step, when written)
  std::vector<std::pair<int64_t, std::string>> written;            // (step, path) of the same
  std::string mismatch;  // the relaunch resumed something else than announced: it was stopped
};

// on_plan: called with the job's plan (it tells where the job resumed); a non-empty answer stops the job.
Launch run_once(const std::vector<std::string>& argv, const std::function<void(Launch&)>& on_first_step,
                const std::function<std::string(const Launch&)>& on_plan) {
  Launch l;
  Child c = spawn(argv, true);
  std::string pending[2];
  bool open[2] = {true, true};
  bool forwarded = false;
  const auto forward_signal = [&] {  // a signal to the supervisor goes to mpirun, once
    if (g_signal && !forwarded) {
      ::kill(c.pid, g_signal.load());
      forwarded = true;
    }
  };
  auto handle = [&](const std::string& line, bool is_err) {
    if (auto e = parse_event(line)) {
      const std::string kind = (*e)["event"];
      if (kind == "plan") {
        l.failure.trained = true;
        l.plan = *e;
        l.resumed_step = e->value("step", int64_t{0});
        l.resumed_from = e->value("resumed_from", std::string());
        if (const std::string bad = on_plan(l); !bad.empty() && l.mismatch.empty()) {
          l.mismatch = bad;
          ::kill(c.pid, SIGTERM);  // stop it before it trains on from the wrong place
        }
      } else if (kind == "step") {
        l.failure.last_step = e->value("step", int64_t{-1});
        l.last_step_at = Clock::now();
        if (!l.stepped) {
          l.stepped = true;
          l.first_step_at = l.last_step_at;
          on_first_step(l);
        }
      } else if (kind == "checkpoint") {
        l.checkpoints.emplace_back(e->value("step", int64_t{-1}), Clock::now());
        l.written.emplace_back(e->value("step", int64_t{-1}), e->value("path", std::string()));
      } else if (kind == "error") {
        l.failure.errors.push_back(*e);
      }
      return;
    }
    std::FILE* to = is_err ? stderr : stdout;
    std::fprintf(to, "%s\n", line.c_str());
    std::fflush(to);
    // mpirun's own account of a lost daemon or a dead rank, for the restart line.
    if (l.failure.mpirun_says.empty() &&
        (line.find("mpirun noticed that") != std::string::npos || line.find("Remote daemon") != std::string::npos ||
         line.find("lost communication with a remote daemon") != std::string::npos)) {
      std::string text = line;
      text.erase(0, text.find_first_not_of(" \t"));
      while (!text.empty() && (text.back() == '.' || text.back() == ' ')) text.pop_back();
      l.failure.mpirun_says = "mpirun: " + text;
    }
  };
  while (open[0] || open[1]) {
    forward_signal();
    pollfd fds[2] = {{c.out, POLLIN, 0}, {c.err, POLLIN, 0}};
    if (!open[0]) fds[0].fd = -1;
    if (!open[1]) fds[1].fd = -1;
    if (::poll(fds, 2, 200) < 0) continue;  // EINTR from a signal: forwarded above
    for (int k = 0; k < 2; ++k) {
      if (!open[k] || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[65536];
      const ssize_t n = ::read(k == 0 ? c.out : c.err, buffer, sizeof buffer);
      if (n <= 0) {
        open[k] = false;
        if (!pending[k].empty()) handle(pending[k], k == 1);
        continue;
      }
      pending[k].append(buffer, static_cast<size_t>(n));
      for (size_t nl; (nl = pending[k].find('\n')) != std::string::npos;) {
        handle(pending[k].substr(0, nl), k == 1);
        pending[k].erase(0, nl + 1);
      }
    }
  }
  ::close(c.out);
  ::close(c.err);
  int status = 0;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) forward_signal();
  l.end = Clock::now();
  l.failure.exit_status = exit_status_of(status);
  l.ok = l.failure.exit_status == 0;
  return l;
}

// Time the failures cost: from a failure to the relaunch's first step, and the work since the checkpoint
// resumed that a failed launch threw away.
struct TimeLost {
  double recovery_s = 0, lost_work_s = 0;
  double total_s() const { return recovery_s + lost_work_s; }
};

double tenths(double s) { return static_cast<double>(std::lround(s * 10)) / 10.0; }

// The work of launch `x` since the checkpoint of `resume_step` (lost once it fails).
double work_lost_s(const Launch& x, int64_t resume_step) {
  if (!x.stepped) return 0.0;
  for (auto it = x.checkpoints.rbegin(); it != x.checkpoints.rend(); ++it)
    if (it->first == resume_step) return std::max(0.0, seconds(x.last_step_at - it->second));
  return seconds(x.last_step_at - x.first_step_at);  // from this launch's first step (an approximation)
}

// How the run ends: exit code, the final record's outcome, and the reason printed.
struct Stop {
  int code = 1;
  std::string outcome, why;
};

// How a failed launch is followed: a world on the surviving hosts, from the newest checkpoint.
struct Relaunch {
  std::vector<Host> hosts;  // every host that answered the probe
  World world;
  std::vector<std::string> dropped, back;  // hosts left out of / back in the relaunch
  ResumePoint resume;                      // where it starts: announced, then checked
};

// The elastic supervisor: launches, reads what failed, decides, relaunches. run() is the loop; what it
// knows of the run across launches is below.
class Supervisor {
 public:
  explicit Supervisor(Options o);
  int run();

 private:
  std::vector<std::string> launch_argv(int attempt, const fs::path& hostfile) const;
  void recovered(int attempt, const Launch& now);
  std::vector<std::string> probe_hosts(Failure& f) const;
  std::variant<Stop, Relaunch> decide(int attempt, const Launch& l, const std::vector<std::string>& dead,
                                      const std::string& what);
  void relaunch(int attempt, const Launch& l, const Relaunch& r, const std::string& what);
  int finished();
  int stop(const Stop& s);

  // Fixed for the run.
  Options o_;
  const MpirunArgs m_;
  const JobFlags flags_;
  std::string source_;  // where the hosts came from
  std::vector<Host> all_hosts_;
  const std::vector<std::string> agent_;
  Log log_;
  TempDir state_;
  // The run as it goes.
  std::vector<Host> alive_;
  int np_ = 0;
  int64_t accum_ = 1;
  int stages_ = 1;  // --pipeline-stages of the next launch
  bool batch_changed_ = false;
  int64_t base_micro_ = 0;           // per-rank batches per optimizer step (ranks x accum) of the first launch
  std::optional<Failure> previous_;  // of the launch before the last
  int restarts_ = 0;
  ResumePoint resume_;  // the newest checkpoint any launch of this run resumed or wrote
  std::string token_;   // RINGTRAIN_SUPERVISOR: this supervisor, for the folder lock's takeover
  Launch failed_;       // the launch that failed last (when it ended, its last step)
  TimeLost lost_;
};

Supervisor::Supervisor(Options o)
    : o_(std::move(o)),
      m_(parse_mpirun_args(split_words(o_.mpirun_args))),
      flags_(checked_job_flags(o_, m_)),
      agent_(probe_agent(m_)),
      log_(!o_.log_jsonl.empty() ? o_.log_jsonl : flags_.log_jsonl,
           !o_.log_jsonl.empty() ? "--log-jsonl" : "the training command's --log-jsonl") {
  if (o_.max_np == 0) o_.max_np = o_.np;
  RT_CHECK(o_.min_np <= o_.np && o_.np <= o_.max_np, "--min-np ", o_.min_np, " <= --np ", o_.np, " <= --max-np ",
           o_.max_np, " does not hold");
  RT_CHECK(o_.max_restarts == 0 || !flags_.checkpoint_dir.empty(),
           "the training command has no --checkpoint-dir: a restart would begin the training again from step 0; give "
           "it one (with --checkpoint-every or --checkpoint-every-min to bound the work a failure loses), or pass "
           "--max-restarts 0");
  all_hosts_ = initial_hosts(o_, m_, source_);
  RT_CHECK(total_slots(all_hosts_) >= o_.np, "--np ", o_.np, " needs ", o_.np, " slots but ", source_, " gives ",
           total_slots(all_hosts_), " (", names(all_hosts_), ")");
  alive_ = all_hosts_;
  token_ = detail::str_cat(runtime::this_host(), ":", ::getpid(), ":", static_cast<int64_t>(unix_now()));
  np_ = o_.np;
  accum_ = flags_.accum;
  stages_ = flags_.stages;
  RT_CHECK(o_.np % stages_ == 0, "--np ", o_.np, " is no multiple of the training command's --pipeline-stages ",
           stages_, " (every stage needs the same number of replicas)");
  base_micro_ = static_cast<int64_t>(o_.np / stages_) * flags_.accum;
}

// Launch, and after a failure decide and relaunch, until the job finishes or a stop is decided.
int Supervisor::run() {
  for (int attempt = 0;; ++attempt) {
    const std::vector<Host> use = hosts_for(alive_, np_);
    const fs::path hostfile = state_.path / detail::str_cat("hosts.", attempt);
    std::ofstream(hostfile) << hostfile_text(use);
    if (attempt == 0)
      say(detail::str_cat("launching ", np_, " rank(s) on ", names(use), " (from ", source_, "), up to ",
                          o_.max_restarts, " restart(s)"));
    const ResumePoint announced = attempt == 0 ? ResumePoint{} : resume_;
    Launch l = run_once(
        launch_argv(attempt, hostfile), [&](Launch& now) { recovered(attempt, now); },
        [&](const Launch& now) {
          return attempt == 0 ? std::string() : check_resumed(announced, flags_, now.resumed_from, now.resumed_step);
        });
    resume_ = newest_resume_point(resume_, l.resumed_from, l.failure.trained ? l.resumed_step : -1, l.written);
    if (l.failure.trained && attempt == 0 && l.plan.contains("world_size") && l.plan.contains("accum_steps"))
      base_micro_ =
          l.plan.value("replicas", l.plan["world_size"].get<int64_t>()) * l.plan["accum_steps"].get<int64_t>();
    if (!l.mismatch.empty())
      return stop({3, "failed", detail::str_cat("not restarting: ", l.mismatch, " — a permanent error")});
    if (l.ok) return finished();
    if (g_signal)
      return stop(
          {128 + g_signal, "interrupted",
           detail::str_cat("stopped by signal ", g_signal.load(), " (", strsignal(g_signal), "); not restarting")});
    const std::vector<std::string> dead = probe_hosts(l.failure);
    const std::string what = describe(l.failure);
    const std::variant<Stop, Relaunch> next = decide(attempt, l, dead, what);
    if (const Stop* s = std::get_if<Stop>(&next)) return stop(*s);
    relaunch(attempt, l, std::get<Relaunch>(next), what);
    // The delay ends early on a signal: a SIGTERM must not wait it out.
    const auto until = Clock::now() + std::chrono::duration<double>(o_.restart_delay);
    while (!g_signal && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_signal)
      return stop({128 + g_signal, "interrupted",
                   detail::str_cat("stopped by signal ", g_signal.load(), " before the relaunch; not restarting")});
  }
}

// mpirun on the launch's hosts, under the supervisor, then the job's command with this launch's flags.
std::vector<std::string> Supervisor::launch_argv(int attempt, const fs::path& hostfile) const {
  std::vector<std::string> argv = {o_.mpirun};
  argv.insert(argv.end(), m_.rest.begin(), m_.rest.end());
  for (const std::string& a : {std::string("--hostfile"), hostfile.string(), std::string("-np"), std::to_string(np_),
                               std::string("-x"), std::string("RINGTRAIN_SUPERVISOR=") + token_, std::string("-x"),
                               detail::str_cat("RINGTRAIN_RESTART=", attempt)})
    argv.push_back(a);
  const std::vector<std::string> command =
      relaunch_command(o_.command, flags_, accum_, attempt > 0 ? resume_ : ResumePoint{}, batch_changed_, stages_);
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

// A relaunch's first step: how long the recovery took, from the failed job's end and from its last step.
void Supervisor::recovered(int attempt, const Launch& now) {
  if (attempt == 0) return;
  const double from_end = seconds(now.first_step_at - failed_.end);
  const bool stepped = failed_.failure.last_step >= 0;
  const double from_step = stepped ? seconds(now.first_step_at - failed_.last_step_at) : from_end;
  lost_.recovery_s += from_step;
  say(detail::str_cat(
      "restart ", attempt, " is training again: resumed at step ", now.resumed_step,
      now.resumed_from.empty() ? " (no checkpoint: from the start)" : " from " + now.resumed_from,
      "; its first step came ", tenths(from_end), " s after the failed job ended",
      stepped ? detail::str_cat(" (", tenths(from_step), " s after that job's last step)") : std::string()));
  log_.write({{"type", "recovered"},
              {"restart", attempt},
              {"resumed_step", now.resumed_step},
              {"resumed_from", now.resumed_from},
              {"first_step_time", unix_now()},
              {"seconds_from_failed_exit", from_end},
              {"seconds_from_last_step", from_step},
              {"lost_steps", stepped ? failed_.failure.last_step - now.resumed_step : 0}});
}

// Every host of the cluster is probed: the lost ones of this launch are named in `f`; the dead are returned
// (the others, also hosts that came back, may take part in the relaunch).
std::vector<std::string> Supervisor::probe_hosts(Failure& f) const {
  const std::vector<std::string> dead = probe(all_hosts_, agent_, o_.probe_timeout);
  for (const auto& h : hosts_for(alive_, np_))
    if (std::find(dead.begin(), dead.end(), h.name) != dead.end()) f.lost_hosts.push_back(h.name);
  return dead;
}

// Whether a failed launch is relaunched, and on what.
std::variant<Stop, Relaunch> Supervisor::decide(int attempt, const Launch& l, const std::vector<std::string>& dead,
                                                const std::string& what) {
  const Failure& f = l.failure;
  const Verdict verdict = judge(f, previous_ ? &*previous_ : nullptr);
  if (verdict == Verdict::Permanent)
    return Stop{f.exit_status == 0 ? 1 : f.exit_status, "failed",
                detail::str_cat("not restarting: ", what, " — a restart cannot fix this error")};
  if (verdict == Verdict::NoReason)
    return Stop{f.exit_status, "failed",
                detail::str_cat("not restarting: the job failed before training began (", what,
                                ") and every host answers; a restart would fail the same way")};
  if (attempt >= o_.max_restarts)
    return Stop{f.exit_status, "gave up",
                detail::str_cat("giving up: --max-restarts ", o_.max_restarts, " used; the last failure: ", what)};
  if (verdict == Verdict::Repeated)
    return Stop{f.exit_status, "failed",
                detail::str_cat("not restarting: the same error came back at step ", f.last_step, " after a restart (",
                                what, "); it is not transient")};
  Relaunch r;
  for (const auto& h : all_hosts_)
    if (std::find(dead.begin(), dead.end(), h.name) == dead.end()) r.hosts.push_back(h);
  std::string why_not;
  const int base_replicas = std::max(1, o_.np / flags_.stages);
  const auto world = plan_world(o_.np, std::max<int64_t>(1, base_micro_ / base_replicas), total_slots(r.hosts),
                                o_.min_np, o_.max_np, o_.allow_batch_change, why_not, flags_.stages);
  if (!world) return Stop{1, "gave up", detail::str_cat("cannot restart after: ", what, ": ", why_not)};
  r.world = *world;
  const auto in = [](const std::vector<Host>& hosts, const std::string& name) {
    return std::find_if(hosts.begin(), hosts.end(), [&](const Host& x) { return x.name == name; }) != hosts.end();
  };
  for (const auto& h : alive_)
    if (!in(r.hosts, h.name)) r.dropped.push_back(h.name);
  for (const auto& h : r.hosts)
    if (!in(alive_, h.name)) r.back.push_back(h.name);
  // The checkpoint the relaunch will resume: the newest any launch of this run resumed or wrote.
  r.resume = resume_;
  return r;
}

// Takes the relaunch's world, accounts the lost work, and says so (a line and a restart record).
void Supervisor::relaunch(int attempt, const Launch& l, const Relaunch& r, const std::string& what) {
  const Failure& f = l.failure;
  const int64_t resume_step = std::max<int64_t>(0, r.resume.step);  // unknown (the command's --resume): 0
  const double lost_s = work_lost_s(l, resume_step);
  lost_.lost_work_s += lost_s;
  ++restarts_;
  failed_ = l;
  np_ = r.world.np;
  accum_ = r.world.accum;
  stages_ = r.world.stages;
  batch_changed_ = batch_changed_ || r.world.batch_changed;
  alive_ = r.hosts;
  previous_ = f;
  const int64_t lost_steps =
      f.last_step >= 0 && r.resume.step >= 0 ? std::max<int64_t>(0, f.last_step - resume_step) : 0;
  const std::string on = names(hosts_for(alive_, np_));
  say(detail::str_cat(
      "restart ", attempt + 1, " of ", o_.max_restarts, ": ", what,
      r.dropped.empty() ? "" : "; dropped " + join(r.dropped, ", "),
      r.back.empty() ? "" : "; back: " + join(r.back, ", "), "; relaunching ", np_, " rank(s) on ", on,
      " with --accum-steps ", accum_,
      stages_ != flags_.stages ? detail::str_cat(" and --pipeline-stages ", stages_, " (too few ranks for ",
                                                 flags_.stages, " stages that keep the global batch)")
                               : std::string(),
      r.world.batch_changed ? " (the global batch CHANGES: --allow-batch-change)" : " (same global batch)",
      ", resuming ", describe_resume(r.resume, flags_), " (", lost_steps, " step(s) of work lost, ", tenths(lost_s),
      " s)"));
  log_.write({{"type", "restart"},
              {"restart", attempt + 1},
              {"max_restarts", o_.max_restarts},
              {"failure", what},
              {"exit_status", f.exit_status},
              {"hosts_dropped", r.dropped},
              {"hosts_back", r.back},
              {"hosts", on},
              {"world_size", np_},
              {"accum_steps", accum_},
              {"pipeline_stages", stages_},
              {"global_batch_kept", !r.world.batch_changed},
              {"last_step", f.last_step},
              {"resume_step", r.resume.step},
              {"resume_from", r.resume.path},
              {"lost_steps", lost_steps},
              {"lost_work_s", lost_s},
              {"detect_s", l.stepped ? seconds(l.end - l.last_step_at) : 0.0}});
}

int Supervisor::finished() {
  log_.write({{"type", "supervisor"},
              {"outcome", "finished"},
              {"restarts", restarts_},
              {"exit_status", 0},
              {"time_lost_s", lost_.total_s()},
              {"recovery_s", lost_.recovery_s},
              {"lost_work_s", lost_.lost_work_s},
              {"reason", ""}});
  say(detail::str_cat(
      "finished after ", restarts_, " restart(s)",
      restarts_ ? detail::str_cat("; time lost ", tenths(lost_.total_s()), " s (recovery ", tenths(lost_.recovery_s),
                                  " s, lost work ", tenths(lost_.lost_work_s), " s)")
                : std::string()));
  if (log_.lost()) {
    std::fprintf(stderr, "ringtrain_run: the job finished, but records of its log were lost (above): exit 1\n");
    return 1;
  }
  return 0;
}

// The run's last record (how it ended and what the failures cost), and the reason on stderr.
int Supervisor::stop(const Stop& s) {
  log_.write({{"type", "supervisor"},
              {"outcome", s.outcome},
              {"restarts", restarts_},
              {"exit_status", s.code},
              {"time_lost_s", lost_.total_s()},
              {"recovery_s", lost_.recovery_s},
              {"lost_work_s", lost_.lost_work_s},
              {"reason", s.why}});
  std::fprintf(stderr, "ringtrain_run: %s\n", s.why.c_str());
  std::fflush(stderr);
  return s.code;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{
      "Elastic supervisor: runs a training job under mpirun and restarts it on the surviving hosts, from "
      "its newest checkpoint, when a rank or host fails"};
  Options o;
  app.add_option("--hostfile", o.hostfile,
                 "Open MPI hostfile of the hosts to use (else the one in --mpirun-args, "
                 "the Slurm allocation, or this host)");
  runtime::add_number(app, "--np", o.np, "ranks of the first launch", 1, 1 << 20)->required();
  runtime::add_number(app, "--max-restarts", o.max_restarts, "relaunches after failures before giving up", 0, 1000);
  runtime::add_number(app, "--min-np", o.min_np, "fewest ranks a relaunch may use", 1, 1 << 20);
  runtime::add_number(app, "--max-np", o.max_np, "most ranks a relaunch may use when hosts come back (0: --np)", 0,
                      1 << 20);
  runtime::add_number(app, "--restart-delay", o.restart_delay, "seconds to wait before a relaunch", 0.0, 86400.0);
  runtime::add_number(app, "--probe-timeout", o.probe_timeout, "seconds a host may take to answer the liveness probe",
                      0.1, 3600.0);
  app.add_flag("--allow-batch-change", o.allow_batch_change,
               "relaunch even when the global batch cannot be kept on the ranks left (the training changes)");
  app.add_option("--mpirun-args", o.mpirun_args, "options passed to every mpirun (one string, split as sh does)");
  app.add_option("--mpirun", o.mpirun, "the mpirun to run")->capture_default_str();
  app.add_option("--log-jsonl", o.log_jsonl, "append the restart records here (default: the job's --log-jsonl)");
  app.add_option("command", o.command, "the training command, after --")->required();
  RT_PARSE_FLAGS(app, argc, argv);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  try {
    return Supervisor(std::move(o)).run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtrain_run: %s\n", e.what());
    return 2;
  }
} catch (...) {
  return runtime::main_error("ringtrain_run");  // no exception escapes main
}
