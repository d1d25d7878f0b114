#pragma once
// Request bodies: bounded parsing and typed field access. Every failure is an ApiError (400) that
// names the field, so handlers never see a value of the wrong type or range.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace anvil::server {

// Nesting deeper than this is refused before the parser sees it: the limit keeps hostile bodies
// (100000 nested arrays) from exhausting the stack in parsing, copying or destroying the value.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body that must be a JSON object. Invalid UTF-8, bad syntax, numbers that
// overflow a double and excessive depth are 400s.
Json parse_request_body(std::string_view body);
// Fails with 400 when `text` nests deeper than max_depth (strings are skipped correctly).
void check_json_depth(std::string_view text, int max_depth, const std::string& param);

// Typed reads of an object's fields. A null value counts as absent, as OpenAI's and vLLM's
// optional fields do. The reader remembers which keys were read so the rest can be reported.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string path);

  bool has(std::string_view key) const;
  // The raw value (null when absent or null); marks the key as known.
  const Json* raw(std::string_view key);
  std::optional<bool> boolean(std::string_view key);
  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max);
  std::optional<double> number(std::string_view key, double min, double max);
  std::optional<std::string> string(std::string_view key);
  // A string, or one of `choices`.
  std::optional<std::string> choice(std::string_view key, std::initializer_list<std::string_view> choices);
  // Marks keys as known without reading them.
  void ignore(std::initializer_list<std::string_view> keys);
  std::vector<std::string> unread_keys() const;
  std::string param(std::string_view key) const;

 private:
  const Json& object_;
  std::string path_;
  std::set<std::string, std::less<>> read_;
};

// The same checks on a bare value (array items and nested values).
int64_t integer_value(const Json& value, const std::string& param, int64_t min, int64_t max);
const std::string& string_value(const Json& value, const std::string& param);
const Json& object_value(const Json& value, const std::string& param);
const Json& array_value(const Json& value, const std::string& param);
std::string json_type_name(const Json& value);

}  // namespace anvil::server
