// runtime/checkpoint/checkpoint_dir.cpp: TrainState (de)serialisation, the folder's naming, retention and resume pick.
#include "runtime/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "core/check.h"
#include "core/parse.h"
#include "io/files.h"
#include "io/json_in.h"
#include "runtime/checkpoint/folder_lock.h"
#include "runtime/cluster/process.h"

namespace ringtrain::runtime {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPrefix = "ckpt-step";
constexpr const char* kSuffix = ".h5";

// The steps a checkpoint's name may carry: --steps is at most 2^40.
constexpr NumberRange<int64_t> kStepRange{0, int64_t{1} << 62};

// "ckpt-step<anything>.h5" in any case, "<anything>" empty too ("ckpt-step.h5"): what a checkpoint of this
// folder is named like. A file named so is a checkpoint of this folder or is said, never passed over.
bool named_like_checkpoint(const std::string& name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (name.size() < prefix.size() + suffix.size()) return false;
  const auto same = [](const std::string& a, const std::string& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](char x, char y) { return std::tolower(static_cast<unsigned char>(x)) == y; });
  };
  return same(name.substr(0, prefix.size()), prefix) && same(name.substr(name.size() - suffix.size()), suffix);
}

// Spelled as ringtrain spells its checkpoints' names (the case of "ckpt-step" and ".h5").
bool spelled_as_ours(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 &&
         name.compare(name.size() - std::strlen(kSuffix), std::string::npos, kSuffix) == 0;
}

// What stands between "ckpt-step" and ".h5" in a name named_like_checkpoint.
std::string step_text(const std::string& name) {
  return name.substr(std::strlen(kPrefix), name.size() - std::strlen(kPrefix) - std::strlen(kSuffix));
}

// The step of "ckpt-step<digits>.h5", or -1 for a name that is not like that or whose digits are not a
// step (list() names those: a file named like a checkpoint is never passed over in silence).
int64_t step_of(const std::string& name) {
  if (!named_like_checkpoint(name) || !spelled_as_ours(name)) return -1;
  const std::optional<int64_t> step = to_number<int64_t>(step_text(name));
  return step && kStepRange.holds(*step) ? *step : -1;
}

constexpr const char* kSetAside = "set-aside-";

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

}  // namespace

std::string TrainState::to_json() const {
  json meta{{"step", step},
            {"epoch", position.epoch},
            {"sampler", {{"epoch", position.epoch}, {"next_batch", position.next_batch}}},
            {"world_size", world_size},
            {"global_batch", global_batch},
            {"per_step_global", per_step_global},
            {"config", config},
            {"lr", lr},
            {"rng", {{"stream", rng_stream}}}};
  if (loss_scale) meta["loss_scale"] = {{"scale", loss_scale->scale}, {"growth_tracker", loss_scale->growth_tracker}};
  if (!run_id.empty()) meta["run_id"] = run_id;
  if (!steps_follow_position) meta["steps_follow_position"] = false;
  return meta.dump();
}

TrainState TrainState::from_json(const std::string& text, const std::string& file) {
  json meta;
  try {
    meta = json::parse(text);
  } catch (const std::exception& e) {
    RT_THROW("checkpoint '", file, "': /meta/json is not valid JSON (", e.what(), ")");
  }
  // The one checked reader (io/json_in.h): errors name "'<file>:/meta/json': key 'sampler.epoch' ...".
  const io::JsonIn m(meta, file + ":/meta/json");
  TrainState s;
  s.step = m.integer("step", 0, kMax);
  const io::JsonIn sampler = m.at("sampler");
  s.position.epoch = sampler.integer("epoch", 0, kMax);
  s.position.next_batch = sampler.integer("next_batch", 0, kMax);
  s.world_size = static_cast<int>(m.integer("world_size", 1, std::numeric_limits<int>::max()));
  s.global_batch = m.integer("global_batch", 1, kMax);
  // Written since resume across world sizes; older checkpoints' batches are this run's (0 = unknown).
  s.per_step_global = m.integer_or("per_step_global", 0, 1, kMax);
  if (s.per_step_global > 0 && s.global_batch % s.per_step_global != 0)
    m.wrong("per_step_global", detail::str_cat("a divisor of global_batch ", s.global_batch));
  s.lr = m.number_or("lr", 0.0);
  if (m.has("rng")) s.rng_stream = static_cast<uint64_t>(m.at("rng").integer("stream", 0, kMax));
  if (m.has("loss_scale")) {
    const io::JsonIn ls = m.at("loss_scale");
    s.loss_scale = LossScaleState{ls.number("scale"), ls.integer("growth_tracker", 0, kMax)};
    if (!(s.loss_scale->scale > 0)) ls.wrong("scale", "positive");
  }
  if (m.has("config")) s.config = m.at("config").raw();
  s.steps_follow_position = m.boolean_or("steps_follow_position", s.steps_follow_position);
  const std::string id = m.text_or("run_id", "");
  if (m.has("run_id") && (id.size() != 16 || id.find_first_not_of("0123456789abcdef") != std::string::npos))
    m.wrong("run_id", "16 hex digits");
  s.run_id = id;
  return s;
}

