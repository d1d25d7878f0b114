#include "engine/constraint_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/constraint_json.h"

namespace anvil::constraint {

namespace {

using Json = nlohmann::ordered_json;  // property order is the order the output follows
using G = GrammarBuilder;

constexpr int64_t kMaxRepeat = 10000;  // minLength/maxLength/minItems/maxItems are unrolled

// Keywords that change which instances are valid and that this compiler understands.
const std::set<std::string_view> kSupported = {
    "type",      "properties", "required",  "additionalProperties", "enum",      "const",
    "items",     "minItems",   "maxItems",  "anyOf",                "oneOf",     "allOf",
    "$ref",      "minLength",  "maxLength", "format",               "minimum",   "maximum",
    "exclusiveMinimum", "exclusiveMaximum"};
// Validation keywords that are not enforced: silently dropping one would let invalid output
// through, so each is an error.
const std::set<std::string_view> kUnsupported = {
    "pattern",      "patternProperties", "propertyNames",  "minProperties",    "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "prefixItems", "additionalItems", "contains", "minContains", "maxContains",
    "uniqueItems",  "multipleOf",        "not",            "if",               "then",
    "else",         "$dynamicRef",       "$recursiveRef",  "contentSchema"};
const char* const kTypes[] = {"null", "boolean", "integer", "number", "string", "array", "object"};

std::string at(const std::string& where) { return "#" + where; }

bool matches_type(const Json& value, std::string_view type) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "integer") return value.is_number_integer() || (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  if (type == "number") return value.is_number();
  if (type == "string") return value.is_string();
  if (type == "array") return value.is_array();
  return type == "object" && value.is_object();
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  Grammar compile() {
    const uint32_t root = compile(root_, 0, "");
    return std::move(builder_).build(
        root, fmt::format("json_schema: no JSON value satisfies the schema within {} levels of nesting", kMaxDepth));
  }

 private:
  uint32_t compile(const Json& schema, int depth, const std::string& where) {
    const std::pair<const Json*, int> key{&schema, depth};
    const auto found = memo_.find(key);
    if (found != memo_.end()) return found->second;
    // Depth only grows inside objects and arrays, so meeting the same schema at the same depth
    // again means references that loop without ever nesting: no finite instance.
    if (!in_progress_.insert(key).second) fail("json_schema: '$ref' loop at {} never nests inside an object or array", at(where));
    const uint32_t rule = compile_uncached(schema, depth, where);
    in_progress_.erase(key);
    memo_[key] = rule;
    return rule;
  }

  uint32_t compile_uncached(const Json& s, int depth, const std::string& where) {
    if (s.is_boolean()) return s.get<bool>() ? json_.any_value(depth) : builder_.new_rule();
    if (!s.is_object()) fail("json_schema: expected a schema (an object, true or false) at {}", at(where));
    for (const auto& [keyword, value] : s.items()) {
      if (kUnsupported.count(keyword) && !(keyword == "uniqueItems" && value == false)) {
        fail("json_schema: '{}' is not supported (at {})", keyword, at(where));
      }
    }
    if (s.contains("$ref")) return compile_ref(s, depth, where);
    for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      alone(s, combinator, {}, where);
      const Json& branches = s[combinator];
      if (!branches.is_array() || branches.empty()) fail("json_schema: '{}' must be a non-empty array (at {})", combinator, at(where));
      if (std::string_view(combinator) == "allOf" && branches.size() != 1) {
        fail("json_schema: 'allOf' with more than one schema is not supported (at {})", at(where));
      }
      const uint32_t rule = builder_.new_rule();
      for (size_t i = 0; i < branches.size(); ++i) {
        builder_.add_alt(rule, {G::ref(compile(branches[i], depth, fmt::format("{}/{}/{}", where, combinator, i)))});
      }
      return rule;
    }
    const std::vector<std::string> types = types_of(s, where);
    if (s.contains("enum") || s.contains("const")) return compile_enum(s, types, where);
    if (types.empty()) return json_.any_value(depth);
    const uint32_t rule = builder_.new_rule();
    for (const std::string& type : types) builder_.add_alt(rule, {G::ref(compile_type(s, type, depth, where))});
    return rule;
  }

  // Intersecting a combinator with sibling keywords is not supported: name the sibling.
  void alone(const Json& s, std::string_view keyword, std::set<std::string_view> allowed, const std::string& where) {
    allowed.insert(keyword);
    for (const auto& item : s.items()) {
      if (kSupported.count(item.key()) && !allowed.count(item.key())) {
        fail("json_schema: '{}' next to '{}' is not supported (at {})", item.key(), keyword, at(where));
      }
    }
  }

