// Text-level helpers of the tokenizer: UTF-8 checking and lossy decoding, the GPT-2 byte-level
// alphabet, Unicode normalization (utf8proc), and streaming decode.
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "formats/tokenizer.h"
#include "formats/tokenizer_internal.h"

namespace anvil {
namespace tokenizer_detail {

void JsonWhere::fail(std::string_view problem) const {
  if (field.empty()) anvil::fail("{}: {}", source, problem);
  anvil::fail("{}: {}: {}", source, field, problem);
}

// ---- UTF-8 -------------------------------------------------------------------------------------

Utf8Step utf8_step(std::string_view bytes, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + pos;
  const size_t available = bytes.size() - pos;
  const unsigned lead = p[0];
  if (lead < 0x80) return {1, true, false};
  // Table 3-7 of the Unicode standard: the second byte's range depends on the lead byte (this
  // rules out overlongs, surrogates and code points past U+10FFFF); later bytes are 80..BF.
  size_t continuation;
  unsigned low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation = 1;
  } else if (lead == 0xE0) {
    continuation = 2, low = 0xA0;
  } else if (lead == 0xED) {
    continuation = 2, high = 0x9F;
  } else if (lead >= 0xE1 && lead <= 0xEF) {
    continuation = 2;
  } else if (lead == 0xF0) {
    continuation = 3, low = 0x90;
  } else if (lead == 0xF4) {
    continuation = 3, high = 0x8F;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    continuation = 3;
  } else {
    return {1, false, false};
  }
  for (size_t i = 1; i <= continuation; ++i) {
    if (i >= available) return {i, false, true};
    if (p[i] < low || p[i] > high) return {i, false, false};
    low = 0x80, high = 0xBF;
  }
  return {continuation + 1, true, false};
}

size_t first_invalid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<unsigned char>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = utf8_step(bytes, pos);
    if (!step.valid) return pos;
    pos += step.length;
  }
  return std::string_view::npos;
}

size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool final) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t pos = 0;
  size_t run_start = 0;  // start of the well-formed run not yet copied
  while (pos < bytes.size()) {
    if (static_cast<unsigned char>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Step step = utf8_step(bytes, pos);
    if (step.valid) {
      pos += step.length;
      continue;
    }
    out.append(bytes.substr(run_start, pos - run_start));
    if (step.truncated && !final) return pos;
    out.append(kReplacement);
    pos += step.length;
    run_start = pos;
  }
  out.append(bytes.substr(run_start, pos - run_start));
  return pos;
}

char32_t next_codepoint(std::string_view text, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  if (p[0] < 0x80) {
    ++pos;
    return p[0];
  }
  if (p[0] < 0xE0) {
    pos += 2;
    return char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    pos += 3;
    return char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  }
  pos += 4;
  return char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 | char32_t(p[2] & 0x3F) << 6 |
         (p[3] & 0x3F);
}

char32_t previous_codepoint(std::string_view text, size_t& pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t cursor = start;
  const char32_t codepoint = next_codepoint(text, cursor);
  pos = start;
  return codepoint;
}

void append_utf8(std::string& out, char32_t codepoint) {
  if (codepoint < 0x80) {
    out += char(codepoint);
  } else if (codepoint < 0x800) {
    out += char(0xC0 | (codepoint >> 6));
    out += char(0x80 | (codepoint & 0x3F));
  } else if (codepoint < 0x10000) {
    out += char(0xE0 | (codepoint >> 12));
    out += char(0x80 | ((codepoint >> 6) & 0x3F));
    out += char(0x80 | (codepoint & 0x3F));
  } else {
    out += char(0xF0 | (codepoint >> 18));
    out += char(0x80 | ((codepoint >> 12) & 0x3F));
    out += char(0x80 | ((codepoint >> 6) & 0x3F));
    out += char(0x80 | (codepoint & 0x3F));
  }
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_character(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---- GPT-2 byte-level alphabet -----------------------------------------------------------------

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes are
// spelled U+0100 onwards in byte order. Indexed by code point (< 0x144), gives the byte or -1.
struct ByteLevelAlphabet {
  std::array<int16_t, 0x144> byte_of_codepoint;
  ByteLevelAlphabet() {
    byte_of_codepoint.fill(-1);
    int next_extra = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      byte_of_codepoint[size_t(printable ? byte : 256 + next_extra++)] = int16_t(byte);
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet instance;
  return instance;
}

}  // namespace

std::optional<std::string> byte_level_to_bytes(std::string_view spelled, bool lenient) {
  const auto& table = alphabet().byte_of_codepoint;
  std::string bytes;
  bytes.reserve(spelled.size());
  size_t pos = 0;
  while (pos < spelled.size()) {
    const size_t start = pos;
    const Utf8Step step = utf8_step(spelled, pos);
    if (!step.valid) return std::nullopt;
    const char32_t codepoint = next_codepoint(spelled, pos);
    if (codepoint < table.size() && table[codepoint] >= 0) {
      bytes += char(table[codepoint]);
    } else if (lenient) {
      bytes.append(spelled.substr(start, pos - start));
    } else {
      return std::nullopt;
    }
  }
  return bytes;
}

// ---- Normalizer --------------------------------------------------------------------------------

Normalizer Normalizer::from_json(const nlohmann::json& spec, const JsonWhere& where) {
  Normalizer normalizer;
  if (spec.is_null()) return normalizer;
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    where.fail("expected an object with a \"type\"");
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    const JsonWhere list_where = where.at("normalizers");
    if (!spec.contains("normalizers") || !spec["normalizers"].is_array())
      list_where.fail("expected an array");
    const auto& list = spec["normalizers"];
    for (size_t i = 0; i < list.size(); ++i) {
      const Normalizer inner = from_json(list[i], list_where.at(i));
      normalizer.forms_.insert(normalizer.forms_.end(), inner.forms_.begin(), inner.forms_.end());
    }
    return normalizer;
  }
  int options = UTF8PROC_STABLE;
  if (type == "NFC") {
    options |= UTF8PROC_COMPOSE;
  } else if (type == "NFD") {
    options |= UTF8PROC_DECOMPOSE;
  } else if (type == "NFKC") {
    options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  } else if (type == "NFKD") {
    options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  } else {
    where.at("type").fail(
        fmt::format("unsupported normalizer '{}' (supported: NFC, NFD, NFKC, NFKD, Sequence)", type));
  }
  normalizer.forms_.push_back(options);
  return normalizer;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string result(text);
  for (const int options : forms_) {
    // Every normalization form leaves ASCII as it is, and most prompts are mostly ASCII.
    bool ascii = true;
    for (const char c : result) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) break;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(result.data()),
                     utf8proc_ssize_t(result.size()), &mapped, utf8proc_option_t(options));
    if (length < 0) anvil::fail("text normalization failed: {}", utf8proc_errmsg(length));
    result.assign(reinterpret_cast<const char*>(mapped), size_t(length));
    std::free(mapped);
  }
  return result;
}

}  // namespace tokenizer_detail

// ---- Streaming decode --------------------------------------------------------------------------

bool is_valid_utf8(std::string_view bytes) {
  return tokenizer_detail::first_invalid_utf8(bytes) == std::string_view::npos;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string& bytes = tokenizer_.token_bytes(id);
  // A skipped token leaves pending bytes waiting: decode(skip_special) joins its neighbours too.
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += bytes;
  std::string out;
  const size_t consumed = tokenizer_detail::append_utf8_lossy(pending_, out, /*final=*/false);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  tokenizer_detail::append_utf8_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace anvil
