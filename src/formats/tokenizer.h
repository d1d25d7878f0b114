#pragma once
// Hugging Face tokenizer.json: byte-level BPE with a split regex (PCRE2, Unicode properties),
// optional NFC normalization, added/special tokens, and byte-level decoding.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

class Tokenizer {
 public:
  static std::unique_ptr<Tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  static std::unique_ptr<Tokenizer> from_json_text(const std::string& json_text, const std::string& source_name);
  ~Tokenizer();

  // With allow_special, added tokens marked special in the text become their ids; without it
  // they are encoded as the plain text they are. Non-special added tokens (e.g. Qwen's <think>)
  // always match. Throws anvil::Error on invalid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;
  // Concatenated token bytes; invalid UTF-8 in the result is replaced by U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes a token stands for (may be a partial UTF-8 sequence).
  const std::string& token_bytes(int32_t id) const;
  // One past the largest id known (vocabulary plus added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> token_id(std::string_view token_text) const;
  bool is_special(int32_t id) const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streaming decode: returns only complete UTF-8 characters; a partial sequence is held back
// until the next token completes it (or finish() flushes it as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

// True when bytes are well-formed UTF-8.
bool is_valid_utf8(std::string_view bytes);

}  // namespace anvil