  uint32_t compile_ref(const Json& s, int depth, const std::string& where) {
    alone(s, "$ref", {}, where);
    if (!s["$ref"].is_string()) fail("json_schema: '$ref' must be a string (at {})", at(where));
    const std::string ref = s["$ref"].get<std::string>();
    if (ref == "#") return compile(root_, depth, "");
    if (ref.rfind("#/", 0) != 0) fail("json_schema: '$ref' {} is not supported (only local references such as #/$defs/Name)", ref);
    const Json* target = nullptr;
    try {
      const Json::json_pointer pointer(ref.substr(1));
      if (root_.contains(pointer)) target = &root_.at(pointer);
    } catch (const nlohmann::json::exception&) {
    }
    if (!target) fail("json_schema: '$ref' {} does not point into the schema (at {})", ref, at(where));
    return compile(*target, depth, ref.substr(1));
  }

  std::vector<std::string> types_of(const Json& s, const std::string& where) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& type = s["type"];
      const std::vector<Json> listed = type.is_array() ? std::vector<Json>(type.begin(), type.end()) : std::vector<Json>{type};
      for (const Json& t : listed) {
        const bool known = t.is_string() && std::find(std::begin(kTypes), std::end(kTypes), t.get<std::string>()) != std::end(kTypes);
        if (!known) fail("json_schema: unknown type {} (at {})", t.dump(), at(where));
        types.push_back(t.get<std::string>());
      }
      if (types.empty()) fail("json_schema: 'type' is an empty list (at {})", at(where));
      return types;
    }
    // Without a type, keywords still hint at one; producing that type is always valid.
    auto has_any = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (has_any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has_any({"items", "minItems", "maxItems"})) types.push_back("array");
    if (has_any({"minLength", "maxLength", "format"})) types.push_back("string");
    if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    return types;
  }

  uint32_t compile_enum(const Json& s, const std::vector<std::string>& types, const std::string& where) {
    alone(s, s.contains("enum") ? "enum" : "const", {"enum", "const", "type"}, where);
    std::vector<Json> values;
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) fail("json_schema: 'enum' must be an array (at {})", at(where));
      values.assign(s["enum"].begin(), s["enum"].end());
    }
    if (s.contains("const")) {
      const bool listed = !s.contains("enum") || std::find(values.begin(), values.end(), s["const"]) != values.end();
      values.clear();
      if (listed) values.push_back(s["const"]);
    }
    const uint32_t rule = builder_.new_rule();
    for (const Json& value : values) {
      const bool typed = types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) { return matches_type(value, t); });
      if (typed) builder_.add_alt(rule, builder_.literal(value.dump()));
    }
    return rule;
  }

  int64_t count(const Json& s, const char* keyword, int64_t fallback, const std::string& where) {
    if (!s.contains(keyword)) return fallback;
    const Json& v = s[keyword];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      fail("json_schema: '{}' must be a non-negative integer (at {})", keyword, at(where));
    }
    const uint64_t n = v.get<uint64_t>();
    if (n > uint64_t(kMaxRepeat)) fail("json_schema: '{}' above {} is not supported (at {})", keyword, kMaxRepeat, at(where));
    return int64_t(n);
  }

  // The tighter of an inclusive and an exclusive bound. Integers round non-integer bounds
  // inward; numbers accept integer-valued bounds only.
  std::optional<Bound> bound(const Json& s, bool lower, bool integer, const std::string& where) {
    std::optional<Bound> result;
    for (const bool exclusive : {false, true}) {
      const char* keyword = lower ? (exclusive ? "exclusiveMinimum" : "minimum") : (exclusive ? "exclusiveMaximum" : "maximum");
      if (!s.contains(keyword)) continue;
      if (!s[keyword].is_number()) fail("json_schema: '{}' must be a number (at {})", keyword, at(where));
      const double value = std::clamp(s[keyword].get<double>(), -1e18, 1e18);
      Bound b{int64_t(lower ? std::ceil(value) : std::floor(value)), exclusive};
      if (double(b.value) != value) {
        if (!integer) fail("json_schema: non-integer '{}' on a number is not supported (at {})", keyword, at(where));
        b.exclusive = false;  // rounding inward already excludes the bound
      }
      const bool tighter = !result || (lower ? b.value > result->value : b.value < result->value) ||
                           (b.value == result->value && b.exclusive);
      if (tighter) result = b;
    }
    return result;
  }

  uint32_t compile_type(const Json& s, const std::string& type, int depth, const std::string& where) {
    if (type == "null") return json_.literal("null");
    if (type == "boolean") return builder_.rule_of({builder_.literal("true"), builder_.literal("false")});
    if (type == "integer" || type == "number") {
      const bool integer = type == "integer";
      const auto lo = bound(s, true, integer, where), hi = bound(s, false, integer, where);
      if (integer) return json_.integer(lo, hi);
      return lo || hi ? json_.bounded_number(lo, hi) : json_.number();
    }
    if (type == "string") {
      if (s.contains("format")) {
        if (!s["format"].is_string()) fail("json_schema: 'format' must be a string (at {})", at(where));
        const std::string format = s["format"].get<std::string>();
        if (const auto rule = json_.formatted_string(format)) {
          if (s.contains("minLength") || s.contains("maxLength")) {
            fail("json_schema: 'minLength'/'maxLength' with format '{}' is not supported (at {})", format, at(where));
          }
          return *rule;
        }
      }
      const int64_t min = count(s, "minLength", 0, where), max = count(s, "maxLength", -1, where);
      return max >= 0 && max < min ? builder_.new_rule() : json_.string(min, max);
    }
    if (depth >= kMaxDepth) return builder_.new_rule();  // too deep: this branch has no instance
    if (type == "array") {
      const int64_t min = count(s, "minItems", 0, where), max = count(s, "maxItems", -1, where);
      if (max >= 0 && max < min) return builder_.new_rule();
      uint32_t item = 0;
      if (!s.contains("items")) {
        item = json_.any_value(depth + 1);
      } else if (s["items"].is_array()) {
        fail("json_schema: 'items' as an array (tuple validation) is not supported (at {})", at(where));
      } else {
        item = compile(s["items"], depth + 1, where + "/items");
      }
      return json_.array_of(item, min, max);
    }
    return compile_object(s, depth, where);
  }

  uint32_t compile_object(const Json& s, int depth, const std::string& where) {
    std::vector<std::pair<std::string, const Json*>> props;  // nullptr: any value
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail("json_schema: 'properties' must be an object (at {})", at(where));
      for (const auto& [name, sub] : s["properties"].items()) props.emplace_back(name, &sub);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& list = s["required"];
      if (!list.is_array()) fail("json_schema: 'required' must be an array of strings (at {})", at(where));
      for (const Json& name : list) {
        if (!name.is_string()) fail("json_schema: 'required' must be an array of strings (at {})", at(where));
        required.insert(name.get<std::string>());
      }
    }
    const Json extra = s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
    if (!extra.is_boolean() && !extra.is_object()) fail("json_schema: 'additionalProperties' must be a schema (at {})", at(where));
    for (const std::string& name : required) {
      const bool declared = std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == name; });
      if (declared) continue;
      if (extra == false) return builder_.new_rule();  // required yet forbidden: no instance
      props.emplace_back(name, extra.is_object() ? &s["additionalProperties"] : nullptr);
    }
    const Symbol w = G::ref(json_.ws());
    if (props.empty()) {
      if (extra == false) return builder_.rule_of({{builder_.byte('{'), w, builder_.byte('}')}});
      if (extra == true) return json_.any_object(depth);
      return json_.object_of(compile(s["additionalProperties"], depth + 1, where + "/additionalProperties"));
    }
    // Build from the last property back. first: nothing written yet; more: a comma comes first.
    uint32_t first = builder_.rule_of({{}}), more = builder_.rule_of({{}});
    for (size_t i = props.size(); i-- > 0;) {
      const auto& [name, sub] = props[i];
      const uint32_t value = sub ? compile(*sub, depth + 1, where + "/properties/" + name) : json_.any_value(depth + 1);
      Sequence member = builder_.literal(Json(name).dump());
      member.insert(member.end(), {w, builder_.byte(':'), w, G::ref(value), w});
      Sequence first_alt = member, more_alt{builder_.byte(','), w};
      first_alt.push_back(G::ref(more));
      more_alt.insert(more_alt.end(), member.begin(), member.end());
      more_alt.push_back(G::ref(more));
      const bool optional = !required.count(name);
      const uint32_t new_first = builder_.rule_of({std::move(first_alt)});
      const uint32_t new_more = builder_.rule_of({std::move(more_alt)});
      if (optional) {
        builder_.add_alt(new_first, {G::ref(first)});
        builder_.add_alt(new_more, {G::ref(more)});
      }
      first = new_first;
      more = new_more;
    }
    return builder_.rule_of({{builder_.byte('{'), w, G::ref(first), builder_.byte('}')}});
  }

  const Json& root_;
  GrammarBuilder builder_;
  JsonGrammar json_{builder_};
  std::map<std::pair<const Json*, int>, uint32_t> memo_;
  std::set<std::pair<const Json*, int>> in_progress_;
};

}  // namespace

Grammar json_object_grammar() {
  GrammarBuilder builder;
  JsonGrammar json(builder);
  const uint32_t root = json.any_object(0);
  return std::move(builder).build(root, "json_object: empty grammar");
}

Grammar json_schema_grammar(const std::string& schema_json) {
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    fail("json_schema: not valid JSON: {}", e.what());
  }
  return SchemaCompiler(schema).compile();
}

}  // namespace anvil::constraint
