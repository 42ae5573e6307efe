// runtime/checkpoint/folder_lock.cpp: the checkpoint folder's lock file, its staleness and its refresh.
#include "runtime/checkpoint/folder_lock.h"

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
#include <sstream>

#include "core/check.h"
#include "runtime/cluster/process.h"

namespace ringtrain::runtime {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kLockName = ".ringtrain-lock";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

json content(const std::string& run_id) {
  return json{{"host", this_host()},
              {"pid", static_cast<int64_t>(::getpid())},
              {"started", static_cast<int64_t>(std::time(nullptr))},
              {"supervisor", env_or_empty("RINGTRAIN_SUPERVISOR")},
              {"run", run_id}};
}

// Writes `text` to a temporary file beside `path` and returns its name.
fs::path write_temp(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += detail::str_cat(".tmp-", ::getpid());
  std::ofstream out(tmp, std::ios::trunc);
  out << text << "\n";
  out.close();
  if (!out) RT_THROW("--checkpoint-dir: cannot write the lock file '", tmp.string(), "'");
  return tmp;
}

// The lock as written, or nullopt when it vanished or is not a lock (then it is replaced).
std::optional<json> read_lock(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
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
std::string gone_because(const json& holder, const fs::path& path) {
  const std::string host = holder.value("host", std::string());
  const int64_t pid = holder.value("pid", int64_t{-1});
  const std::string mine = env_or_empty("RINGTRAIN_SUPERVISOR");
  const char* restart = std::getenv("RINGTRAIN_RESTART");
  if (!mine.empty() && holder.value("supervisor", std::string()) == mine && restart && std::atoi(restart) > 0)
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
    const std::optional<json> holder = read_lock(path);
    const std::string gone = holder ? gone_because(*holder, path) : "it is not a lock file ringtrain wrote";
    if (gone.empty()) {
      ::unlink(tmp.c_str());
      const json& h = *holder;
      RT_THROW("--checkpoint-dir '", dir.string(), "' is in use by another run: pid ", h.value("pid", int64_t{-1}),
               " on host ", h.value("host", std::string("?")), ", started ", when(h.value("started", int64_t{0})),
               h.value("run", std::string()).empty() ? "" : ", run " + h.value("run", std::string()), " (lock file '",
               path.string(), "', refreshed ", static_cast<int64_t>(seconds_since_modified(path)),
               " s ago). Two runs writing one folder replace each other's checkpoints: wait for that run to end or "
               "give this one another --checkpoint-dir (if that process is gone, remove the lock file)");
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      RT_THROW("--checkpoint-dir: cannot take over the lock file '", path.string(), "': ", std::strerror(e));
    }
    // Another taker may have renamed its own over ours in the meantime: the lock is ours only if it says so.
    const std::optional<json> now = read_lock(path);
    if (now && now->value("host", std::string()) == this_host() && now->value("pid", int64_t{-1}) == ::getpid()) {
      if (holder && gone != "this process")
        note =
            detail::str_cat("took over the lock of '", dir.string(), "' from pid ", holder->value("pid", int64_t{-1}),
                            " on host ", holder->value("host", std::string("?")), ": ", gone);
      return std::unique_ptr<FolderLock>(new FolderLock(path));
    }
  }
  RT_THROW("--checkpoint-dir: could not take the lock file '", path.string(), "': other processes keep taking it");
}

FolderLock::~FolderLock() {
  stop_ = true;
  if (refresher_.joinable()) refresher_.join();
  std::lock_guard<std::mutex> guard(mutex_);
  const std::optional<json> now = read_lock(path_);
  if (now && now->value("host", std::string()) == this_host() && now->value("pid", int64_t{-1}) == ::getpid())
    ::unlink(path_.c_str());
}

void FolderLock::set_run(const std::string& run_id) {
  std::lock_guard<std::mutex> guard(mutex_);
  json c = content(run_id);
  if (const std::optional<json> now = read_lock(path_)) c["started"] = now->value("started", c["started"]);
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
