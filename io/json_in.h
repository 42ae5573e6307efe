// io/json_in.h: the one checked reader for the JSON files ringtrain reads (dataset manifests, folder
// locks, the records of a --log-jsonl log). nlohmann's own accessors throw "[json.exception.type_error.302]
// type must be number, but is string", naming nothing; a JsonIn access that finds a missing key, a wrong
// type or a number out of range throws a ringtrain::Error naming the file, the key's path and what was
// expected:
//   const json j = io::parse_json_file(path, "manifest");        // a regular file, size-capped, valid JSON
//   io::JsonIn in(j, path.string());                            // the top level must be an object
//   int64_t n = in.integer("records", 0, 1 << 30);              // "'m.json': key 'records' must be ..."
//   for (const io::JsonIn& shard : in.objects("shards")) ...    // "... key 'shards[3].file' ..."
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ringtrain::io {

// The whole of `path` as JSON: an Error naming `what` and the file when it is not a regular file (a
// folder, a FIFO: never read, so never a hang), is larger than `max_bytes`, or is not valid JSON.
nlohmann::json parse_json_file(const std::filesystem::path& path, const std::string& what,
                               int64_t max_bytes = int64_t{64} << 20);

class JsonIn {
 public:
  // `file` names the source in errors ("'log.jsonl' line 7"); `where` is the key path to `j` ("shards[3]").
  // `j` must be an object (an Error otherwise) and outlive this reader.
  JsonIn(const nlohmann::json& j, std::string file, std::string where = "");

  bool has(const std::string& key) const;
  // A required member, as a JsonIn (an object).
  JsonIn at(const std::string& key) const;
  // A required member that is a list of objects, each as a JsonIn named "key[i]".
  std::vector<JsonIn> objects(const std::string& key) const;

  std::string text(const std::string& key) const;
  std::string text_or(const std::string& key, const std::string& otherwise) const;
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t integer_or(const std::string& key, int64_t otherwise, int64_t lo, int64_t hi) const;
  double number(const std::string& key) const;  // finite
  double number_or(const std::string& key, double otherwise) const;
  bool boolean_or(const std::string& key, bool otherwise) const;
  std::vector<std::string> texts_or(const std::string& key) const;  // missing: empty
  std::vector<float> floats_or(const std::string& key) const;       // missing: empty

  const nlohmann::json& raw() const { return j_; }
  // "'file': key 'where.key'", for messages of the caller's own checks.
  std::string name(const std::string& key) const;
  // An Error "<name(key)> must be <expected>, got <value>".
  [[noreturn]] void wrong(const std::string& key, const std::string& expected) const;

 private:
  const nlohmann::json& member(const std::string& key) const;  // required
  const nlohmann::json& j_;
  std::string file_, where_;
};

}  // namespace ringtrain::io
