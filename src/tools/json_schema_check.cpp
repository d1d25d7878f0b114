#include "tools/json_schema_check.h"

#include <fmt/format.h>

namespace anvil::tools {

namespace {

using Json = nlohmann::json;

bool has_type(const Json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer()) return true;
    return value.is_number_float() && value.get<double>() == double(int64_t(value.get<double>()));
  }
  return true;  // an unknown type name constrains nothing here
}

size_t code_points(const std::string& text) {
  size_t count = 0;
  for (const char c : text) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return count;
}

std::string short_dump(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string check(const Json& value, const Json& schema, const std::string& path) {
  if (schema.is_boolean()) return schema.get<bool>() ? "" : path + ": no value is allowed here";
  if (!schema.is_object()) return "";
  if (schema.contains("type")) {
    const Json& type = schema["type"];
    bool ok = false;
    if (type.is_string()) ok = has_type(value, type.get<std::string>());
    else if (type.is_array())
      for (const Json& t : type) ok = ok || (t.is_string() && has_type(value, t.get<std::string>()));
    else ok = true;
    if (!ok) return fmt::format("{}: {} is not of type {}", path, short_dump(value), type.dump());
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool found = false;
    for (const Json& option : schema["enum"]) found = found || option == value;
    if (!found) return fmt::format("{}: {} is not one of {}", path, short_dump(value), short_dump(schema["enum"]));
  }
  if (schema.contains("const") && schema["const"] != value)
    return fmt::format("{}: {} is not {}", path, short_dump(value), short_dump(schema["const"]));
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key) || !schema[key].is_array()) continue;
    size_t matching = 0;
    std::string first;
    for (const Json& branch : schema[key]) {
      const std::string why = check(value, branch, path);
      if (why.empty()) ++matching;
      else if (first.empty()) first = why;
    }
    if (matching == 0) return fmt::format("{}: matches none of {} ({})", path, key, first);
    if (std::string(key) == "oneOf" && matching > 1) return fmt::format("{}: matches more than one of oneOf", path);
  }
  if (schema.contains("allOf") && schema["allOf"].is_array())
    for (const Json& branch : schema["allOf"])
      if (std::string why = check(value, branch, path); !why.empty()) return why;
  if (value.is_object()) {
    const Json properties = schema.value("properties", Json::object());
    if (schema.contains("required") && schema["required"].is_array())
      for (const Json& key : schema["required"])
        if (key.is_string() && !value.contains(key.get<std::string>()))
          return fmt::format("{}: the required key \"{}\" is missing", path, key.get<std::string>());
    for (const auto& [key, item] : value.items()) {
      const std::string child = path + "." + key;
      if (properties.is_object() && properties.contains(key)) {
        if (std::string why = check(item, properties[key], child); !why.empty()) return why;
        continue;
      }
      if (schema.contains("additionalProperties")) {
        const Json& extra = schema["additionalProperties"];
        if (extra.is_boolean() && !extra.get<bool>()) return fmt::format("{}: the key \"{}\" is not allowed", path, key);
        if (extra.is_object())
          if (std::string why = check(item, extra, child); !why.empty()) return why;
      }
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>())
      return fmt::format("{}: {} items, fewer than minItems {}", path, value.size(), schema["minItems"].dump());
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>())
      return fmt::format("{}: {} items, more than maxItems {}", path, value.size(), schema["maxItems"].dump());
    if (schema.contains("items") && schema["items"].is_object())
      for (size_t i = 0; i < value.size(); ++i)
        if (std::string why = check(value[i], schema["items"], fmt::format("{}[{}]", path, i)); !why.empty()) return why;
  }
  if (value.is_string()) {
    const size_t length = code_points(value.get<std::string>());
    if (schema.contains("minLength") && schema["minLength"].is_number() && double(length) < schema["minLength"].get<double>())
      return fmt::format("{}: {} characters, fewer than minLength {}", path, length, schema["minLength"].dump());
    if (schema.contains("maxLength") && schema["maxLength"].is_number() && double(length) > schema["maxLength"].get<double>())
      return fmt::format("{}: {} characters, more than maxLength {}", path, length, schema["maxLength"].dump());
  }
  if (value.is_number()) {
    const double x = value.get<double>();
    const auto bound = [&](const char* key) { return schema.contains(key) && schema[key].is_number(); };
    if (bound("minimum") && x < schema["minimum"].get<double>())
      return fmt::format("{}: {} is below the minimum {}", path, value.dump(), schema["minimum"].dump());
    if (bound("maximum") && x > schema["maximum"].get<double>())
      return fmt::format("{}: {} is above the maximum {}", path, value.dump(), schema["maximum"].dump());
    if (bound("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>())
      return fmt::format("{}: {} is not above {}", path, value.dump(), schema["exclusiveMinimum"].dump());
    if (bound("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>())
      return fmt::format("{}: {} is not below {}", path, value.dump(), schema["exclusiveMaximum"].dump());
  }
  return "";
}

}  // namespace

std::string schema_violation(const nlohmann::json& value, const nlohmann::json& schema) { return check(value, schema, "$"); }

}  // namespace anvil::tools
