#include "engine/constraint.h"

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/constraint_grammar.h"
#include "engine/constraint_schema.h"
#include "engine/constraint_vocab.h"
#include "formats/tokenizer.h"
#include "support/test_support.h"

namespace anvil {
namespace {

using Json = nlohmann::ordered_json;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest map to U+0100 onwards.
std::string byte_level(const std::string& bytes) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  std::string out;
  for (const char ch : bytes) {
    const int byte = uint8_t(ch);
    int codepoint = byte;
    if (!printable(byte)) {
      codepoint = 256;
      for (int c = 0; c < byte; ++c) codepoint += !printable(c);
    }
    if (codepoint < 0x80) {
      out += char(codepoint);
    } else {
      out += char(0xC0 | (codepoint >> 6));
      out += char(0x80 | (codepoint & 0x3F));
    }
  }
  return out;
}

// Every single byte (so no state is a dead end for lack of a token), multi-byte tokens that cross
// JSON structure, whole UTF-8 characters, and added tokens: special ones must never be allowed,
// the non-special <think> is ordinary text.
const Tokenizer& small_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    Json vocab = Json::object();
    for (int byte = 0; byte < 256; ++byte) vocab[byte_level(std::string(1, char(byte)))] = byte;
    const std::vector<std::string> pieces = {
        "{\"", "\":", "\": ", "true", "false", "null", "  ", "\n  ", "\n    ", "abc", ", \"", "\"}", "\"]", "}}",
        "]]", "[{", "},{", "}, {", "\":\"", "\": \"", "\", \"", " \"", "12", "0.5", "-1", "e+", "\\n", "\\u00e9",
        "\\ud83d", "\\ude00", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xE6\x97", "name", "age", "\":[",
        "circle", "square", "kind", "2024-01-05T", "ab\"", "\"a\"", "\"b\"", "00", "999", ".0", "[1,", "\" ", "x\"}"};
    for (const auto& piece : pieces) vocab[byte_level(piece)] = int(vocab.size());
    Json added = Json::array();
    const std::vector<std::pair<std::string, bool>> tokens = {
        {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<think>", false}, {"{\"special", true}};
    for (const auto& [content, special] : tokens) {
      added.push_back({{"id", int(vocab.size() + added.size())}, {"content", content}, {"special", special},
                       {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
    }
    const Json json = {
        {"version", "1.0"},
        {"added_tokens", added},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
        {"model",
         {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
          {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
          {"vocab", vocab}, {"merges", Json::array()}}}};
    return Tokenizer::from_json_text(json.dump(), "constraint-test/tokenizer.json");
  }();
  return *tokenizer;
}

// ---- A validator for the supported subset ------------------------------------------------------

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

bool integral(const Json& v) { return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()); }

bool has_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer") return v.is_number() && integral(v);
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  return v.is_object();
}

// Checks a string against a picture: 'd' a digit, 'h' a hex digit, anything else itself.
bool shaped(const std::string& text, const std::string& picture) {
  if (text.size() != picture.size()) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i], p = picture[i];
    const bool ok = p == 'd' ? std::isdigit(uint8_t(c)) != 0 : p == 'h' ? std::isxdigit(uint8_t(c)) != 0 : c == p;
    if (!ok) return false;
  }
  return true;
}

int number_at(const std::string& text, size_t at) { return std::stoi(text.substr(at, 2)); }

bool is_date_time(const std::string& text) {
  if (text.size() < 20 || !shaped(text.substr(0, 19), "dddd-dd-ddTdd:dd:dd")) return false;
  const int month = number_at(text, 5), day = number_at(text, 8), hour = number_at(text, 11);
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || number_at(text, 14) > 59 || number_at(text, 17) > 59) return false;
  std::string rest = text.substr(19);
  if (rest[0] == '.') {
    size_t digits = 1;
    while (digits < rest.size() && std::isdigit(uint8_t(rest[digits]))) ++digits;
    if (digits == 1) return false;
    rest = rest.substr(digits);
  }
  if (rest == "Z") return true;
  if (!shaped(rest, "+dd:dd") && !shaped(rest, "-dd:dd")) return false;
  return number_at(rest, 1) <= 23 && number_at(rest, 4) <= 59;
}

