// core/device.cpp: Device naming and parsing (device-independent part of core/device.h).
#include "core/device.h"

#include <charconv>

#include "core/check.h"

namespace ringtrain {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0 && !digits.empty())
      return Device::cuda(index);
  }
  RT_THROW("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace ringtrain
