// Hugging Face tokenizer.json: loading, added-token splitting, and the encode/decode pipeline.
// The pieces live in tokenizer_text.cpp (UTF-8, normalization, streaming), tokenizer_pretokenize.cpp
// (regex splits) and tokenizer_bpe.cpp (the merge loop).
#include "formats/tokenizer.h"

#include <algorithm>
#include <bitset>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "formats/tokenizer_internal.h"

namespace anvil {

using namespace tokenizer_detail;

namespace {

struct AddedToken {
  std::string content;  // for a normalized token, its normalized form: that is what it matches
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Byte trie over added-token contents, for leftmost-longest matching. A few thousand tokens at most,
// so children are short sorted lists.
class AddedTokenTrie {
 public:
  bool empty() const { return nodes_.size() <= 1; }

  void insert(std::string_view content, int32_t token) {
    if (content.empty()) return;
    first_bytes_.set(static_cast<unsigned char>(content[0]));
    int32_t node = 0;
    for (const char c : content) {
      auto& children = nodes_[size_t(node)].children;
      const auto byte = static_cast<unsigned char>(c);
      auto it =
          std::lower_bound(children.begin(), children.end(), std::pair<unsigned char, int32_t>{byte, -1});
      if (it == children.end() || it->first != byte) {
        const int32_t child = int32_t(nodes_.size());
        it = children.insert(it, {byte, child});
        nodes_.emplace_back();
      }
      node = it->second;
    }
    nodes_[size_t(node)].token = token;
  }

  // The longest token starting at pos that `accept` allows: {token, length}, or {-1, 0}.
  template <typename Accept>
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos, const Accept& accept) const {
    std::pair<int32_t, size_t> best{-1, 0};
    if (!first_bytes_.test(static_cast<unsigned char>(text[pos]))) return best;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& children = nodes_[size_t(node)].children;
      const auto byte = static_cast<unsigned char>(text[i]);
      const auto it =
          std::lower_bound(children.begin(), children.end(), std::pair<unsigned char, int32_t>{byte, -1});
      if (it == children.end() || it->first != byte) break;
      node = it->second;
      const int32_t token = nodes_[size_t(node)].token;
      if (token >= 0 && accept(token)) best = {token, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::bitset<256> first_bytes_;
};

// A stretch of text between added tokens, or an added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id;
};

const nlohmann::json& required(const nlohmann::json& object, const char* key, const JsonWhere& where) {
  if (!object.is_object() || !object.contains(key)) where.at(key).fail("missing");
  return object[key];
}

bool optional_bool(const nlohmann::json& object, const char* key, bool fallback, const JsonWhere& where) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) where.at(key).fail("expected true or false");
  return object[key].get<bool>();
}

// Ids index dense tables, so a stray huge id would be a huge allocation.
constexpr int64_t kMaxTokenId = int64_t{1} << 30;

int32_t token_id_value(const nlohmann::json& value, const JsonWhere& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kMaxTokenId) {
    where.fail(fmt::format("expected a token id (an integer from 0 to 2^30), got {}", value.dump()));
  }
  return int32_t(value.get<int64_t>());
}

// Decoding maps byte-level spellings back to bytes, which is all a ByteLevel decoder does; any other
// decoder (Metaspace, ByteFallback, ...) belongs to a vocabulary this tokenizer cannot read.
void check_decoder(const nlohmann::json& decoder, const JsonWhere& where) {
  if (decoder.is_null()) return;
  const std::string type = decoder.is_object() ? decoder.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return;
  if (type == "Sequence" && decoder.contains("decoders") && decoder["decoders"].is_array()) {
    for (const auto& inner : decoder["decoders"]) {
      if (inner.is_object() && inner.value("type", std::string()) == "ByteLevel") return;
    }
  }
  where.fail(
      fmt::format("unsupported decoder {} (only ByteLevel is supported)",
                  decoder.is_object() && decoder.contains("type") ? decoder["type"].dump() : decoder.dump()));
}

}  // namespace

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> bpe;
  std::vector<std::string> id_bytes;  // indexed by id; added tokens hold their content
  std::vector<bool> id_special;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_by_content;
  AddedTokenTrie raw_trie;         // added tokens matched before normalization
  AddedTokenTrie normalized_trie;  // added tokens matched in normalized text

  void load_model(const TokenizerJson& parsed, const JsonWhere& where);
  void load_added_tokens(const nlohmann::json& list, const JsonWhere& where);
  void split_on_added(std::string_view text, const AddedTokenTrie& trie, bool allow_special,
                      std::vector<Segment>& out) const;
};