bool is_uuid(const std::string& text) { return shaped(text, "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh"); }

std::string validate(const Json& v, const Json& s, const Json& root);  // "" when valid

std::string validate_all(const Json& v, const Json& s, const Json& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, ref == "#" ? root : root.at(Json::json_pointer(ref.substr(1))), root);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    int passing = 0;
    for (const Json& branch : s[key]) passing += validate(v, branch, root).empty();
    if (passing == 0 || (std::string(key) == "oneOf" && passing != 1)) return std::string(key) + " fails";
  }
  if (s.contains("allOf")) {
    for (const Json& branch : s["allOf"]) {
      if (auto why = validate(v, branch, root); !why.empty()) return why;
    }
  }
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return "not in enum";
  if (s.contains("const") && s["const"] != v) return "not the const";
  if (s.contains("type")) {
    const Json types = s["type"].is_array() ? s["type"] : Json::array({s["type"]});
    if (std::none_of(types.begin(), types.end(), [&](const Json& t) { return has_type(v, t.get<std::string>()); })) return "wrong type";
  }
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (s.contains("minLength") && code_points(text) < s["minLength"].get<size_t>()) return "too short";
    if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<size_t>()) return "too long";
    const std::string format = s.value("format", "");
    if (format == "date-time" && !is_date_time(text)) return "bad date-time";
    if (format == "uuid" && !is_uuid(text)) return "bad uuid";
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return "below minimum";
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return "above maximum";
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return "not above exclusiveMinimum";
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return "not below exclusiveMaximum";
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "too many items";
    if (s.contains("items")) {
      for (const Json& item : v) {
        if (auto why = validate(item, s["items"], root); !why.empty()) return "item: " + why;
      }
    }
  }
  if (v.is_object()) {
    for (const Json& name : s.value("required", Json::array())) {
      if (!v.contains(name.get<std::string>())) return "missing " + name.get<std::string>();
    }
    const Json props = s.value("properties", Json::object());
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (auto why = validate(value, props[key], root); !why.empty()) return key + ": " + why;
      } else if (s.contains("additionalProperties")) {
        if (auto why = validate(value, s["additionalProperties"], root); !why.empty()) return "extra " + key + ": " + why;
      }
    }
  }
  return "";
}

std::string validate(const Json& v, const Json& s, const Json& root) { return validate_all(v, s, root); }

// ---- Random walks -------------------------------------------------------------------------------

struct Walk {
  std::string text;
  bool complete = false;
};

// Samples uniformly among the allowed tokens, then after `wander` steps prefers closing bytes so
// the walk ends; stops at random once the output is complete. Checks every step's invariants.
Walk random_walk(TokenConstraint& c, const Tokenizer& tok, std::mt19937& rng, int wander = 40) {
  Walk walk;
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (int step = 0; step < 2000; ++step) {
    std::fill(allowed.begin(), allowed.end(), 0);
    c.allowed_tokens(allowed);
    std::vector<int32_t> candidates, closers;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (!allowed[size_t(id)]) continue;
      EXPECT_FALSE(tok.is_special(id)) << "special token " << id << " allowed after " << walk.text;
      EXPECT_FALSE(tok.token_bytes(id).empty());
      candidates.push_back(id);
      const std::string& b = tok.token_bytes(id);
      if (b == "\"" || b == "}" || b == "]") closers.push_back(id);
    }
    walk.complete = c.is_complete();
    if (walk.complete && (candidates.empty() || rng() % 3 == 0)) break;
    if (candidates.empty()) {
      ADD_FAILURE() << "dead end after " << walk.text;
      break;
    }
    const auto& pool = step >= wander && !closers.empty() ? closers : candidates;
    const int32_t id = pool[rng() % pool.size()];
    c.accept(id);
    walk.text += tok.token_bytes(id);
  }
  return walk;
}

