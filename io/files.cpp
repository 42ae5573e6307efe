// io/files.cpp: file-kind checks before opening.
#include "io/files.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/check.h"

namespace ringtrain::io {
namespace fs = std::filesystem;

std::string kind_of(const fs::file_status& status) {
  switch (status.type()) {
    case fs::file_type::regular:
      return "a regular file";
    case fs::file_type::directory:
      return "a folder";
    case fs::file_type::fifo:
      return "a FIFO (named pipe)";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::symlink:
      return "a symbolic link";
    case fs::file_type::not_found:
      return "missing";
    default:
      return "not a regular file";
  }
}

namespace {

void check_kind(const fs::path& path, const std::string& what, bool missing_ok) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found || (ec && ec == std::errc::no_such_file_or_directory)) {
    if (missing_ok) return;
    RT_THROW(what, " '", path.string(), "' does not exist");
  }
  if (ec) RT_THROW(what, " '", path.string(), "': cannot look at it: ", ec.message());
  if (st.type() == fs::file_type::regular) return;
  if (st.type() == fs::file_type::directory) RT_THROW(what, " '", path.string(), "' is a folder, not a file");
  RT_THROW(what, " '", path.string(), "' is ", kind_of(st),
           ", not a regular file: opening it could block or read "
           "something else than a file");
}

}  // namespace

void require_regular_file(const fs::path& path, const std::string& what) { check_kind(path, what, false); }

std::string explain_write_failure(const fs::path& dir, const std::string& message, uint64_t bytes_needed) {
  struct statvfs st {};
  const bool known = ::statvfs((dir.empty() ? fs::path(".") : dir).c_str(), &st) == 0;
  const uint64_t free_bytes = known ? static_cast<uint64_t>(st.f_bavail) * st.f_frsize : 0;
  const bool full = message.find("errno = 28") != std::string::npos ||
                    message.find("No space left on device") != std::string::npos ||
                    (known && bytes_needed > 0 && free_bytes < bytes_needed);
  if (!full) return message;
  return detail::str_cat("no space left on the device of '", dir.string(), "' (",
                         known ? std::to_string(free_bytes) : "?", " bytes free",
                         bytes_needed > 0 ? detail::str_cat(", about ", bytes_needed, " needed") : "",
                         "): free space or write elsewhere (", message, ")");
}
void require_regular_if_exists(const fs::path& path, const std::string& what) { check_kind(path, what, true); }

void write_text(const fs::path& path, const std::string& text, const std::string& what, bool append) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::ofstream out(path, append ? std::ios::app : std::ios::trunc);
  if (!out)
    RT_THROW(explain_write_failure(dir, detail::str_cat(what, append ? ": cannot append to '" : ": cannot write '",
                                                        path.string(), "': ", std::strerror(errno))));
  out << text;
  out.close();
  if (out.fail())
    RT_THROW(explain_write_failure(
        dir, detail::str_cat(what, ": writing '", path.string(), "' failed: ", std::strerror(errno)), text.size()));
}

}  // namespace ringtrain::io
