// io/files.h: what a file must be before ringtrain opens it. A FIFO, a device or a socket where a manifest,
// hostfile, checkpoint or log belongs would block a read or write forever (or read garbage); a folder where a
// file belongs gives a misleading "not an HDF5 file". Errors name what the file is for and what it is.
#pragma once

#include <filesystem>
#include <string>

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

}  // namespace ringtrain::io
