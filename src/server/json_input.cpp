#include "server/json_input.h"

#include <cmath>

#include "formats/tokenizer.h"

namespace anvil::server {

void check_json_depth(std::string_view text, int max_depth, const std::string& param) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        bad_request(param, "JSON nests deeper than {} levels", max_depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

Json parse_request_body(std::string_view body) {
  if (body.empty()) bad_request("body", "the request body is empty; expected a JSON object");
  if (!is_valid_utf8(body)) bad_request("body", "the request body is not valid UTF-8");
  check_json_depth(body, kMaxJsonDepth, "body");
  Json parsed;
  try {
    parsed = Json::parse(body);
  } catch (const Json::exception& error) {
    bad_request("body", "invalid JSON: {}", error.what());
  }
  if (!parsed.is_object()) bad_request("body", "the request body must be a JSON object, got {}", json_type_name(parsed));
  return parsed;
}

std::string json_type_name(const Json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

int64_t integer_value(const Json& value, const std::string& param, int64_t min, int64_t max) {
  int64_t result = 0;
  if (value.is_number_unsigned()) {
    const uint64_t unsigned_value = value.get<uint64_t>();
    if (unsigned_value > uint64_t(max)) bad_request(param, "{} must be at most {}, got {}", param, max, unsigned_value);
    result = int64_t(unsigned_value);
  } else if (value.is_number_integer()) {
    result = value.get<int64_t>();
  } else if (value.is_number_float()) {
    // pydantic (and so vLLM) takes 5.0 for an integer field; 5.5 or 1e300 is an error.
    const double d = value.get<double>();
    if (!(std::isfinite(d) && d == std::floor(d) && d >= double(min) && d <= double(max)))
      bad_request(param, "{} must be an integer in [{}, {}], got {}", param, min, max, d);
    result = int64_t(d);
  } else {
    bad_request(param, "{} must be an integer, got {}", param, json_type_name(value));
  }
  if (result < min || result > max) bad_request(param, "{} must be in [{}, {}], got {}", param, min, max, result);
  return result;
}

const std::string& string_value(const Json& value, const std::string& param) {
  if (!value.is_string()) bad_request(param, "{} must be a string, got {}", param, json_type_name(value));
  return value.get_ref<const std::string&>();
}

const Json& object_value(const Json& value, const std::string& param) {
  if (!value.is_object()) bad_request(param, "{} must be an object, got {}", param, json_type_name(value));
  return value;
}

const Json& array_value(const Json& value, const std::string& param) {
  if (!value.is_array()) bad_request(param, "{} must be an array, got {}", param, json_type_name(value));
  return value;
}

FieldReader::FieldReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

std::string FieldReader::param(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool FieldReader::has(std::string_view key) const {
  const auto found = object_.find(key);
  return found != object_.end() && !found->is_null();
}

const Json* FieldReader::raw(std::string_view key) {
  read_.emplace(key);
  const auto found = object_.find(key);
  if (found == object_.end() || found->is_null()) return nullptr;
  return &*found;
}

std::optional<bool> FieldReader::boolean(std::string_view key) {
  const Json* value = raw(key);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) bad_request(param(key), "{} must be a boolean, got {}", param(key), json_type_name(*value));
  return value->get<bool>();
}

std::optional<int64_t> FieldReader::integer(std::string_view key, int64_t min, int64_t max) {
  const Json* value = raw(key);
  if (!value) return std::nullopt;
  return integer_value(*value, param(key), min, max);
}

std::optional<double> FieldReader::number(std::string_view key, double min, double max) {
  const Json* value = raw(key);
  if (!value) return std::nullopt;
  if (!value->is_number()) bad_request(param(key), "{} must be a number, got {}", param(key), json_type_name(*value));
  const double d = value->get<double>();
  if (!(std::isfinite(d) && d >= min && d <= max)) bad_request(param(key), "{} must be in [{}, {}], got {}", param(key), min, max, d);
  return d;
}

std::optional<std::string> FieldReader::string(std::string_view key) {
  const Json* value = raw(key);
  if (!value) return std::nullopt;
  return string_value(*value, param(key));
}

std::optional<std::string> FieldReader::choice(std::string_view key, std::initializer_list<std::string_view> choices) {
  std::optional<std::string> value = string(key);
  if (!value) return value;
  for (const std::string_view c : choices)
    if (*value == c) return value;
  std::string allowed;
  for (const std::string_view c : choices) allowed += (allowed.empty() ? "" : ", ") + std::string(c);
  bad_request(param(key), "{} must be one of {}, got '{}'", param(key), allowed, *value);
}

void FieldReader::ignore(std::initializer_list<std::string_view> keys) {
  for (const std::string_view key : keys) read_.emplace(key);
}

std::vector<std::string> FieldReader::unread_keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object_.items())
    if (!read_.contains(key)) keys.push_back(path_.empty() ? key : path_ + "." + key);
  return keys;
}

}  // namespace anvil::server
