// runtime/checkpoint/folder_lock.cpp: the checkpoint folder's lock file, its staleness and its refresh.
#include "runtime/checkpoint/folder_lock.h"
#include "core/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "io/files.h"
#include "io/json_in.h"
#include "runtime/cluster/process.h"

namespace ringtrain::runtime {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string env_or_empty(const char* name) { return env_text(name).value_or(""); }

json content(const std::string& run_id) {
  return json{{"host", this_host()},
              {"pid", static_cast<int64_t>(::getpid())},
              {"started", static_cast<int64_t>(std::time(nullptr))},
              {"supervisor", env_or_empty("RINGTRAIN_SUPERVISOR")},
              {"run", run_id}};
}

// Writes `text` to a temporary file beside `path` and returns its name; on failure none is left behind
// and the error says why (a full disk, no permission).
fs::path write_temp(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += detail::str_cat(".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    RT_THROW("--checkpoint-dir: cannot write the lock file '", tmp.string(),
             "': ", io::explain_write_failure(path.parent_path(), std::strerror(err)));
  }
  const std::string line = text + "\n";
  const ssize_t wrote = ::write(fd, line.data(), line.size());
  const int err = wrote == static_cast<ssize_t>(line.size()) ? 0 : (wrote < 0 ? errno : ENOSPC);
  if (::close(fd) != 0 || err != 0) {
    ::unlink(tmp.c_str());
    RT_THROW("--checkpoint-dir: cannot write the lock file '", tmp.string(),
             "': ", io::explain_write_failure(path.parent_path(), std::strerror(err ? err : EIO), line.size()));
  }
  return tmp;
}

// Who holds a lock, as its file says.
struct Holder {
  std::string host = "?", run, supervisor;
  int64_t pid = -1, started = 0;
};

// The lock as written, or nullopt when it vanished or is not JSON (then it is replaced). A lock whose
// fields have the wrong types is an error naming the file and the key.
std::optional<Holder> read_lock(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    const io::JsonIn lock(j, path.string());
    Holder h;
    h.host = lock.text_or("host", "?");
    h.run = lock.text_or("run", "");
    h.supervisor = lock.text_or("supervisor", "");
    h.pid = lock.integer_or("pid", -1, -1, INT32_MAX);
    h.started = lock.integer_or("started", 0, 0, int64_t{1} << 40);
    return h;
  } catch (const Error& e) {
    RT_THROW("lock file: ", e.what(), " (ringtrain writes host, run and supervisor as strings, pid and started as ",
             "whole numbers; if no run uses the folder, remove the lock file)");
  }
}

double seconds_since_modified(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 1e9;
  return std::difftime(std::time(nullptr), st.st_mtime);
}

std::string when(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return text;
}

// Why the holder is gone (the lock may be taken over), or "" when it may still be writing.
std::string gone_because(const Holder& holder, const fs::path& path) {
  const std::string& host = holder.host;
  const int64_t pid = holder.pid;
  const std::string mine = env_or_empty("RINGTRAIN_SUPERVISOR");
  if (!mine.empty() && holder.supervisor == mine && restart_count() > 0)
    return "an earlier launch of this supervised run (its mpirun has exited)";
  if (host == this_host()) {
    if (pid == ::getpid()) return "this process";
    if (pid <= 0 || !process_running(static_cast<pid_t>(pid))) return detail::str_cat("pid ", pid, " no longer runs");
    return "";
  }
  const double age = seconds_since_modified(path);
  if (age > FolderLock::kStaleSeconds)
    return detail::str_cat("its lock was last refreshed ", static_cast<int64_t>(age), " s ago");
  return "";
}

}  // namespace

FolderLock::FolderLock(fs::path path) : path_(std::move(path)) {
  refresher_ = std::thread([this] { refresh_loop(); });
}

std::unique_ptr<FolderLock> FolderLock::acquire(const fs::path& dir, std::string& note) {
  const fs::path path = dir / kLockName;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const fs::path tmp = write_temp(path, content("").dump());
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return std::unique_ptr<FolderLock>(new FolderLock(path));
    }
    const int err = errno;
    if (err != EEXIST) {
      ::unlink(tmp.c_str());
      RT_THROW("--checkpoint-dir: cannot make the lock file '", path.string(), "': ", std::strerror(err));
    }
    const std::optional<Holder> holder = read_lock(path);
    const std::string gone = holder ? gone_because(*holder, path) : "it is not a lock file ringtrain wrote";
    if (gone.empty()) {
      ::unlink(tmp.c_str());
      const Holder& h = *holder;
      RT_THROW("--checkpoint-dir '", dir.string(), "' is in use by another run: pid ", h.pid, " on host ", h.host,
               ", started ", when(h.started), h.run.empty() ? "" : ", run " + h.run, " (lock file '", path.string(),
               "', refreshed ", static_cast<int64_t>(seconds_since_modified(path)),
               " s ago). Two runs writing one folder replace each other's checkpoints: wait for that run to end or "
               "give this one another --checkpoint-dir (if that process is gone, remove the lock file)");
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      RT_THROW("--checkpoint-dir: cannot take over the lock file '", path.string(), "': ", std::strerror(e));
    }
    // Another taker may have renamed its own over ours in the meantime: the lock is ours only if it says so.
    const std::optional<Holder> now = read_lock(path);
    if (now && now->host == this_host() && now->pid == ::getpid()) {
      if (holder && gone != "this process")
        note = detail::str_cat("took over the lock of '", dir.string(), "' from pid ", holder->pid, " on host ",
                               holder->host, ": ", gone);
      return std::unique_ptr<FolderLock>(new FolderLock(path));
    }
  }
  RT_THROW("--checkpoint-dir: could not take the lock file '", path.string(), "': other processes keep taking it");
}

FolderLock::~FolderLock() {
  stop_ = true;
  if (refresher_.joinable()) refresher_.join();
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    const std::optional<Holder> now = read_lock(path_);
    if (now && now->host == this_host() && now->pid == ::getpid()) ::unlink(path_.c_str());
  } catch (const std::exception&) {  // no longer a lock this process wrote: not ours to remove
  }
}

void FolderLock::set_run(const std::string& run_id) {
  std::lock_guard<std::mutex> guard(mutex_);
  json c = content(run_id);
  if (const std::optional<Holder> now = read_lock(path_)) c["started"] = now->started;
  const fs::path tmp = write_temp(path_, c.dump());
  if (::rename(tmp.c_str(), path_.c_str()) != 0) ::unlink(tmp.c_str());
}

void FolderLock::refresh_loop() {
  using namespace std::chrono_literals;
  auto last = std::chrono::steady_clock::now();
  while (!stop_) {
    std::this_thread::sleep_for(100ms);
    if (std::chrono::steady_clock::now() - last < 5s) continue;
    last = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> guard(mutex_);
    ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // best effort: a vanished lock is seen by the next taker
  }
}

}  // namespace ringtrain::runtime
