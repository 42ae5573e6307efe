// io/files.cpp: file-kind checks before opening.
#include "io/files.h"

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
void require_regular_if_exists(const fs::path& path, const std::string& what) { check_kind(path, what, true); }

}  // namespace ringtrain::io
