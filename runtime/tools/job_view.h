// runtime/tools/job_view.h: a one-screen view of a running job from its JSONL log (--log-jsonl), like nvtop for
// the job: what it is (the plan record), where it stands (the last train record: step, loss, throughput,
// the step's time by phase), its last evaluation, every rank's GPU (the last gpu record: utilisation,
// memory, temperature, power) and, once it ended, the summary. `ringtrain_env --watch LOG` redraws it.
//
//   LogTail tail(path);                  // reads what was appended since the last call
//   tail.poll();  std::string screen = render_job_view(tail.last(), seconds_since_the_log_changed);
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace ringtrain::runtime {

// The newest record of each type ("plan", "train", "eval", "gpu", "summary") of a JSONL log.
class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {}
  // Reads the complete lines appended since the last poll. False when the file does not exist (yet).
  // A line that is not JSON is skipped (a writer mid-line: it is read whole next time). A record whose
  // fields have the wrong types, or a path that is not a regular file (a folder, a FIFO), is an Error
  // naming it. A replaced log (another inode, shorter, or its first bytes rewritten in place) or a new plan
  // record starts the view over.
  bool poll();
  const std::map<std::string, nlohmann::json>& last() const { return last_; }
  double seconds_since_change() const;  // since the file last grew (by its modification time)

 private:
  std::string path_;
  uint64_t inode_ = 0, device_ = 0;
  int64_t offset_ = 0, line_ = 0;
  bool head_changed() const;
  static constexpr size_t kHead = 4096;  // the log's first bytes as read, to tell a log rewritten in place
  std::string partial_, head_;
  std::map<std::string, nlohmann::json> last_;
};

// The screen: a few lines, none wider than about 100 columns. `age_s`: how old the newest record is.
std::string render_job_view(const std::map<std::string, nlohmann::json>& last, double age_s);

}  // namespace ringtrain::runtime
