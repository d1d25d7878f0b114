#pragma once
// JSON building blocks for constraint grammars: whitespace, strings (valid UTF-8, escapes,
// length bounds, a few formats), numbers (digit-capped, optionally range-bounded), and "any JSON
// value" with bounded nesting. Each block is a rule of the shared GrammarBuilder.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/constraint_grammar.h"

namespace anvil::constraint {

// Bounds keep every loop the model could get stuck in finite.
inline constexpr int kMaxDepth = 32;         // nesting of objects and arrays
inline constexpr int kMaxIntDigits = 18;     // integer part of an unbounded number (fits int64)
inline constexpr int kMaxFracDigits = 18;    // digits after the decimal point
inline constexpr int kMaxExpDigits = 2;      // exponent digits
inline constexpr int kMaxIndent = 32;        // spaces/tabs after a newline

// One side of a numeric range; bounds are integers.
struct Bound {
  int64_t value = 0;
  bool exclusive = false;
};

class JsonGrammar {
 public:
  explicit JsonGrammar(GrammarBuilder& b) : b_(b) {}
  GrammarBuilder& builder() { return b_; }

  // Nothing, one space, or a newline and an indent: pretty-printing fits, endless blank runs do not.
  uint32_t ws();
  // A quoted string of min..max characters (code points; an escape is one), max < 0: unbounded.
  uint32_t string(int64_t min_chars, int64_t max_chars);
  // A quoted string in a format it enforces (date, time, date-time, uuid); nullopt for others.
  std::optional<uint32_t> formatted_string(std::string_view format);
  // Any JSON number.
  uint32_t number();
  // Canonical integers within the bounds.
  uint32_t integer(std::optional<Bound> lo, std::optional<Bound> hi);
  // Decimal numbers (no exponent) within the bounds; some values near an exclusive bound of a
  // negative range are left out, which keeps the grammar small and the output still valid.
  uint32_t bounded_number(std::optional<Bound> lo, std::optional<Bound> hi);
  // Any JSON value / object / array; children nest one level deeper, and at kMaxDepth only
  // scalars remain.
  uint32_t any_value(int depth);
  uint32_t any_object(int depth);
  // An object with arbitrary string keys whose values match value_rule.
  uint32_t object_of(uint32_t value_rule);
  // An array of min..max items (max < 0: unbounded) matching item_rule.
  uint32_t array_of(uint32_t item_rule, int64_t min_items, int64_t max_items);
  // A literal (already JSON-encoded text) as a rule.
  uint32_t literal(std::string_view text);

 private:
  uint32_t string_char();
  uint32_t digits_between(const std::string& lo, const std::string& hi);
  uint32_t unsigned_range(uint64_t lo, uint64_t hi);
  // Decimals whose magnitude lies between the bounds (hi absent: unbounded).
  uint32_t magnitude(Bound lo, std::optional<Bound> hi);
  // An optional '.' and digits: any digits, zeros only, or (required) digits not all zero.
  enum class Fraction { kAny, kZeros, kNonZero };
  uint32_t fraction(Fraction kind);
  uint32_t digit_run(int64_t min, int64_t max);

  GrammarBuilder& b_;
  std::optional<uint32_t> ws_, char_, string_, number_;
  std::unordered_map<int, uint32_t> fraction_;
  std::unordered_map<int, uint32_t> any_value_, any_object_, any_array_;
};

}  // namespace anvil::constraint
