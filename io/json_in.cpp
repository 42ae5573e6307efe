// io/json_in.cpp: checked JSON reading (see json_in.h).
#include "io/json_in.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "io/files.h"

namespace ringtrain::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

json parse_json_file(const fs::path& path, const std::string& what, int64_t max_bytes) {
  require_regular_file(path, what);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  RT_CHECK(!ec, what, " '", path.string(), "': cannot read its size: ", ec.message());
  RT_CHECK(static_cast<int64_t>(size) <= max_bytes, what, " '", path.string(), "' is ", size, " bytes, more than the ",
           max_bytes, " such a file may have");
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in.good(), what, " '", path.string(), "' cannot be opened");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const std::exception& e) {
    RT_THROW(what, " '", path.string(), "' is not valid JSON: ", e.what());
  }
}

namespace {

std::string shown(const json& v) {
  std::string text = v.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

}  // namespace

JsonIn::JsonIn(const json& j, std::string file, std::string where)
    : j_(j), file_(std::move(file)), where_(std::move(where)) {
  if (!j_.is_object())
    RT_THROW("'", file_, "'",
             where_.empty() ? std::string(" must hold a JSON object") : " key '" + where_ + "' must be an object",
             ", got ", shown(j_));
}

std::string JsonIn::name(const std::string& key) const {
  return detail::str_cat("'", file_, "': key '", where_.empty() ? key : where_ + "." + key, "'");
}

void JsonIn::wrong(const std::string& key, const std::string& expected) const {
  const json* v = j_.contains(key) ? &j_[key] : nullptr;
  RT_THROW(name(key), v ? " must be " + expected + ", got " + shown(*v) : " is missing (" + expected + ")");
}

bool JsonIn::has(const std::string& key) const { return j_.contains(key); }

const json& JsonIn::member(const std::string& key) const {
  if (!j_.contains(key)) wrong(key, "given");
  return j_[key];
}

JsonIn JsonIn::at(const std::string& key) const {
  if (!member(key).is_object()) wrong(key, "an object");
  return JsonIn(j_[key], file_, where_.empty() ? key : where_ + "." + key);
}

std::vector<JsonIn> JsonIn::objects(const std::string& key) const {
  const json& v = member(key);
  if (!v.is_array()) wrong(key, "a list of objects");
  std::vector<JsonIn> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.emplace_back(v[i], file_, detail::str_cat(where_.empty() ? key : where_ + "." + key, "[", i, "]"));
  return out;
}

std::string JsonIn::text(const std::string& key) const {
  const json& v = member(key);
  if (!v.is_string()) wrong(key, "a string");
  return v.get<std::string>();
}

std::string JsonIn::text_or(const std::string& key, const std::string& otherwise) const {
  return has(key) ? text(key) : otherwise;
}

int64_t JsonIn::integer(const std::string& key, int64_t lo, int64_t hi) const {
  const json& v = member(key);
  const std::string expected = detail::str_cat("an integer from ", lo, " to ", hi);
  if (!v.is_number_integer()) wrong(key, expected);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) wrong(key, expected);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) wrong(key, expected);
  return x;
}

int64_t JsonIn::integer_or(const std::string& key, int64_t otherwise, int64_t lo, int64_t hi) const {
  return has(key) ? integer(key, lo, hi) : otherwise;
}

double JsonIn::number(const std::string& key) const {
  const json& v = member(key);
  if (!v.is_number() || !std::isfinite(v.get<double>())) wrong(key, "a finite number");
  return v.get<double>();
}

double JsonIn::number_or(const std::string& key, double otherwise) const { return has(key) ? number(key) : otherwise; }

bool JsonIn::boolean_or(const std::string& key, bool otherwise) const {
  if (!has(key)) return otherwise;
  if (!j_[key].is_boolean()) wrong(key, "true or false");
  return j_[key].get<bool>();
}

std::vector<std::string> JsonIn::texts_or(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const json& v = j_[key];
  if (!v.is_array()) wrong(key, "a list of strings");
  for (const json& e : v) {
    if (!e.is_string()) wrong(key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<float> JsonIn::floats_or(const std::string& key) const {
  std::vector<float> out;
  if (!has(key)) return out;
  const json& v = j_[key];
  if (!v.is_array()) wrong(key, "a list of numbers");
  for (const json& e : v) {
    if (!e.is_number() || !std::isfinite(e.get<double>()) || std::fabs(e.get<double>()) > 3.4e38)
      wrong(key, "a list of finite numbers");
    out.push_back(e.get<float>());
  }
  return out;
}

}  // namespace ringtrain::io
