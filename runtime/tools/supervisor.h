// runtime/tools/supervisor.h: the decisions of the elastic supervisor (apps/ringtrain_run), apart from the
// processes it drives, so each can be tested alone: which hosts a job may use, how it is relaunched (the
// same global batch on fewer ranks by raising --accum-steps, from exactly the checkpoint it announces: the
// newest one this run resumed or wrote, else the command's own --resume, else the start), whether the
// relaunch resumed what was announced, what the job's event lines say (comm::kEventPrefix) and whether a
// failure is worth a restart.
//
// A restart is worth it when a host was lost (dropped, the job goes on without it), when a rank reported
// an error that may be transient (a lost peer, a watchdog timeout, an injected or unknown exception), or
// when a rank died without a word after training had begun (killed, crashed). It is not when any rank
// reported a permanent error (Error::permanent: bad flags, bad data, a checkpoint that does not match, a
// non-finite loss), when the job failed before training began and no host was lost (a usage error, a
// program that does not start), or when the same error came back at the same step with no progress.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ringtrain::runtime::supervisor {

struct Host {
  std::string name;
  int slots = 1;
};

// An Open MPI hostfile: "name [slots=N] [max_slots=M]" per line, '#' comments, blank lines; a name twice
// adds its slots. Errors name the file and the line.
std::vector<Host> parse_hostfile(const std::string& text, const std::string& file);
std::string hostfile_text(const std::vector<Host>& hosts);
int total_slots(const std::vector<Host>& hosts);
// The first hosts (in order) whose slots hold `np` ranks; the last one may be used in part.
std::vector<Host> hosts_for(const std::vector<Host>& hosts, int np);

// Shell-like words of --mpirun-args: blanks separate, single and double quotes and backslashes work as
// in sh. Errors name the flag for an unbalanced quote.
std::vector<std::string> split_words(const std::string& text);

// --mpirun-args taken apart: the hostfile (--hostfile/-hostfile/--machinefile, which the supervisor
// replaces with the survivors'), the launch agent (--mca plm_rsh_agent, used for the liveness probe) and
// the rest, passed to every mpirun unchanged. The rank count and host lists are the supervisor's to set:
// -np/-n/--np/-c/--host/-H are refused, naming the flag.
struct MpirunArgs {
  std::vector<std::string> rest;
  std::string hostfile, agent;
};
MpirunArgs parse_mpirun_args(const std::vector<std::string>& words);

// The training command's flags that the supervisor reads (last one wins, as in the runtime's parser):
// --checkpoint-dir, --log-jsonl, --accum-steps (default 1), --resume; "--flag=value" too.
struct JobFlags {
  std::string checkpoint_dir, log_jsonl, resume;
  int64_t accum = 1;
  int stages = 1;             // --pipeline-stages
  bool split_given = false;   // --pipeline-split (which fits its stage count only)
  bool global_batch = false;  // --global-batch: the trainer keeps the global batch itself (no --accum-steps added)
  // The other files it reads or writes, by flag: --data, --trace, --link-calibration, --save-link, --profile-jsonl.
  std::vector<std::pair<std::string, std::string>> files;
};
JobFlags read_job_flags(const std::vector<std::string>& command);

// A world for the next launch: the most ranks (at most max_np, and no more than `slots`) that keep the
// global batch of the base run (base_np ranks x base_accum; the per-rank batch never changes), i.e. the
// largest np with base_np x base_accum divisible by np. With allow_batch_change and no such np, the most
// ranks that fit, with accum = max(1, round(base_np x base_accum / np)). nullopt, with `why_not` set,
// when fewer than min_np ranks remain or the global batch cannot be kept.
//
// With pipeline stages (base_np = stages x replicas) the per-step micro-batches are replicas x base_accum,
// np stays a multiple of the stages, and only when no such np keeps the global batch (or fewer ranks are
// left than stages) are the stages lowered, one at a time.
struct World {
  int np = 0;
  int64_t accum = 1;
  bool batch_changed = false;
  int stages = 1;
};
std::optional<World> plan_world(int base_np, int64_t base_accum, int slots, int min_np, int max_np,
                                bool allow_batch_change, std::string& why_not, int stages = 1);

// Where a relaunch starts. `path` empty: what the command itself says (its own --resume PATH or auto, or
// nothing: the start). `step` -1 when not known (the command's --resume before any launch reported it).
struct ResumePoint {
  std::string path;
  int64_t step = -1;
};
// The newest of `known` and what a launch reported: the checkpoint it resumed (its plan event) and those it
// wrote (its checkpoint events, step and path).
ResumePoint newest_resume_point(const ResumePoint& known, const std::string& resumed_from, int64_t resumed_step,
                                const std::vector<std::pair<int64_t, std::string>>& written);
// "step 9 from ckpt/ckpt-step00000009.h5", "the command's --resume old/ckpt-step00000006.h5", "the start (no
// checkpoint yet)".
std::string describe_resume(const ResumePoint& p, const JobFlags& flags);

// The command of a launch: the user's, then "--accum-steps A" when it differs from what the command
// says ("--pipeline-stages S" likewise, the command's --pipeline-split then left out), then "--resume PATH" of `resume`
// when it names one (the last flag given wins), and
// "--allow-batch-change" when the world cannot keep the global batch and the user allowed that. A relaunch
// never adds "--resume auto" of its own: on a folder without this run's checkpoint it would start from
// random weights where the command said --resume PATH.
std::vector<std::string> relaunch_command(const std::vector<std::string>& command, const JobFlags& flags, int64_t accum,
                                          const ResumePoint& resume, bool batch_changed = false, int stages = 0);

// Whether a relaunch resumed what was announced: "" when it did, else the mismatch (a permanent error: the
// run would train on from somewhere else than announced). `resumed_from` and `resumed_step` are the
// relaunch's plan event's.
std::string check_resumed(const ResumePoint& announced, const JobFlags& flags, const std::string& resumed_from,
                          int64_t resumed_step);

// The JSON of an event line ("ringtrain-event {...}"), or nullopt for any other line (also for a line
// that starts like one but does not hold a JSON object).
std::optional<nlohmann::json> parse_event(const std::string& line);

// What one failed launch left behind.
struct Failure {
  std::vector<nlohmann::json> errors;   // the ranks' error events, in the order they came
  std::vector<std::string> lost_hosts;  // hosts that failed the liveness probe
  bool trained = false;                 // the job reported its plan (it got past startup)
  int64_t last_step = -1;               // the last step rank 0 reported (-1: none)
  int exit_status = 1;
  std::string mpirun_says;  // mpirun's own explanation, if it printed one
};

// One line naming what failed: the first permanent error, else the first error, else the lost hosts,
// else mpirun's words, else the exit status.
std::string describe(const Failure& f);

enum class Verdict : uint8_t { Restart, Permanent, NoReason, Repeated };
// `previous`: the failure before this one (of the launch before), if any.
Verdict judge(const Failure& f, const Failure* previous);

}  // namespace ringtrain::runtime::supervisor
