// io/files.h: what a file must be before ringtrain opens it. A FIFO, a device or a socket where a manifest,
// hostfile, checkpoint or log belongs would block a read or write forever (or read garbage); a folder where a
// file belongs gives a misleading "not an HDF5 file". Errors name what the file is for and what it is.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::io {

// An existing regular file (symbolic links followed). Errors: "<what> '<path>' does not exist", "... is a
// folder, not a file", "... is a FIFO (named pipe), not a regular file: reading it could block forever".
void require_regular_file(const std::filesystem::path& path, const std::string& what);
// The same for a file that may not exist yet (one to write): missing is fine, anything but a regular file
// is not.
void require_regular_if_exists(const std::filesystem::path& path, const std::string& what);
// A write into `dir` failed with `message`. When the device is full (ENOSPC in the message, where HDF5 puts
// it at the end of a long chain, or less free space than `bytes_needed`), the cause comes first: "no space
// left on the device of '<dir>' (N bytes free[, about M needed]): free space or write elsewhere (<message>)";
// otherwise `message` unchanged.
std::string explain_write_failure(const std::filesystem::path& dir, const std::string& message,
                                  uint64_t bytes_needed = 0);
// "a folder", "a FIFO (named pipe)", "a socket", "a character device", "a block device", "a regular file", ...
std::string kind_of(const std::filesystem::file_status& status);
// Writes `text` to `path` (replacing it, or appending with `append`), closed before it returns: a write that
// fails (a full disk) is an error naming `what`, the file and the cause (explain_write_failure), never a file
// left short or empty in silence (an ofstream says nothing of a failure at its destructor's flush).
void write_text(const std::filesystem::path& path, const std::string& text, const std::string& what,
                bool append = false);

// Where `path` leads: absolute, every symbolic link followed, the last one too when what it names does not
// exist yet (a link to a file a run is about to create leads to that file), "." and ".." resolved.
std::filesystem::path resolved(const std::filesystem::path& path);

// What an output file must not be, whatever the run: an HDF5 file (a checkpoint, a shard: text
// written over it destroys it) and, for an appended log, a file that is not JSON lines (a manifest, a
// trace). Empty when `path` may be written; else "<flag> '<path>' is ...: write it elsewhere".
std::string clobber_problem(const std::string& flag, const std::string& path, bool append_jsonl);

// The files one run of a program reads and writes, each under the flag (or argument) that named it, so that
// no output lands on anything the run reads or writes, whoever named it: an output that is an input file (a
// link or a hard link to it too), lies in an input folder (--data's shards and manifest, a new name there;
// an output folder too), or is another output (through a link, even one to a file not there yet; a file
// output that is an output folder). Paths that are empty are not files of the run.
class RunFiles {
 public:
  RunFiles& reads(std::string flag, std::string path);
  RunFiles& reads_folder(std::string flag, std::string path);
  RunFiles& writes(std::string flag, std::string path);
  // A folder it writes its own names into (a checkpoint folder, make_shards' OUT): inputs may lie in it
  // (--resume's checkpoint), and the names it writes there are the writer's to check.
  RunFiles& writes_folder(std::string flag, std::string path);
  // Also allowed: these two outputs are one file on purpose (ringtrain_run appends to the job's own log).
  RunFiles& may_share(std::string flag_a, std::string flag_b);
  // The first problem, naming both flags and paths, or "" (problem()); check() throws it.
  std::string problem() const;
  void check() const;

 private:
  struct Entry {
    std::string flag, path;
    bool folder = false;
  };
  std::vector<Entry> inputs_, outputs_;
  std::vector<std::pair<std::string, std::string>> shared_;
};

}  // namespace ringtrain::io