void Tokenizer::Impl::load_model(const TokenizerJson& parsed, const JsonWhere& where) {
  const auto& model = required(parsed.root, "model", JsonWhere{where.source, ""});
  if (!model.is_object()) where.fail("expected an object");
  // Old files leave out the type of a BPE model; every other model names its type.
  if (model.contains("type")) {
    const auto& type = model["type"];
    if (!type.is_string() || type.get<std::string>() != "BPE") {
      where.at("type").fail(
          fmt::format("unsupported tokenizer model {} (only BPE is supported)", type.dump()));
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      where.at(key).fail("not supported (only byte-level BPE is)");
    }
  }
  if (optional_bool(model, "byte_fallback", false, where)) {
    where.at("byte_fallback").fail("not supported (only byte-level BPE is)");
  }

  // The vocabulary is spelled in the byte-level alphabet; the model works on raw bytes.
  const JsonWhere vocab_where = where.at("vocab");
  if (!parsed.vocab_streamed) {
    if (model.contains("vocab")) vocab_where.fail("expected an object of token -> id");
    vocab_where.fail("missing");
  }
  StringIndex spelled_ids;
  spelled_ids.reserve(parsed.vocab.size());
  StringIndex vocab;
  vocab.reserve(parsed.vocab.size());
  for (const auto& entry : parsed.vocab) {
    const std::string_view spelled = parsed.text(entry.token);
    if (!entry.id_is_integer || entry.id < 0 || entry.id >= kMaxTokenId) {
      vocab_where.at(spelled).fail("expected a token id (an integer from 0 to 2^30)");
    }
    const auto id = int32_t(entry.id);
    auto maybe_bytes = byte_level_to_bytes(spelled, /*lenient=*/true);
    if (!maybe_bytes) vocab_where.at(spelled).fail("not valid UTF-8");
    spelled_ids.insert(spelled, id);
    if (size_t(id) >= id_bytes.size()) id_bytes.resize(size_t(id) + 1);
    id_bytes[size_t(id)] = *maybe_bytes;
    vocab.insert(*maybe_bytes, id);
  }

  const JsonWhere merges_where = where.at("merges");
  if (!parsed.merges_streamed && model.contains("merges") && !model["merges"].is_null()) {
    merges_where.fail("expected an array");
  }
  if (parsed.bad_merge) {
    merges_where.at(*parsed.bad_merge)
        .fail(fmt::format("expected \"left right\" or [left, right], got {}", parsed.bad_merge_text));
  }
  MergeTable merges;
  merges.reserve(parsed.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < parsed.merges.size(); ++rank) {
    const std::string_view left = parsed.text(parsed.merges[rank].left);
    const std::string_view right = parsed.text(parsed.merges[rank].right);
    joined.assign(left).append(right);
    const int32_t left_id = spelled_ids.find(left);
    const int32_t right_id = spelled_ids.find(right);
    const int32_t merged_id = spelled_ids.find(joined);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      merges_where.at(rank).fail(
          fmt::format("merge \"{} {}\" uses a token that is not in the vocabulary", left, right));
    }
    merges.insert(left_id, right_id, int32_t(rank), merged_id);
  }

  std::optional<int32_t> unk_id;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const int32_t found = spelled_ids.find(model["unk_token"].get_ref<const std::string&>());
    if (found < 0) where.at("unk_token").fail("not in the vocabulary");
    unk_id = found;
  }
  const bool ignore_merges = optional_bool(model, "ignore_merges", false, where);
  bpe = std::make_unique<BpeModel>(where.source, std::move(vocab), std::move(merges), ignore_merges, unk_id);
}

void Tokenizer::Impl::load_added_tokens(const nlohmann::json& list, const JsonWhere& where) {
  if (list.is_null()) return;
  if (!list.is_array()) where.fail("expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonWhere entry_where = where.at(i);
    const auto& entry = list[i];
    const auto& content_json = required(entry, "content", entry_where);
    if (!content_json.is_string()) entry_where.at("content").fail("expected a string");
    AddedToken token;
    token.id = token_id_value(required(entry, "id", entry_where), entry_where.at("id"));
    token.content = content_json.get<std::string>();
    if (token.content.empty()) continue;  // tokenizers ignores these too
    if (!is_valid_utf8(token.content)) entry_where.at("content").fail("not valid UTF-8");
    token.special = optional_bool(entry, "special", false, entry_where);
    token.single_word = optional_bool(entry, "single_word", false, entry_where);
    token.lstrip = optional_bool(entry, "lstrip", false, entry_where);
    token.rstrip = optional_bool(entry, "rstrip", false, entry_where);
    token.normalized = optional_bool(entry, "normalized", !token.special, entry_where);
    if (size_t(token.id) >= id_bytes.size()) id_bytes.resize(size_t(token.id) + 1);
    if (size_t(token.id) >= id_special.size()) id_special.resize(size_t(token.id) + 1);
    id_bytes[size_t(token.id)] = token.content;
    id_special[size_t(token.id)] = token.special;
    added_by_content[token.content] = token.id;
    if (token.normalized) token.content = normalizer.apply(token.content);
    const int32_t index = int32_t(added.size());
    (token.normalized ? normalized_trie : raw_trie).insert(token.content, index);
    added.push_back(std::move(token));
  }
}