void check_schema_walks(const std::string& schema_text, int walks = 150) {
  SCOPED_TRACE(schema_text);
  const Json schema = Json::parse(schema_text);
  std::mt19937 rng(1234);
  for (int i = 0; i < walks; ++i) {
    auto c = make_json_schema_constraint(schema_text, small_tokenizer());
    const Walk walk = random_walk(*c, small_tokenizer(), rng);
    ASSERT_TRUE(walk.complete) << walk.text;
    Json value;
    ASSERT_NO_THROW(value = Json::parse(walk.text)) << walk.text;
    EXPECT_EQ(validate(value, schema, schema), "") << walk.text;
  }
}

TEST(JsonSchemaConstraint, ObjectsWithRequiredOptionalAndBounds) {
  check_schema_walks(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 130},
      "email": {"type": "string", "format": "email"},
      "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": false})");
}

TEST(JsonSchemaConstraint, NestedObjectsAndScalars) {
  check_schema_walks(R"({"type": "object", "properties": {
      "point": {"type": "object", "properties": {"x": {"type": "number"},
                "y": {"type": "number", "minimum": -5, "exclusiveMaximum": 5}}, "required": ["x", "y"]},
      "ok": {"type": "boolean"}, "none": {"type": "null"}},
    "required": ["point", "ok"]})");
}

TEST(JsonSchemaConstraint, ArraysOfBoundedIntegers) {
  check_schema_walks(R"({"type": "array", "items": {"type": "integer", "exclusiveMinimum": -3, "maximum": 1000},
                         "minItems": 2, "maxItems": 5})");
  check_schema_walks(R"({"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 3},
                         "minItems": 1, "maxItems": 2})");
  check_schema_walks(R"({"type": "integer", "minimum": -1234, "maximum": -17})");
  check_schema_walks(R"({"type": "integer", "minimum": 5.5, "exclusiveMaximum": 90})");
}

TEST(JsonSchemaConstraint, AnyOfOneOfAndEnums) {
  check_schema_walks(R"({"anyOf": [{"type": "string", "minLength": 2, "maxLength": 4}, {"type": "integer"}, {"type": "null"}]})");
  check_schema_walks(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
       "required": ["kind", "r"], "additionalProperties": false},
      {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1}},
       "required": ["kind", "side"], "additionalProperties": false}]})");
  check_schema_walks(R"({"type": "object", "properties": {
      "v": {"type": ["string", "null"]}, "e": {"enum": [1, "two", null, true, {"a": [1]}]},
      "c": {"const": 3.5}, "d": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
      "s": {"type": "string", "enum": ["x", 2, "y"]}},
    "required": ["v", "e", "c", "d", "u", "s"]})");
}

TEST(JsonSchemaConstraint, RefsToDefsAndDefinitionsIncludingRecursion) {
  check_schema_walks(R"({"$defs": {
      "item": {"type": "object", "properties": {"id": {"type": "integer"}, "label": {"$ref": "#/$defs/label"}}, "required": ["id"]},
      "label": {"type": "string", "enum": ["x", "y z", "\u00fc"]}},
    "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}}, "required": ["items"]})");
  check_schema_walks(R"({"definitions": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}},
      "required": ["value"], "additionalProperties": false}}, "$ref": "#/definitions/node"})");
  check_schema_walks(R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]})", 40);
}

TEST(JsonSchemaConstraint, FreeFormValuesAndNumberRanges) {
  check_schema_walks(R"({"type": "object"})");
  check_schema_walks(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  check_schema_walks(R"({"type": "object", "additionalProperties": false})", 20);
  check_schema_walks(R"({"description": "anything"})");
  check_schema_walks("true");
  check_schema_walks(R"({"type": "object", "properties": {
      "p": {"type": "number", "minimum": 0, "maximum": 1}, "q": {"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 0},
      "r": {"type": "number", "exclusiveMinimum": 0}, "t": {"type": "number", "minimum": -3, "maximum": 2}},
    "required": ["p", "q", "r", "t"]})");
}

