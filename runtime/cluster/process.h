// runtime/cluster/process.h: facts about processes on this host, for the files that name their writer (the
// checkpoint folder's lock, temporary checkpoint files).
#pragma once

#include <sys/types.h>

#include <string>

namespace ringtrain::runtime {

// Whether process `pid` on this host is still running. A killed process whose parent has not reaped it yet
// (a zombie: in a container whose init does not reap, for ever) is not.
bool process_running(pid_t pid);
// This host's name (gethostname).
std::string this_host();

}  // namespace ringtrain::runtime
