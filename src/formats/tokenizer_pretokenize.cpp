// Pre-tokenization: the regex splits of tokenizer.json (PCRE2 with Unicode properties and JIT).
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "formats/tokenizer_internal.h"

namespace anvil::tokenizer_detail {

namespace {

// GPT-2's split, used by a ByteLevel pre-tokenizer with use_regex.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const nlohmann::json& spec, const JsonWhere& where) {
  if (!spec.is_string()) where.fail("expected a string");
  const std::string name = spec.get<std::string>();
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  where.fail(fmt::format("unknown split behavior '{}'", name));
}

bool bool_field(const nlohmann::json& spec, const char* key, bool fallback, const JsonWhere& where) {
  if (!spec.contains(key) || spec[key].is_null()) return fallback;
  if (!spec[key].is_boolean()) where.at(key).fail("expected true or false");
  return spec[key].get<bool>();
}

// Folds the segments of a piece (matches and the gaps between them, covering it all) into pieces,
// the way tokenizers' NormalizedString::split does for each SplitDelimiterBehavior.
void fold_segments(const std::vector<PreTokenizeScratch::Segment>& segments, Behavior behavior,
                   std::vector<std::pair<size_t, size_t>>& out) {
  out.clear();
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const auto& s : segments) {
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      }
      return;
    case Behavior::kIsolated:
      for (const auto& s : segments) out.emplace_back(s.begin, s.end);
      return;
    case Behavior::kMergedWithPrevious:
      for (const auto& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      return;
    case Behavior::kMergedWithNext:
      for (auto s = segments.rbegin(); s != segments.rend(); ++s) {
        if (s->is_match && !previous_match && !out.empty()) {
          out.back().first = s->begin;
        } else {
          out.emplace_back(s->begin, s->end);
        }
        previous_match = s->is_match;
      }
      std::reverse(out.begin(), out.end());
      return;
    case Behavior::kContiguous:
      // Runs of segments of one kind join: adjacent matches, or (inverted) adjacent non-matches.
      for (const auto& s : segments) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      return;
  }
}

}  // namespace

// ---- Regex -------------------------------------------------------------------------------------

RegexScratch::RegexScratch()
    : data_(pcre2_match_data_create(1, nullptr)), context_(pcre2_match_context_create(nullptr)) {
  if (!data_ || !context_) throw std::bad_alloc();
}

RegexScratch::~RegexScratch() {
  if (jit_stack_) pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

Regex::Regex(std::string_view pattern, bool literal, const JsonWhere& where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                        &error_offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    where.fail(fmt::format("invalid regex: {} (near offset {} of the pattern)",
                           reinterpret_cast<const char*>(message), error_offset));
  }
  // Without JIT (a platform PCRE2 lacks it for) matching still works, only slower.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view subject, RegexScratch& scratch,
                     std::vector<std::pair<size_t, size_t>>& matches) const {
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t offset = 0;
  while (offset < subject.size()) {
    // The text was validated once at the top of encode(); re-checking it per match would be quadratic.
    const int rc =
        pcre2_match(code_, data, subject.size(), offset, PCRE2_NO_UTF_CHECK, scratch.data_, scratch.context_);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !scratch.jit_stack_) {
      // Long runs of one character class can outgrow the default 32 KiB JIT stack.
      scratch.jit_stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      if (!scratch.jit_stack_) throw std::bad_alloc();
      pcre2_jit_stack_assign(scratch.context_, nullptr, scratch.jit_stack_);
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      anvil::fail("pre-tokenizer regex failed at byte {}: {}", offset,
                  reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data_);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // An empty match splits nothing; step one character so the scan moves on.
      offset = begin + utf8_step(subject, begin).length;
    }
  }
}

// ---- Pre-tokenizer -----------------------------------------------------------------------------

struct PreTokenizer::Step {
  std::unique_ptr<Regex> regex;  // null: no split (ByteLevel without use_regex)
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer PreTokenizer::from_json(const nlohmann::json& spec, const JsonWhere& where) {
  PreTokenizer result;
  if (spec.is_null()) return result;
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    where.fail("expected an object with a \"type\"");
  }
  const std::string type = spec["type"].get<std::string>();
  Step step;
  if (type == "Sequence") {
    const JsonWhere list_where = where.at("pretokenizers");
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array())
      list_where.fail("expected an array");
    const auto& list = spec["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i) {
      PreTokenizer inner = from_json(list[i], list_where.at(i));
      for (auto& inner_step : inner.steps_) result.steps_.push_back(std::move(inner_step));
    }
    return result;
  } else if (type == "Split") {
    const JsonWhere pattern_where = where.at("pattern");
    if (!spec.contains("pattern") || !spec["pattern"].is_object())
      pattern_where.fail("expected {\"Regex\": ...} or {\"String\": ...}");
    const auto& pattern = spec["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.regex =
          std::make_unique<Regex>(pattern["Regex"].get<std::string>(), false, pattern_where.at("Regex"));
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.regex =
          std::make_unique<Regex>(pattern["String"].get<std::string>(), true, pattern_where.at("String"));
    } else {
      pattern_where.fail("expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!spec.contains("behavior")) where.at("behavior").fail("missing");
    step.behavior = parse_behavior(spec["behavior"], where.at("behavior"));
    step.invert = bool_field(spec, "invert", false, where);
  } else if (type == "ByteLevel") {
    // The byte-level mapping itself needs no step: the BPE model works on raw bytes.
    step.add_prefix_space = bool_field(spec, "add_prefix_space", false, where);
    if (bool_field(spec, "use_regex", true, where)) {
      step.regex = std::make_unique<Regex>(kGpt2Pattern, false, where);
    }
  } else if (type == "Digits") {
    const bool individual = bool_field(spec, "individual_digits", false, where);
    step.regex = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", false, where);
  } else {
    where.at("type").fail(
        fmt::format("unsupported pre-tokenizer '{}' (supported: Split, ByteLevel, Digits, Sequence)", type));
  }
  result.steps_.push_back(std::move(step));
  return result;
}

void PreTokenizer::split(std::string_view text, PreTokenizeScratch& scratch) const {
  scratch.owned.clear();
  scratch.pieces.clear();
  if (text.empty()) return;
  scratch.pieces.push_back(text);
  for (const Step& step : steps_) {
    scratch.next_pieces.clear();
    for (std::string_view piece : scratch.pieces) {
      if (step.add_prefix_space && piece.front() != ' ') {
        std::string& prefixed = scratch.owned.emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        piece = scratch.owned.back();
      }
      if (!step.regex) {
        scratch.next_pieces.push_back(piece);
        continue;
      }
      scratch.matches.clear();
      step.regex->find_all(piece, scratch.regex, scratch.matches);
      scratch.segments.clear();
      size_t cursor = 0;
      for (const auto& [begin, end] : scratch.matches) {
        if (begin > cursor) scratch.segments.push_back({cursor, begin, step.invert});
        scratch.segments.push_back({begin, end, !step.invert});
        cursor = end;
      }
      if (cursor < piece.size()) scratch.segments.push_back({cursor, piece.size(), step.invert});
      fold_segments(scratch.segments, step.behavior, scratch.folded);
      for (const auto& [begin, end] : scratch.folded)
        scratch.next_pieces.push_back(piece.substr(begin, end - begin));
    }
    std::swap(scratch.pieces, scratch.next_pieces);
  }
}

}  // namespace anvil::tokenizer_detail