data::SamplerState TrainState::position_for(int64_t run_per_step_global, int64_t micro_per_epoch,
                                            const std::string& file, bool round_down) const {
  const int64_t written_in = per_step_global > 0 ? per_step_global : run_per_step_global;
  const int64_t samples = position.next_batch * written_in;
  RT_CHECK(round_down || samples % run_per_step_global == 0, "--resume ", file, ": the checkpoint stopped after ",
           samples, " samples of its epoch, not a multiple of this run's ", run_per_step_global,
           " (ranks x --batch-size)");
  data::SamplerState p{position.epoch, samples / run_per_step_global};
  RT_CHECK(p.next_batch <= micro_per_epoch, "--resume ", file, ": /meta/json key 'sampler.next_batch' ",
           position.next_batch, " is beyond the end of an epoch (", micro_per_epoch, " batches of ",
           run_per_step_global, " images in this run): the checkpoint does not belong to this dataset and batch size");
  if (p.next_batch == micro_per_epoch) {  // the epoch was complete
    ++p.epoch;
    p.next_batch = 0;
  }
  return p;
}

CheckpointDir::CheckpointDir(fs::path dir, int64_t keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  RT_CHECK(keep_last_ >= 0, "--keep-last must be 0 (keep every checkpoint) or more, got ", keep_last_);
}

fs::path CheckpointDir::path(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "%s%08lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return dir_ / name;
}

std::vector<std::pair<int64_t, fs::path>> CheckpointDir::list(
    const std::function<void(const std::string&)>& odd) const {
  std::vector<std::pair<int64_t, fs::path>> out, odd_ones;
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = step_of(name);
    if (step < 0 && named_like_checkpoint(name))
      throw PermanentError(detail::str_cat(
          "'", entry.path().string(), "' is named like a checkpoint, but ",
          !spelled_as_ours(name) ? std::string("not spelled as ringtrain spells them (ckpt-step<step>.h5)")
          : step_text(name).empty()
              ? std::string("carries no step")
              : detail::str_cat("'", step_text(name), "' is not a step (", kStepRange.text(), ")"),
          ": ringtrain never writes such a name, so it is another program's file (another run's checkpoint?) or a ",
          "damaged name; move it out of '", dir_.string(), "' (or rename it to its step)"));
    if (step < 0) continue;
    (entry.is_regular_file(ec) ? out : odd_ones).emplace_back(step, entry.path());
  }
  std::sort(out.begin(), out.end());
  std::sort(odd_ones.begin(), odd_ones.end());
  if (odd)
    for (const auto& [step, path] : odd_ones) {
      const fs::file_status st = fs::status(path, ec);
      odd(detail::str_cat(
          "'", path.string(), "' is named like a checkpoint but is ",
          st.type() == fs::file_type::not_found ? std::string("a link to nothing readable") : io::kind_of(st),
          ", not a checkpoint file; it is not used"));
    }
  return out;
}