TEST(JsonObjectConstraint, RandomWalksAreObjects) {
  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    auto c = make_json_object_constraint(small_tokenizer());
    const Walk walk = random_walk(*c, small_tokenizer(), rng, 60);
    ASSERT_TRUE(walk.complete) << walk.text;
    nlohmann::json value;
    ASSERT_NO_THROW(value = nlohmann::json::parse(walk.text)) << walk.text;
    EXPECT_TRUE(value.is_object()) << walk.text;
  }
}

TEST(JsonObjectConstraint, AcceptsPrettyPrintedJsonAndRejectsRunawayWhitespace) {
  const Tokenizer& tok = small_tokenizer();
  auto feed = [&](const std::string& text) {
    auto c = make_json_object_constraint(tok);
    for (const char ch : text) c->accept(int32_t(uint8_t(ch)));  // ids 0..255 are the bytes
    return c;
  };
  const std::string pretty = nlohmann::json::parse(R"({"a": [1, 2.5e-3, {"b": null}], "c": "\u00e9\ud83d\ude00\n"})").dump(2);
  EXPECT_TRUE(feed(pretty)->is_complete());
  EXPECT_TRUE(feed(R"({"a":[true,false,-0.5E+12,{}],"b":{}})")->is_complete());
  EXPECT_FALSE(feed(R"({"a": 1)")->is_complete());
  EXPECT_THROW(feed("{  "), Error);            // one space at most
  EXPECT_THROW(feed("[]"), Error);             // the top level is an object
  EXPECT_THROW(feed(R"({"a": 01})"), Error);   // no leading zeros
  EXPECT_THROW(feed("{\"\\ud800\"}"), Error);  // a lone surrogate escape
  EXPECT_THROW(feed("{\"\xC0\xAF\"}"), Error);  // overlong UTF-8
  EXPECT_THROW(feed("{\"a\": 1234567890123456789"), Error);  // digit cap
  EXPECT_THROW(feed(R"({"a": "x"} )"), Error);  // nothing after the value
  EXPECT_THROW(feed("{\"a\":" + std::string(32, '[')), Error);  // nesting cap
  EXPECT_NO_THROW(feed("{\"a\":" + std::string(31, '[')));
}

TEST(ConstraintTrie, MatchesTokenByTokenCheck) {
  // The trie walk must allow exactly the tokens whose bytes the matcher accepts one by one.
  const Tokenizer& tok = small_tokenizer();
  auto grammar = std::make_shared<const constraint::Grammar>(constraint::json_schema_grammar(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "array", "items": {"type": "number"}}}})"));
  constraint::GrammarMatcher matcher(grammar);
  const constraint::VocabTrie trie(tok);
  std::mt19937 rng(7);
  int32_t state = matcher.initial();
  for (int step = 0; step < 300 && state != constraint::GrammarMatcher::kDead; ++step) {
    std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
    trie.collect(matcher, state, allowed);
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      const bool fits = trie.usable(id) && matcher.next(state, tok.token_bytes(id)) != constraint::GrammarMatcher::kDead;
      ASSERT_EQ(bool(allowed[size_t(id)]), fits) << "token " << id << " at step " << step;
      if (fits) ids.push_back(id);
    }
    if (ids.empty()) break;
    state = matcher.next(state, tok.token_bytes(ids[rng() % ids.size()]));
    if (step == 20) {
      // Compacting drops the cache but must keep the position: both copies agree from here on.
      constraint::GrammarMatcher fresh = matcher;
      int32_t fresh_state = fresh.compact(state);
      EXPECT_EQ(fresh.num_states(), 1u);
      for (int k = 0; k < 30 && fresh_state != constraint::GrammarMatcher::kDead; ++k) {
        std::vector<uint8_t> a(size_t(tok.vocab_size())), b(size_t(tok.vocab_size()));
        trie.collect(matcher, state, a);
        trie.collect(fresh, fresh_state, b);
        ASSERT_EQ(a, b) << "step " << k << " after compacting";
        EXPECT_EQ(matcher.complete(state), fresh.complete(fresh_state));
        const int32_t id = int32_t(std::find(a.begin(), a.end(), 1) - a.begin()) ;
        if (size_t(id) == a.size()) break;
        state = matcher.next(state, tok.token_bytes(id));
        fresh_state = fresh.next(fresh_state, tok.token_bytes(id));
      }
    }
  }
}

