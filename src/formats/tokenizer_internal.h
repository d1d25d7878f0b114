#pragma once
// Pieces of the tokenizer.json implementation shared by its source files (tokenizer*.cpp).
// Private to src/formats: nothing outside the tokenizer (and its unit test) includes this.
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

namespace anvil::tokenizer_detail {

// Where in tokenizer.json a value came from, so errors name the file and the field.
struct JsonWhere {
  const std::string& source;
  std::string field;
  JsonWhere at(std::string_view key) const {
    return {source, field.empty() ? std::string(key) : field + "." + std::string(key)};
  }
  JsonWhere at(size_t index) const { return {source, field + "[" + std::to_string(index) + "]"}; }
  [[noreturn]] void fail(std::string_view problem) const;
};

// ---- tokenizer.json parsing -------------------------------------------------------------------

// tokenizer.json as parsed: a DOM of everything but the BPE model's vocab and merges, which are
// streamed into flat arrays instead (a DOM of their ~650k small strings takes over a second to build
// and free, several times the parse itself).
struct TokenizerJson {
  struct Slice {
    uint32_t begin = 0;
    uint32_t length = 0;
  };
  struct VocabEntry {
    Slice token;  // byte-level spelling
    int64_t id;
    bool id_is_integer;
  };
  struct Merge {
    Slice left;
    Slice right;
  };
  nlohmann::json root;  // model.vocab / model.merges are left out when they were streamed
  bool vocab_streamed = false;
  bool merges_streamed = false;
  std::string arena;  // the text of all slices
  std::vector<VocabEntry> vocab;
  std::vector<Merge> merges;
  std::optional<size_t> bad_merge;  // index of the first merge entry of the wrong shape
  std::string bad_merge_text;

  std::string_view text(Slice slice) const {
    return std::string_view(arena).substr(slice.begin, slice.length);
  }
};
// Throws anvil::Error naming `where.source` when the text is not valid JSON.
TokenizerJson parse_tokenizer_json(const std::string& json_text, const JsonWhere& where);

// ---- UTF-8 -------------------------------------------------------------------------------------

// One step of UTF-8 decoding. An invalid step covers one maximal invalid subsequence (the unit that
// Python's errors="replace" turns into one U+FFFD); `truncated` says the input ended inside it, so
// more bytes could still make it valid.
struct Utf8Step {
  size_t length;
  bool valid;
  bool truncated;
};
Utf8Step utf8_step(std::string_view bytes, size_t pos);
// Byte offset of the first ill-formed byte, or npos.
size_t first_invalid_utf8(std::string_view bytes);
// Appends bytes to out with each maximal invalid subsequence replaced by U+FFFD and returns how many
// bytes were consumed. Unless final, an incomplete sequence at the end is left unconsumed.
size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool final);
// Decodes the character at pos of well-formed text and advances pos past it.
char32_t next_codepoint(std::string_view text, size_t& pos);
// Decodes the character that ends at pos of well-formed text and moves pos to its start.
char32_t previous_codepoint(std::string_view text, size_t& pos);
void append_utf8(std::string& out, char32_t codepoint);
// Unicode White_Space, which is what \s means in the regex engines tokenizers and tiktoken use.
bool is_unicode_whitespace(char32_t codepoint);
// \w in those engines: letters, marks, decimal digits, connector punctuation.
bool is_word_character(char32_t codepoint);

// ---- GPT-2 byte-level alphabet -----------------------------------------------------------------

// The byte-level vocabulary spells each byte as a printable character (space is "Ġ"). Decodes such
// a spelling to raw bytes; characters outside the alphabet stand for their own UTF-8 bytes when
// lenient, and make the result nullopt otherwise.
std::optional<std::string> byte_level_to_bytes(std::string_view spelled, bool lenient);

// ---- Normalizer --------------------------------------------------------------------------------

class Normalizer {
 public:
  // null, NFC, NFD, NFKC, NFKD, or a Sequence of them.
  static Normalizer from_json(const nlohmann::json& spec, const JsonWhere& where);
  bool is_identity() const { return forms_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  std::vector<int> forms_;  // utf8proc option sets, applied in order
};

// ---- Regex (PCRE2) -----------------------------------------------------------------------------

// Per-call match state: encode() is const and may run on several threads at once, so nothing that
// a match writes lives in the shared compiled pattern.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class Regex;
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

class Regex {
 public:
  // Throws anvil::Error through `where` when the pattern does not compile.
  Regex(std::string_view pattern, bool literal, const JsonWhere& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends [begin, end) of every non-empty match, left to right, without overlap.
  void find_all(std::string_view subject, RegexScratch& scratch,
                std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  pcre2_code* code_ = nullptr;
};

// ---- Pre-tokenizer -----------------------------------------------------------------------------

struct PreTokenizeScratch {
  struct Segment {
    size_t begin;
    size_t end;
    bool is_match;
  };
  RegexScratch regex;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> folded;
  std::vector<std::string_view> pieces;
  std::vector<std::string_view> next_pieces;
  std::deque<std::string> owned;  // pieces a step had to build (a prefix space); deque keeps them put
};

class PreTokenizer {
 public:
  // null, Split, ByteLevel, Digits, or a Sequence of them.
  static PreTokenizer from_json(const nlohmann::json& spec, const JsonWhere& where);
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  // Splits text into pre-tokens (views into text or scratch.owned), in scratch.pieces.
  void split(std::string_view text, PreTokenizeScratch& scratch) const;

 private:
  struct Step;
  std::vector<Step> steps_;
};

// ---- BPE model ---------------------------------------------------------------------------------

// Open-addressing map from byte strings to ids, with the keys in one arena. The vocabulary is probed
// for every pre-token (ignore_merges) and, while loading, three times for each merge: a node-based
// map's cache misses dominated both.
class StringIndex {
 public:
  void reserve(size_t count);
  // A later id for the same key replaces the earlier one.
  void insert(std::string_view key, int32_t id);
  // -1 when absent.
  int32_t find(std::string_view key) const;

 private:
  struct Slot {
    uint32_t begin = 0;
    uint32_t length = 0;
    uint32_t hash_high = 0;
    int32_t id = -1;
  };
  static uint64_t hash(std::string_view key);
  size_t probe(std::string_view key, uint64_t hash) const;
  std::string arena_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Open-addressing map from a pair of token ids to (merge rank, merged id): the merge table is
// probed for every adjacent pair of every pre-token, so it is kept flat.
class MergeTable {
 public:
  void reserve(size_t count);
  // A later entry for the same pair replaces the earlier one, as in tokenizers.
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // {rank, merged id}, or {-1, -1} when the pair does not merge.
  std::pair<int32_t, int32_t> find(int32_t left, int32_t right) const;

 private:
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t slot_of(uint64_t key) const;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;  // the top bits of the hash index the table
  size_t size_ = 0;
};

struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class BpeModel {
 public:
  // vocab maps raw bytes (not the byte-level spelling) to ids.
  BpeModel(std::string source, StringIndex vocab, MergeTable merges, bool ignore_merges,
           std::optional<int32_t> unk_id);
  // Appends the ids of one pre-token.
  void encode(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;
  const StringIndex& vocab() const { return vocab_; }

 private:
  void merge(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;

  std::string source_;  // the tokenizer file, for errors
  StringIndex vocab_;
  MergeTable merges_;
  bool ignore_merges_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_;

  // Merging is the slow path; common pre-tokens repeat, so their ids are remembered. Guarded because
  // encode() may run on several threads.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 64;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace anvil::tokenizer_detail
