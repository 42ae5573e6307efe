// core/env.h: the environment variables ringtrain reads, one way (docs/ENVIRONMENT.md lists each with its
// meaning). Every RINGTRAIN_* variable is read here and nowhere else (tests/apps/env_rule.sh keeps it so).
// - a switch is 1 (on) or 0 (off); unset or empty is its default; anything else ("true", "no", "00",
//   " 0") is refused naming the variable, the value and what 1 would do;
// - a number follows core/parse.h's one rule in the range the caller states, refused naming the variable;
// - text (a path, a name, a spec that its own parser checks) is taken as written; empty counts as unset.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/parse.h"

namespace ringtrain {

// The variable's text; nullopt when it is unset or empty.
std::optional<std::string> env_text(const char* name);

// A switch: `fallback` when unset or empty, else 1 or 0. `meaning` says what on does, for the error:
// "RINGTRAIN_CUDA_SYNC='yes': expected 1 (synchronize after every CUDA op) or 0".
bool env_switch(const char* name, bool fallback, const char* meaning);

// A number in `range`; nullopt when unset or empty.
template <typename T>
std::optional<T> env_number(const char* name, const NumberRange<T>& range);

// Every RINGTRAIN_* variable that is set, checked at once by its kind (docs/ENVIRONMENT.md): a switch that is
// not 1 or 0, a number out of its range, a choice not among its names is an Error naming the variable, so a
// program refuses a bad value at its start, even one only a GPU run or a rare path would read. Returns a
// warning for each set RINGTRAIN_* name that no program reads (a misspelling: RINGTRAIN_THREAD).
std::vector<std::string> check_environment();

// A switch or a number of the table in core/env.cpp (docs/ENVIRONMENT.md), read with the meaning, default and
// range written there once: env_switch and env_number with the table's arguments. A name the table lacks, or
// lists as another kind, is a programming error.
bool ringtrain_switch(const char* name);
std::optional<int64_t> ringtrain_number(const char* name);

// RINGTRAIN_RESTART: which launch of a supervised run this is (ringtrain_run sets it: 0, 1, ...); 0 unset.
int64_t restart_count();

}  // namespace ringtrain