// tokenizers' AddedVocabulary::find_matches: leftmost-longest matches, single_word matches that
// touch a word dropped, lstrip/rstrip swallowing the whitespace beside a match.
void Tokenizer::Impl::split_on_added(std::string_view text, const AddedTokenTrie& trie, bool allow_special,
                                     std::vector<Segment>& out) const {
  if (trie.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  const auto accept = [&](int32_t token) { return allow_special || !added[size_t(token)].special; };
  size_t emitted = 0;  // end of what is already in out
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [token_index, length] = trie.longest_at(text, pos, accept);
    if (token_index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added[size_t(token_index)];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (token.single_word) {
      size_t before = start, after = stop;
      const bool word_before = start > 0 && is_word_character(previous_codepoint(text, before));
      const bool word_after = stop < text.size() && is_word_character(next_codepoint(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t cursor = start;
      while (cursor > emitted) {
        size_t previous = cursor;
        if (!is_unicode_whitespace(previous_codepoint(text, previous))) break;
        cursor = previous;
      }
      start = cursor;
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_unicode_whitespace(next_codepoint(text, next))) break;
        stop = next;
      }
      pos = stop;
    }
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) fail("{}: cannot open tokenizer file", tokenizer_json.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in) fail("{}: cannot read tokenizer file", tokenizer_json.string());
  return from_json_text(contents.str(), tokenizer_json.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(const std::string& json_text,
                                                     const std::string& source_name) {
  const JsonWhere root{source_name, ""};
  TokenizerJson parsed = parse_tokenizer_json(json_text, root);
  const nlohmann::json& json = parsed.root;
  if (!json.is_object()) root.fail("expected a JSON object at the top level");

  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  Impl& impl = *tokenizer->impl_;
  impl.normalizer = Normalizer::from_json(json.value("normalizer", nlohmann::json()), root.at("normalizer"));
  impl.pre_tokenizer =
      PreTokenizer::from_json(json.value("pre_tokenizer", nlohmann::json()), root.at("pre_tokenizer"));
  check_decoder(json.value("decoder", nlohmann::json()), root.at("decoder"));
  impl.load_model(parsed, root.at("model"));
  impl.load_added_tokens(json.value("added_tokens", nlohmann::json()), root.at("added_tokens"));
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) fail("prompt is not valid UTF-8 (byte offset {})", bad);
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<Segment> raw_segments, segments;
  PreTokenizeScratch pre_scratch;
  BpeScratch bpe_scratch;
  impl.split_on_added(text, impl.raw_trie, allow_special, raw_segments);
  for (const Segment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized =
        impl.normalizer.is_identity() ? std::string() : impl.normalizer.apply(raw.text);
    const std::string_view plain = impl.normalizer.is_identity() ? raw.text : std::string_view(normalized);
    segments.clear();
    impl.split_on_added(plain, impl.normalized_trie, allow_special, segments);
    for (const Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      impl.pre_tokenizer.split(segment.text, pre_scratch);
      for (const std::string_view piece : pre_scratch.pieces) impl.bpe->encode(piece, ids, bpe_scratch);
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    const std::string& token = token_bytes(id);
    if (skip_special && is_special(id)) continue;
    bytes += token;
  }
  std::string text;
  text.reserve(bytes.size());
  append_utf8_lossy(bytes, text, /*final=*/true);
  return text;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_bytes.size()) {
    fail("token id {} is out of range (vocabulary size {})", id, impl_->id_bytes.size());
  }
  return impl_->id_bytes[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  const auto added = impl_->added_by_content.find(token_text);
  if (added != impl_->added_by_content.end()) return added->second;
  // Vocabulary tokens are named by their byte-level spelling, as in tokenizer.json ("Ġthe").
  const auto bytes = byte_level_to_bytes(token_text, /*lenient=*/false);
  if (!bytes) return std::nullopt;
  const int32_t id = impl_->bpe->vocab().find(*bytes);
  if (id < 0) return std::nullopt;
  return id;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_special.size() && impl_->id_special[size_t(id)];
}

}  // namespace anvil