TEST(JsonSchemaConstraint, UnsupportedKeywordsAreErrorsNamingThem) {
  auto message = [](const std::string& schema) {
    try {
      make_json_schema_constraint(schema, small_tokenizer());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "string", "pattern": "^a+$"})", "json_schema: 'pattern' is not supported"},
      {R"({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 2}}})", "'multipleOf'"},
      {R"({"type": "array", "uniqueItems": true})", "'uniqueItems'"},
      {R"({"not": {"type": "null"}})", "'not'"},
      {R"({"type": "array", "prefixItems": [{"type": "integer"}]})", "'prefixItems'"},
      {R"({"type": "object", "minProperties": 1})", "'minProperties'"},
      {R"({"type": "object", "patternProperties": {"^x": {}}})", "'patternProperties'"},
      {R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "'if'"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "'allOf'"},
      {R"({"anyOf": [{"type": "string"}], "type": "string"})", "'type' next to 'anyOf'"},
      {R"({"type": "number", "minimum": 0.5})", "'minimum'"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "'items'"},
      {R"({"$ref": "#/$defs/missing"})", "#/$defs/missing"},
      {R"({"$ref": "https://example.com/schema"})", "'$ref'"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "loop"},
      {R"({"type": "strin"})", "unknown type \"strin\""},
      {R"({"type": "object", "properties": {"a": false}, "required": ["a"]})", "no JSON value satisfies"},
      {R"({"type": "integer", "minimum": 1e300})", "no JSON value satisfies"},
      {R"({"type": "object", "properties": )", "json_schema: not valid JSON"},
  };
  for (const auto& [schema, expected] : cases) {
    const std::string got = message(schema);
    EXPECT_NE(got.find(expected), std::string::npos) << schema << " -> " << got;
    EXPECT_EQ(got.rfind("json_schema: ", 0), 0u) << got;
  }
  // Annotations and keywords outside JSON Schema are ignored; uniqueItems false is a no-op.
  EXPECT_EQ(message(R"({"title": "t", "description": "d", "default": 1, "examples": [2], "$schema": "x",
                        "type": "integer", "x-extra": 3})"), "no error");
  EXPECT_EQ(message(R"({"type": "array", "uniqueItems": false})"), "no error");
}

TEST(JsonSchemaConstraint, RejectsTokensOutsideTheSchema) {
  const Tokenizer& tok = small_tokenizer();
  auto c = make_json_schema_constraint(R"({"type": "object", "properties": {"kind": {"enum": ["circle", "square"]}}, "required": ["kind"]})", tok);
  EXPECT_FALSE(c->is_complete());
  for (const char* piece : {"{\"", "kind", "\": \"", "circle", "\"}"}) c->accept(*tok.token_id(byte_level(piece)));
  EXPECT_TRUE(c->is_complete());
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  c->allowed_tokens(allowed);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 0);  // only EOS (the engine's) remains
  auto d = make_json_schema_constraint(R"({"type": "boolean"})", tok);
  EXPECT_THROW(d->accept(*tok.token_id(byte_level("null"))), Error);
  EXPECT_THROW(d->accept(*tok.token_id("<|endoftext|>")), Error);
  d->accept(*tok.token_id(byte_level("true")));
  EXPECT_TRUE(d->is_complete());
}

// ---- The real 200k vocabulary -------------------------------------------------------------------

