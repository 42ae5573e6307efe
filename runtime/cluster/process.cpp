// runtime/cluster/process.cpp: process liveness from /proc, the host name.
#include "runtime/cluster/process.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "core/check.h"

namespace ringtrain::runtime {

bool process_running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat(detail::str_cat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // "pid (comm) S ...": the state follows the command's last ')'
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string this_host() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace ringtrain::runtime
