// runtime/checkpoint/folder_lock.h: one live writer per checkpoint folder. Rank 0 of a run takes DIR/.ringtrain-lock
// (JSON: host, pid, start time, the supervisor that launched it, the run) before anything is written there,
// keeps it fresh (its modification time, every few seconds, from a thread of its own) and removes it when
// the Trainer ends. A second run that finds a live holder is refused, naming the holder: two runs writing
// one folder would replace each other's checkpoints. A holder is gone when its process no longer runs (on
// this host) or its lock has not been refreshed for kStaleSeconds (another host); a relaunch by the same
// supervisor (ringtrain_run: RINGTRAIN_SUPERVISOR, RINGTRAIN_RESTART > 0) takes over its earlier launch's
// lock at once, since that launch's mpirun has exited.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ringtrain::runtime {

class FolderLock {
 public:
  static constexpr double kStaleSeconds = 30;
  static constexpr const char* kLockName = ".ringtrain-lock";  // in the folder it locks

  // Takes the lock of `dir` (which exists); `note` says when a stale lock was taken over. Errors name the
  // holder and the lock file.
  static std::unique_ptr<FolderLock> acquire(const std::filesystem::path& dir, std::string& note);
  ~FolderLock();  // stops the refresh and removes the lock if it is still this process's
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  // Records the run (its identity) in the lock once known.
  void set_run(const std::string& run_id);
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit FolderLock(std::filesystem::path path);
  void refresh_loop();
  std::filesystem::path path_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::thread refresher_;
};

}  // namespace ringtrain::runtime
