// io/files.cpp: file-kind checks before opening.
#include "io/files.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/hdf5.h"

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

fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  p = p.lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();  // "dir/" is "dir"
  for (int hop = 0; hop < 40; ++hop) {                                   // as the kernel's limit on links followed
    const fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
    if (!ec) p = parent / p.filename();
    if (!fs::is_symlink(fs::symlink_status(p, ec))) break;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = (target.is_absolute() ? target : p.parent_path() / target).lexically_normal();
  }
  const fs::path canonical = fs::weakly_canonical(p, ec);
  return ec ? p : canonical;
}

std::string clobber_problem(const std::string& flag, const std::string& path, bool append_jsonl) {
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec) || fs::file_size(path, ec) == 0) return "";
  bool hdf5 = false;
  {
    // HDF5's own test: its signature may also follow a user block (at 512, 1024, ... bytes).
    const std::lock_guard<std::recursive_mutex> guard(h5::lock());
    h5::silence_errors();
    hdf5 = H5Fis_hdf5(path.c_str()) > 0;
  }
  if (hdf5)
    return detail::str_cat(flag, " '", path, "' is an HDF5 file (a checkpoint or a data shard): text written there ",
                           "would destroy it; write it elsewhere");
  if (!append_jsonl) return "";
  std::ifstream in(path, std::ios::binary);
  std::string first;
  std::getline(in, first);
  // A ringtrain log begins with a record on its first line: an object with a "type". A pretty-printed JSON
  // file (a manifest), a one-line JSON file (a link file), a trace or any other text is not one.
  const nlohmann::json record = nlohmann::json::parse(first, nullptr, false);
  if (!record.is_object() || !record.contains("type") || !record["type"].is_string())
    return detail::str_cat(flag, " '", path, "' exists and is not a JSON-lines log of ringtrain's (its first line is ",
                           "no record with a \"type\"): appending would corrupt it; give a new file or an earlier ",
                           "run's log");
  return "";
}

namespace {

struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  nlink_t links = 0;
  fs::path where;  // resolved
};

Identity identity_of(const std::string& path) {
  Identity id;
  id.where = resolved(path);
  struct stat st {};
  if (::stat(id.where.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    id.links = st.st_nlink;
  }
  return id;
}

bool same(const Identity& a, const Identity& b) {
  if (a.exists && b.exists) return a.dev == b.dev && a.ino == b.ino;
  return a.where == b.where;
}

// `inner` is `outer` or lies under it, by resolved path; or (a hard link) is one of its files.
bool inside(const Identity& inner, const Identity& outer, bool inner_is_file) {
  const auto mismatch = std::mismatch(outer.where.begin(), outer.where.end(), inner.where.begin(), inner.where.end());
  if (mismatch.first == outer.where.end()) return true;
  if (!inner_is_file || !inner.exists || inner.links < 2 || !outer.exists) return false;
  std::error_code ec;
  int64_t seen = 0;
  for (auto it = fs::recursive_directory_iterator(outer.where, ec);
       !ec && it != fs::recursive_directory_iterator() && seen < 100000; it.increment(ec), ++seen) {
    struct stat st {};
    if (::stat(it->path().c_str(), &st) == 0 && st.st_dev == inner.dev && st.st_ino == inner.ino) return true;
  }
  return false;
}

}  // namespace

RunFiles& RunFiles::reads(std::string flag, std::string path) {
  if (!path.empty()) inputs_.push_back({std::move(flag), std::move(path)});
  return *this;
}
RunFiles& RunFiles::reads_folder(std::string flag, std::string path) {
  if (!path.empty()) inputs_.push_back({std::move(flag), std::move(path), true});
  return *this;
}
RunFiles& RunFiles::writes(std::string flag, std::string path) {
  if (!path.empty()) outputs_.push_back({std::move(flag), std::move(path)});
  return *this;
}
RunFiles& RunFiles::writes_folder(std::string flag, std::string path) {
  if (!path.empty()) outputs_.push_back({std::move(flag), std::move(path), true});
  return *this;
}
RunFiles& RunFiles::may_share(std::string flag_a, std::string flag_b) {
  shared_.emplace_back(std::move(flag_a), std::move(flag_b));
  return *this;
}

std::string RunFiles::problem() const {
  const auto named = [](const Entry& e) { return detail::str_cat(e.flag, " '", e.path, "'"); };
  const auto shared = [&](const Entry& a, const Entry& b) {
    for (const auto& [x, y] : shared_)
      if ((x == a.flag && y == b.flag) || (x == b.flag && y == a.flag)) return true;
    return false;
  };
  std::vector<Identity> in, out;
  for (const Entry& e : inputs_) in.push_back(identity_of(e.path));
  for (const Entry& e : outputs_) out.push_back(identity_of(e.path));
  for (size_t o = 0; o < outputs_.size(); ++o) {
    const Entry& w = outputs_[o];
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Entry& r = inputs_[i];
      if (!r.folder && !w.folder && same(out[o], in[i]))
        return detail::str_cat(named(w), " is the file that ", named(r), " names, which the run reads: writing it ",
                               "would destroy it; write it elsewhere");
      if (r.folder && inside(out[o], in[i], !w.folder))
        return detail::str_cat(named(w), " lies in ", named(r), ", a folder the run reads: writing there would ",
                               "change what it reads; write it elsewhere");
    }
    for (size_t k = o + 1; k < outputs_.size(); ++k) {
      const Entry& v = outputs_[k];
      if (w.folder != v.folder) {
        const Entry& file = w.folder ? v : w;
        const Entry& folder = w.folder ? w : v;
        if (same(out[o], out[k])) return detail::str_cat(named(file), " is the ", folder.flag, " folder itself");
      } else if (same(out[o], out[k]) && !shared(w, v)) {
        return detail::str_cat(named(w), " and ", named(v), " are the same ", w.folder ? "folder" : "file",
                               ": each output needs a ", w.folder ? "folder" : "file", " of its own");
      }
    }
  }
  return "";
}

void RunFiles::check() const {
  if (const std::string p = problem(); !p.empty()) RT_THROW(p);
}

}  // namespace ringtrain::io