std::string CheckpointDir::output_problem(const std::string& flag, const std::string& path) const {
  if (dir_.empty() || path.empty()) return "";
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(fs::absolute(dir_), ec);
  const fs::path file = fs::weakly_canonical(fs::absolute(path), ec);
  if (file == dir) return detail::str_cat(flag, " '", path, "' is the --checkpoint-dir folder itself");
  if (file.parent_path() != dir) return "";
  const std::string name = file.filename().string();
  for (const std::string& own :
       {std::string(kPrefix), "." + std::string(kPrefix), std::string(FolderLock::kLockName), std::string(kSetAside)})
    if (name.rfind(own, 0) == 0)
      return detail::str_cat(flag, " '", path, "' is named like one of --checkpoint-dir's own files (checkpoints, ",
                             "their temporary files, the lock, set-aside folders): write it beside them under another "
                             "name");
  return "";
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t a = (static_cast<uint64_t>(device()) << 32) ^ device();
  const uint64_t b = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                     (static_cast<uint64_t>(::getpid()) << 40);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(a ^ (b * 0x9e3779b97f4a7c15ull)));
  return text;
}

std::vector<CheckpointDir::Entry> CheckpointDir::scan() const {
  std::vector<Entry> out;
  for (const auto& [step, path] : list()) {
    Entry e{step, path, "", ""};
    try {
      e.run_id = TrainState::from_json(read_checkpoint_meta(path), path.string()).run_id;
    } catch (const std::exception& ex) {
      e.problem = ex.what();
    }
    out.push_back(std::move(e));
  }
  return out;
}

void CheckpointDir::set_run(std::string run_id, bool owns_unmarked) {
  run_id_ = std::move(run_id);
  owns_unmarked_ = owns_unmarked;
}

std::vector<CheckpointDir::Entry> others_of(const CheckpointDir& dir,
                                            const std::vector<CheckpointDir::Entry>& entries) {
  std::vector<CheckpointDir::Entry> out;
  for (const auto& e : entries)
    if (!dir.owns(e)) out.push_back(e);
  return out;
}

std::string describe_entries(const std::vector<CheckpointDir::Entry>& entries) {
  // One group per run (unreadable files and files without an identity on their own), steps first-last.
  std::map<std::string, std::vector<int64_t>> groups;
  for (const auto& e : entries)
    groups[!e.problem.empty() ? std::string("unreadable")
           : e.run_id.empty() ? std::string()
                              : "run " + e.run_id]
        .push_back(e.step);
  std::string out;
  for (const auto& [name, steps] : groups) {
    const std::string who = name.empty() ? "files written before runs had an identity" : name;
    out += detail::str_cat(out.empty() ? "" : "; ", who, " (step", steps.size() > 1 ? "s " : " ", steps.front(),
                           steps.size() > 1 ? detail::str_cat("-", steps.back()) : std::string(), ", ", steps.size(),
                           steps.size() == 1 ? " file)" : " files)");
  }
  return out;
}

CheckpointDir::Loaded CheckpointDir::load(const fs::path& path) {
  Loaded l;
  l.path = path;
  l.checkpoint = load_checkpoint(path);
  l.state = TrainState::from_json(l.checkpoint.meta_json, path.string());
  return l;
}

std::optional<CheckpointDir::Loaded> CheckpointDir::load_newest(
    const std::function<void(const std::string&)>& warn) const {
  const auto all = list([&](const std::string& odd) {
    if (warn) warn("--resume auto: skipping " + odd);
  });
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load(it->second);
    } catch (const std::exception& e) {
      if (warn) warn(detail::str_cat("--resume auto: skipping '", it->second.string(), "': ", e.what()));
    }
  }
  return std::nullopt;
}

fs::path CheckpointDir::save(int64_t step, const Checkpoint& checkpoint, const SaveOptions& options) const {
  RT_CHECK(on(), "CheckpointDir::save without a folder");
  const fs::path target = path(step);
  save_checkpoint(target, checkpoint, options);
  if (keep_last_ > 0) {
    std::vector<Entry> mine;  // only this run's own files are ever deleted
    for (auto& e : scan())
      if (owns(e)) mine.push_back(std::move(e));
    const size_t keep = static_cast<size_t>(keep_last_);
    for (size_t i = 0; i + keep < mine.size(); ++i) {
      std::error_code ec;
      if (mine[i].path != target) fs::remove(mine[i].path, ec);  // best effort: a file gone already is fine
    }
  }
  return target;
}

