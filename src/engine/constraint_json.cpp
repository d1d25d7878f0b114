#include "engine/constraint_json.h"

#include <algorithm>

namespace anvil::constraint {

namespace {

constexpr int64_t kLimit = 999'999'999'999'999'999;  // largest magnitude with kMaxIntDigits digits

uint64_t pow10(int n) {
  uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

}  // namespace

uint32_t JsonGrammar::ws() {
  if (!ws_) {
    ByteSet indent;
    indent.add(' ');
    indent.add('\t');
    const uint32_t run = b_.repeat({b_.bytes(indent)}, 0, kMaxIndent);
    ws_ = b_.rule_of({{}, {b_.byte(' ')}, {b_.byte('\n'), GrammarBuilder::ref(run)}});
  }
  return *ws_;
}

uint32_t JsonGrammar::string_char() {
  if (char_) return *char_;
  // Well-formed UTF-8 spelled out byte by byte (no overlongs, surrogates or values past
  // U+10FFFF), so a token that ends inside a character leaves the matcher mid-character.
  ByteSet plain;
  plain.add_range(0x20, 0x7F);
  plain.words['"' >> 6] &= ~(uint64_t(1) << ('"' & 63));
  plain.words['\\' >> 6] &= ~(uint64_t(1) << ('\\' & 63));
  const Symbol cont = b_.range(0x80, 0xBF);
  ByteSet lead3;
  lead3.add_range(0xE1, 0xEC);
  lead3.add_range(0xEE, 0xEF);

  ByteSet hex;
  hex.add_range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  const Symbol h = b_.bytes(hex);
  ByteSet hex_not_d = hex;  // a first hex digit that cannot start a surrogate
  hex_not_d.words['d' >> 6] &= ~(uint64_t(1) << ('d' & 63));
  hex_not_d.words['D' >> 6] &= ~(uint64_t(1) << ('D' & 63));
  ByteSet d;
  d.add('d');
  d.add('D');
  ByteSet high, low;  // second hex digit of a high / low surrogate
  for (const char c : std::string_view("89abAB")) high.add(uint8_t(c));
  for (const char c : std::string_view("cdefCDEF")) low.add(uint8_t(c));
  ByteSet simple;
  for (const char c : std::string_view("\"\\/bfnrt")) simple.add(uint8_t(c));
  // \uXXXX must not leave a lone surrogate: JSON parsers reject those.
  const uint32_t escape = b_.rule_of({
      {b_.bytes(simple)},
      {b_.byte('u'), b_.bytes(hex_not_d), h, h, h},
      {b_.byte('u'), b_.bytes(d), b_.range('0', '7'), h, h},
      {b_.byte('u'), b_.bytes(d), b_.bytes(high), h, h, b_.byte('\\'), b_.byte('u'), b_.bytes(d), b_.bytes(low), h, h},
  });
  char_ = b_.rule_of({
      {b_.bytes(plain)},
      {b_.range(0xC2, 0xDF), cont},
      {b_.byte(0xE0), b_.range(0xA0, 0xBF), cont},
      {b_.bytes(lead3), cont, cont},
      {b_.byte(0xED), b_.range(0x80, 0x9F), cont},
      {b_.byte(0xF0), b_.range(0x90, 0xBF), cont, cont},
      {b_.range(0xF1, 0xF3), cont, cont, cont},
      {b_.byte(0xF4), b_.range(0x80, 0x8F), cont, cont},
      {b_.byte('\\'), GrammarBuilder::ref(escape)},
  });
  return *char_;
}

uint32_t JsonGrammar::string(int64_t min_chars, int64_t max_chars) {
  const bool free = min_chars == 0 && max_chars < 0;
  if (free && string_) return *string_;
  const uint32_t body = b_.repeat({GrammarBuilder::ref(string_char())}, min_chars, max_chars);
  const uint32_t rule = b_.rule_of({{b_.byte('"'), GrammarBuilder::ref(body), b_.byte('"')}});
  if (free) string_ = rule;
  return rule;
}

uint32_t JsonGrammar::digit_run(int64_t min, int64_t max) { return b_.repeat({b_.range('0', '9')}, min, max); }

std::optional<uint32_t> JsonGrammar::formatted_string(std::string_view format) {
  const Symbol digit = b_.range('0', '9');
  auto rule = [&](std::vector<Sequence> alternatives) { return GrammarBuilder::ref(b_.rule_of(std::move(alternatives))); };
  auto date = [&] {
    const Symbol month = rule({{b_.byte('0'), b_.range('1', '9')}, {b_.byte('1'), b_.range('0', '2')}});
    const Symbol day = rule({{b_.byte('0'), b_.range('1', '9')}, {b_.range('1', '2'), digit}, {b_.byte('3'), b_.range('0', '1')}});
    return Sequence{digit, digit, digit, digit, b_.byte('-'), month, b_.byte('-'), day};
  };
  auto time = [&] {
    const Symbol hour = rule({{b_.range('0', '1'), digit}, {b_.byte('2'), b_.range('0', '3')}});
    const Symbol minute = rule({{b_.range('0', '5'), digit}});
    const Symbol frac = rule({{}, {b_.byte('.'), GrammarBuilder::ref(digit_run(1, 9))}});
    ByteSet sign;
    sign.add('+');
    sign.add('-');
    const Symbol offset = rule({{b_.byte('Z')}, {b_.bytes(sign), hour, b_.byte(':'), minute}});
    return Sequence{hour, b_.byte(':'), minute, b_.byte(':'), minute, frac, offset};
  };
  Sequence body;
  if (format == "date") {
    body = date();
  } else if (format == "time") {
    body = time();
  } else if (format == "date-time") {
    body = date();
    body.push_back(b_.byte('T'));
    const Sequence t = time();
    body.insert(body.end(), t.begin(), t.end());
  } else if (format == "uuid") {
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    for (const int group : {8, 4, 4, 4, 12}) {
      if (!body.empty()) body.push_back(b_.byte('-'));
      for (int i = 0; i < group; ++i) body.push_back(b_.bytes(hex));
    }
  } else {
    return std::nullopt;
  }
  body.insert(body.begin(), b_.byte('"'));
  body.push_back(b_.byte('"'));
  return b_.rule_of({std::move(body)});
}

uint32_t JsonGrammar::number() {
  if (number_) return *number_;
  ByteSet e, sign;
  e.add('e');
  e.add('E');
  sign.add('+');
  sign.add('-');
  const uint32_t minus = b_.rule_of({{}, {b_.byte('-')}});
  const uint32_t int_part = b_.rule_of({{b_.byte('0')}, {b_.range('1', '9'), GrammarBuilder::ref(digit_run(0, kMaxIntDigits - 1))}});
  const uint32_t exp_sign = b_.rule_of({{}, {b_.bytes(sign)}});
  const uint32_t exponent =
      b_.rule_of({{}, {b_.bytes(e), GrammarBuilder::ref(exp_sign), GrammarBuilder::ref(digit_run(1, kMaxExpDigits))}});
  number_ = b_.rule_of({{GrammarBuilder::ref(minus), GrammarBuilder::ref(int_part),
                         GrammarBuilder::ref(fraction(Fraction::kAny)), GrammarBuilder::ref(exponent)}});
  return *number_;
}

uint32_t JsonGrammar::fraction(Fraction kind) {
  const auto found = fraction_.find(int(kind));
  if (found != fraction_.end()) return found->second;
  const Symbol dot = b_.byte('.');
  uint32_t rule = 0;
  switch (kind) {
    case Fraction::kAny:
      rule = b_.rule_of({{}, {dot, GrammarBuilder::ref(digit_run(1, kMaxFracDigits))}});
      break;
    case Fraction::kZeros:
      rule = b_.rule_of({{}, {dot, GrammarBuilder::ref(b_.repeat({b_.byte('0')}, 1, kMaxFracDigits))}});
      break;
    case Fraction::kNonZero:
      // Split at the first nonzero digit so each spelling has one parse.
      rule = b_.rule_of({{dot, GrammarBuilder::ref(b_.repeat({b_.byte('0')}, 0, kMaxFracDigits - 1)), b_.range('1', '9'),
                          GrammarBuilder::ref(digit_run(0, kMaxFracDigits - 1))}});
      break;
  }
  fraction_[int(kind)] = rule;
  return rule;
}

uint32_t JsonGrammar::digits_between(const std::string& lo, const std::string& hi) {
  // Equal-length decimal strings lo..hi: the classic split into a shared prefix, a middle band
  // of free digits, and the two ragged edges.
  const uint32_t rule = b_.new_rule();
  if (lo.empty()) {
    b_.add_alt(rule, {});
    return rule;
  }
  const size_t rest = lo.size() - 1;
  const std::string lo_tail = lo.substr(1), hi_tail = hi.substr(1);
  if (lo[0] == hi[0]) {
    b_.add_alt(rule, {b_.byte(uint8_t(lo[0])), GrammarBuilder::ref(digits_between(lo_tail, hi_tail))});
    return rule;
  }
  const bool lo_full = lo_tail == std::string(rest, '0');
  const bool hi_full = hi_tail == std::string(rest, '9');
  Sequence free_tail(rest, b_.range('0', '9'));
  if (!lo_full) {
    b_.add_alt(rule, {b_.byte(uint8_t(lo[0])), GrammarBuilder::ref(digits_between(lo_tail, std::string(rest, '9')))});
  }
  const char band_lo = char(lo_full ? lo[0] : lo[0] + 1), band_hi = char(hi_full ? hi[0] : hi[0] - 1);
  if (band_lo <= band_hi) {
    Sequence band{b_.range(uint8_t(band_lo), uint8_t(band_hi))};
    band.insert(band.end(), free_tail.begin(), free_tail.end());
    b_.add_alt(rule, std::move(band));
  }
  if (!hi_full) {
    b_.add_alt(rule, {b_.byte(uint8_t(hi[0])), GrammarBuilder::ref(digits_between(std::string(rest, '0'), hi_tail))});
  }
  return rule;
}

uint32_t JsonGrammar::unsigned_range(uint64_t lo, uint64_t hi) {
  const uint32_t rule = b_.new_rule();
  for (int len = 1; len <= kMaxIntDigits; ++len) {
    const uint64_t from = std::max(lo, len == 1 ? 0 : pow10(len - 1));
    const uint64_t to = std::min(hi, pow10(len) - 1);
    if (from <= to) b_.add_alt(rule, {GrammarBuilder::ref(digits_between(std::to_string(from), std::to_string(to)))});
  }
  return rule;
}

uint32_t JsonGrammar::integer(std::optional<Bound> lo, std::optional<Bound> hi) {
  if (!lo && !hi) {
    const uint32_t minus = b_.rule_of({{}, {b_.byte('-')}});
    const uint32_t digits = b_.rule_of({{b_.byte('0')}, {b_.range('1', '9'), GrammarBuilder::ref(digit_run(0, kMaxIntDigits - 1))}});
    return b_.rule_of({{GrammarBuilder::ref(minus), GrammarBuilder::ref(digits)}});
  }
  // Bounds arrive within +-1e18, so the adjustments cannot overflow. Past kLimit the range is
  // cut to what the digit cap can spell: narrower, never wider.
  const int64_t from = std::max(lo ? lo->value + (lo->exclusive ? 1 : 0) : -kLimit, -kLimit);
  const int64_t to = std::min(hi ? hi->value - (hi->exclusive ? 1 : 0) : kLimit, kLimit);
  const uint32_t rule = b_.new_rule();
  if (from <= to && from < 0) {
    const int64_t mag_lo = to < 0 ? -to : 1;
    b_.add_alt(rule, {b_.byte('-'), GrammarBuilder::ref(unsigned_range(uint64_t(mag_lo), uint64_t(-from)))});
  }
  if (from <= to && to >= 0) b_.add_alt(rule, {GrammarBuilder::ref(unsigned_range(uint64_t(std::max<int64_t>(from, 0)), uint64_t(to)))});
  return rule;
}

uint32_t JsonGrammar::magnitude(Bound lo, std::optional<Bound> hi) {
  const uint32_t rule = b_.new_rule();
  const int64_t a = lo.value;
  if (hi && (hi->value < a || (hi->value == a && (hi->exclusive || lo.exclusive)))) return rule;
  const Sequence a_text = b_.literal(std::to_string(a));
  auto with = [](Sequence s, uint32_t tail) {
    s.push_back(GrammarBuilder::ref(tail));
    return s;
  };
  if (hi && hi->value == a) {
    b_.add_alt(rule, with(a_text, fraction(Fraction::kZeros)));
    return rule;
  }
  // Integer part a: any fraction stays below a + 1 <= hi; past an exclusive a it must be nonzero.
  b_.add_alt(rule, with(a_text, fraction(lo.exclusive ? Fraction::kNonZero : Fraction::kAny)));
  const int64_t top = hi ? hi->value - 1 : kLimit;
  if (a + 1 <= top) {
    b_.add_alt(rule, {GrammarBuilder::ref(unsigned_range(uint64_t(a + 1), uint64_t(top))),
                      GrammarBuilder::ref(fraction(Fraction::kAny))});
  }
  if (hi && !hi->exclusive) b_.add_alt(rule, with(b_.literal(std::to_string(hi->value)), fraction(Fraction::kZeros)));
  return rule;
}

uint32_t JsonGrammar::bounded_number(std::optional<Bound> lo, std::optional<Bound> hi) {
  const uint32_t rule = b_.new_rule();
  // Past kLimit only narrowing is safe: a bound beyond what the digit cap can spell leaves nothing.
  if ((lo && lo->value > kLimit) || (hi && hi->value < -kLimit)) return rule;
  if (lo && lo->value < -kLimit) *lo = {-kLimit, false};
  if (hi && hi->value > kLimit) *hi = {kLimit, false};
  // Values >= 0: magnitudes from max(lo, 0) up to hi.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const Bound from = lo && lo->value >= 0 ? *lo : Bound{0, false};
    b_.add_alt(rule, {GrammarBuilder::ref(magnitude(from, hi))});
  }
  // Values < 0 (and "-0"): magnitudes from max(-hi, 0) up to -lo.
  if (!lo || lo->value < 0) {
    const Bound from = hi && hi->value <= 0 ? Bound{-hi->value, hi->exclusive} : Bound{0, false};
    const std::optional<Bound> to = lo ? std::optional<Bound>(Bound{-lo->value, lo->exclusive}) : std::nullopt;
    b_.add_alt(rule, {b_.byte('-'), GrammarBuilder::ref(magnitude(from, to))});
  }
  return rule;
}

uint32_t JsonGrammar::literal(std::string_view text) { return b_.rule_of({b_.literal(text)}); }

uint32_t JsonGrammar::any_value(int depth) {
  const auto found = any_value_.find(depth);
  if (found != any_value_.end()) return found->second;
  const uint32_t rule = b_.new_rule();
  any_value_[depth] = rule;
  b_.add_alt(rule, {GrammarBuilder::ref(string(0, -1))});
  b_.add_alt(rule, {GrammarBuilder::ref(number())});
  for (const char* word : {"true", "false", "null"}) b_.add_alt(rule, b_.literal(word));
  if (depth < kMaxDepth) {
    b_.add_alt(rule, {GrammarBuilder::ref(any_object(depth))});
    const auto array = any_array_.find(depth);
    const uint32_t array_rule = array != any_array_.end() ? array->second : array_of(any_value(depth + 1), 0, -1);
    any_array_[depth] = array_rule;
    b_.add_alt(rule, {GrammarBuilder::ref(array_rule)});
  }
  return rule;
}

uint32_t JsonGrammar::any_object(int depth) {
  const auto found = any_object_.find(depth);
  if (found != any_object_.end()) return found->second;
  const uint32_t rule = depth < kMaxDepth ? object_of(any_value(depth + 1)) : b_.new_rule();
  any_object_[depth] = rule;
  return rule;
}

uint32_t JsonGrammar::object_of(uint32_t value_rule) {
  using G = GrammarBuilder;
  const Symbol w = G::ref(ws());
  const Sequence member{G::ref(string(0, -1)), w, b_.byte(':'), w, G::ref(value_rule), w};
  Sequence more{b_.byte(','), w};
  more.insert(more.end(), member.begin(), member.end());
  Sequence members = member;
  members.push_back(G::ref(b_.repeat(more, 0, -1)));
  members.push_back(b_.byte('}'));
  const uint32_t body = b_.rule_of({{b_.byte('}')}, std::move(members)});
  return b_.rule_of({{b_.byte('{'), w, G::ref(body)}});
}

uint32_t JsonGrammar::array_of(uint32_t item_rule, int64_t min_items, int64_t max_items) {
  using G = GrammarBuilder;
  const Symbol w = G::ref(ws());
  const Sequence item{G::ref(item_rule), w};
  const Sequence more{b_.byte(','), w, G::ref(item_rule), w};
  const uint32_t body = b_.new_rule();
  if (min_items == 0) b_.add_alt(body, {});
  if (max_items != 0) {
    Sequence items = item;
    items.push_back(G::ref(b_.repeat(more, std::max<int64_t>(min_items - 1, 0), max_items < 0 ? -1 : max_items - 1)));
    b_.add_alt(body, std::move(items));
  }
  return b_.rule_of({{b_.byte('['), w, G::ref(body), b_.byte(']')}});
}

}  // namespace anvil::constraint
