// runtime/fault_injection.cpp: RINGTRAIN_INJECT parsing and the faults themselves.
#include "runtime/fault_injection.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/check.h"

namespace ringtrain::runtime {
namespace {

int64_t parse_count(const std::string& text, const std::string& whole, const char* field, int64_t max) {
  const bool digits = !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoll(text) > max)
    RT_THROW("RINGTRAIN_INJECT: ", field, " must be a number from 0 to ", max, ", got '", text, "' in '", whole,
             "' (expected KIND:RANK:STEP, e.g. throw:1:2)");
  return std::stoll(text);
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& s) {
  const size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  RT_CHECK(a != std::string::npos && b != std::string::npos && s.find(':', b + 1) == std::string::npos,
           "RINGTRAIN_INJECT: expected KIND:RANK:STEP (e.g. throw:1:2), got '", s, "'");
  FaultInjection f;
  const std::string kind = s.substr(0, a);
  if (kind == "throw") f.kind = Kind::Throw;
  else if (kind == "desync") f.kind = Kind::Desync;
  else if (kind == "hang") f.kind = Kind::Hang;
  else RT_THROW("RINGTRAIN_INJECT: unknown kind '", kind, "' in '", s, "' (expected throw, desync or hang)");
  f.rank = static_cast<int>(parse_count(s.substr(a + 1, b - a - 1), s, "RANK", 1 << 24));
  f.step = parse_count(s.substr(b + 1), s, "STEP", int64_t{1} << 40);
  RT_CHECK(f.step >= 1, "RINGTRAIN_INJECT: STEP counts optimizer steps from 1, got 0 in '", s, "'");
  return f;
}

FaultInjection FaultInjection::from_env() {
  const char* text = std::getenv("RINGTRAIN_INJECT");
  return text ? parse(text) : FaultInjection{};
}

int64_t FaultInjection::after_step(int rank_here, int64_t step_now) const {
  if (kind == Kind::None || rank_here != rank || step_now != step) return step_now;
  switch (kind) {
    case Kind::Throw: RT_THROW("injected failure at step ", step_now);
    case Kind::Desync: return step_now + 1;
    case Kind::Hang: std::this_thread::sleep_for(std::chrono::hours(1)); return step_now;
    case Kind::None: break;
  }
  return step_now;
}

}  // namespace ringtrain::runtime