namespace {

// Renames `from` to `to`, or to "<to>-2", "<to>-3", ... when a file of that name exists: nothing is replaced.
fs::path rename_unique(const fs::path& from, const fs::path& to) {
  for (int n = 1; n < 100000; ++n) {
    fs::path target = to;
    if (n > 1) target += detail::str_cat("-", n);
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) return target;
    if (errno != EEXIST)
      RT_THROW("--checkpoint-dir: cannot set aside '", from.string(), "' as '", target.string(),
               "': ", std::strerror(errno));
  }
  RT_THROW("--checkpoint-dir: cannot set aside '", from.string(), "': 99999 names like '", to.string(), "' are taken");
}

}  // namespace

std::vector<std::string> CheckpointDir::supersede_after(int64_t step) const {
  std::vector<std::string> renamed;
  for (const auto& e : scan()) {
    if (e.step <= step || !owns(e)) continue;
    fs::path target = e.path;
    target += ".superseded";
    renamed.push_back(rename_unique(e.path, target).string());
  }
  return renamed;
}

fs::path CheckpointDir::move_aside(const std::vector<Entry>& files) const {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, (std::string(kSetAside) + "%Y%m%d-%H%M%S").c_str(), std::localtime(&now));
  fs::path folder;
  for (int n = 1;; ++n) {
    folder = dir_ / (n == 1 ? std::string(stamp) : detail::str_cat(stamp, "-", n));
    if (::mkdir(folder.c_str(), 0777) == 0) break;
    if (errno != EEXIST || n > 1000)
      RT_THROW("--start-over: cannot make '", folder.string(),
               "' to move the old checkpoints into: ", std::strerror(errno));
  }
  for (const auto& e : files) rename_unique(e.path, folder / e.path.filename());
  return folder;
}

std::vector<std::string> CheckpointDir::remove_stale_temp_files() const {
  std::vector<std::string> removed;
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec)) return removed;
  // io/checkpoint.cpp writes ".<name>.tmp-<pid>" beside the target before renaming it into place.
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.find(".tmp-");
    if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos || step_of(name.substr(1, tmp - 1)) < 0) continue;
    // A writer that is still alive on this host is not interrupted (another job sharing the folder).
    const std::optional<pid_t> pid = to_number<int>(name.substr(tmp + 5));
    if (pid && *pid > 0 && *pid != ::getpid() && process_running(*pid)) continue;
    if (fs::remove(entry.path(), ec)) removed.push_back(name);
  }
  return removed;
}

void CheckpointDir::check_writable(int64_t max_step) const {
  if (!on()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) RT_THROW("--checkpoint-dir: cannot create '", dir_.string(), "': ", ec.message());
  if (!fs::is_directory(dir_, ec)) RT_THROW("--checkpoint-dir: '", dir_.string(), "' is not a folder");
  // The longest names written here: ".ckpt-stepNNN.h5.tmp-<pid>" while a checkpoint is written and
  // "ckpt-stepNNN.h5.superseded-NNNNN" when one is set aside (a set-aside folder's files are shorter).
  const std::string temp = detail::str_cat(".", path(max_step).filename().string(), ".tmp-", ::getpid());
  const std::string aside = path(max_step).filename().string() + ".superseded-99999";
  const fs::path probe = dir_ / (temp.size() >= aside.size() ? temp : aside + ".probe");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    if (errno == ENAMETOOLONG)
      RT_THROW("--checkpoint-dir: '", dir_.string(), "' is too deep: the names this run writes there (such as '",
               probe.filename().string(), "', ", probe.string().size(), " characters in all) are too long for its ",
               "file system; use a shorter path");
    RT_THROW("--checkpoint-dir: '", dir_.string(), "' is not writable (", std::strerror(errno), ")");
  }
  ::close(fd);
  fs::remove(probe, ec);
}

}  // namespace ringtrain::runtime