TEST(ConstraintHarmonyVocab, AllowedTokensIsFastAndExact) {
  const auto tok = Tokenizer::from_file(test::harmony_tokenizer_json());
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  auto t0 = Clock::now();
  const auto trie = constraint::VocabTrie::of(*tok);
  std::printf("[ vocab ] %d tokens, %zu trie nodes, built in %.1f ms\n", tok->vocab_size(), trie->num_nodes(), ms_since(t0));

  const std::string schema = R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}}, "address": {"type": "object", "properties": {
      "city": {"type": "string"}, "zip": {"type": "string", "maxLength": 10}}, "required": ["city"]}},
      "required": ["name", "age"]})";
  struct Case {
    const char* what;
    bool schema;
    std::string prefix;  // valid output so far, fed as the tokenizer encodes it
  };
  const std::vector<Case> cases = {
      {"schema, start", true, ""},
      {"schema, inside a string", true, R"({"name": "Hello wor)"},
      {"schema, after a key", true, R"({"name": "Ann", "age":)"},
      {"schema, nested string", true, R"({"name": "Ann", "age": 4, "address": {"city": "Par)"},
      {"json_object, inside a string", false, R"({"a": [1, {"b": "some text)"},
      {"json_object, value position", false, R"({"a": [1, )"},
  };
  t0 = Clock::now();
  for (int i = 0; i < 10; ++i) make_json_schema_constraint(schema, *tok);
  std::printf("[ vocab ] a schema constraint is made in %.2f ms (trie cached)\n", ms_since(t0) / 10);
  std::vector<uint8_t> allowed(size_t(tok->vocab_size()));
  for (const auto& test_case : cases) {
    auto c = test_case.schema ? make_json_schema_constraint(schema, *tok) : make_json_object_constraint(*tok);
    for (const int32_t id : tok->encode(test_case.prefix, false)) c->accept(id);
    t0 = Clock::now();
    std::fill(allowed.begin(), allowed.end(), 0);
    c->allowed_tokens(allowed);
    const double cold = ms_since(t0);
    constexpr int kRuns = 10;
    t0 = Clock::now();
    for (int i = 0; i < kRuns; ++i) {
      std::fill(allowed.begin(), allowed.end(), 0);
      c->allowed_tokens(allowed);
    }
    const double warm = ms_since(t0) / kRuns;
    const long count = std::count(allowed.begin(), allowed.end(), 1);
    std::printf("[ vocab ] %-30s %6ld allowed, first call %.2f ms, then %.2f ms per call\n", test_case.what, count, cold, warm);
    EXPECT_LT(warm, 200.0) << test_case.what;
    EXPECT_GT(count, 0) << test_case.what;
  }

  // Exactness on the big vocabulary: trie walk against token-by-token matching.
  auto grammar = std::make_shared<const constraint::Grammar>(constraint::json_schema_grammar(schema));
  constraint::GrammarMatcher matcher(grammar);
  const int32_t state = matcher.next(matcher.initial(), std::string(R"({"name": "x", "age": 1, "tags": [)"));
  ASSERT_NE(state, constraint::GrammarMatcher::kDead);
  std::fill(allowed.begin(), allowed.end(), 0);
  trie->collect(matcher, state, allowed);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    const bool fits = trie->usable(id) && matcher.next(state, tok->token_bytes(id)) != constraint::GrammarMatcher::kDead;
    ASSERT_EQ(bool(allowed[size_t(id)]), fits) << "token " << id;
  }

  // A few random walks with the real vocabulary still produce valid JSON.
  std::mt19937 rng(5);
  const Json parsed_schema = Json::parse(schema);
  for (int i = 0; i < 3; ++i) {
    auto c = make_json_schema_constraint(schema, *tok);
    const Walk walk = random_walk(*c, *tok, rng, 25);
    ASSERT_TRUE(walk.complete) << walk.text;
    Json value;
    ASSERT_NO_THROW(value = Json::parse(walk.text)) << walk.text;
    EXPECT_EQ(validate(value, parsed_schema, parsed_schema), "") << walk.text;
  }
}

}  // namespace
}  // namespace anvil
