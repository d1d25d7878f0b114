#include "formats/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "formats/tokenizer_internal.h"
#include "support/test_support.h"

namespace anvil {
namespace {

using Ids = std::vector<int32_t>;

// Loaded once: the file is 27 MB and every harmony test reads the same one.
const Tokenizer& harmony() {
  static const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_file(test::harmony_tokenizer_json());
  return *tokenizer;
}

// The id whose token is exactly these bytes (the vocabulary has one per single byte).
int32_t id_of_bytes(const Tokenizer& tokenizer, const std::string& bytes) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.token_bytes(id) == bytes) return id;
  }
  ADD_FAILURE() << "no token for these bytes";
  return -1;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no anvil::Error thrown)";
}

// ---- o200k_harmony against tiktoken's ids ------------------------------------------------------

TEST(TokenizerHarmony, EncodesEveryFixtureCaseLikeTiktoken) {
  const auto cases =
      nlohmann::json::parse(test::read_file(test::fixtures_dir() / "o200k_harmony" / "encode_cases.json"));
  const auto& list = cases.at("cases");
  ASSERT_FALSE(list.empty());
  size_t encoded = 0, round_tripped = 0;
  std::string failures;
  for (const auto& item : list) {
    const std::string text = item.at("text").get<std::string>();
    const Ids expected = item.at("ids").get<Ids>();
    // The fixture's ids come from tiktoken with every special token allowed.
    const Ids ids = harmony().encode(text, /*allow_special=*/true);
    if (ids == expected) {
      ++encoded;
    } else if (failures.size() < 2000) {
      failures += "\n  encode mismatch: " + nlohmann::json(text).dump();
    }
    if (harmony().decode(ids) == text) {
      ++round_tripped;
    } else if (failures.size() < 2000) {
      failures += "\n  round-trip mismatch: " + nlohmann::json(text).dump();
    }
  }
  EXPECT_EQ(encoded, list.size()) << encoded << " of " << list.size() << " cases encode to tiktoken's ids"
                                  << failures;
  EXPECT_EQ(round_tripped, list.size()) << round_tripped << " of " << list.size() << " cases round-trip";
}

TEST(TokenizerHarmony, VocabularyAndSpecialTokens) {
  EXPECT_EQ(harmony().vocab_size(), 201088);
  EXPECT_EQ(harmony().token_id("<|start|>"), 200006);
  EXPECT_EQ(harmony().token_id("<|endoftext|>"), 199999);
  EXPECT_TRUE(harmony().is_special(200006));
  EXPECT_FALSE(harmony().is_special(13225));
  // Vocabulary tokens are named by their byte-level spelling, as in tokenizer.json.
  const auto hello = harmony().encode("Hello", false);
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(harmony().token_id("Hello"), hello[0]);
  const auto the = harmony().encode(" the", false);
  ASSERT_EQ(the.size(), 1u);
  EXPECT_EQ(harmony().token_id("\xC4\xA0the"), the[0]);  // "Ġthe"
  EXPECT_EQ(harmony().token_bytes(the[0]), " the");
  EXPECT_FALSE(harmony().token_id("no such token at all").has_value());
}

TEST(TokenizerHarmony, SpecialTokensOnlyWhenAllowed) {
  const Ids plain = harmony().encode("<|start|>user", /*allow_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 200006), 0);
  EXPECT_EQ(harmony().decode(plain), "<|start|>user");
  const Ids special = harmony().encode("<|start|>user", /*allow_special=*/true);
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(special.front(), 200006);
  EXPECT_EQ(harmony().decode(special), "<|start|>user");
  EXPECT_EQ(harmony().decode(special, /*skip_special=*/true), "user");
}

TEST(TokenizerHarmony, RejectsInvalidUtf8Prompt) {
  const std::string message = error_of([] { harmony().encode(std::string("ok \xC3\x28 no"), false); });
  EXPECT_NE(message.find("not valid UTF-8"), std::string::npos) << message;
  EXPECT_NE(message.find("byte offset 3"), std::string::npos) << message;
  EXPECT_THROW(harmony().encode(std::string("\xED\xA0\x80"), false), Error);  // a surrogate
  EXPECT_THROW(harmony().encode(std::string("\xC0\xAF"), false), Error);      // overlong
  EXPECT_THROW(harmony().encode(std::string("abc\xF0\x9F"), false), Error);   // truncated
}

TEST(TokenizerHarmony, OutOfRangeIdsNameTheIdAndVocabSize) {
  const Ids ids{13225, 250000};
  const std::string message = error_of([&] { harmony().decode(ids); });
  EXPECT_NE(message.find("250000"), std::string::npos) << message;
  EXPECT_NE(message.find("201088"), std::string::npos) << message;
  EXPECT_THROW(harmony().token_bytes(-1), Error);
}

TEST(TokenizerHarmony, DecodeReplacesInvalidUtf8PerMaximalSubsequence) {
  const Tokenizer& t = harmony();
  const int32_t f0 = id_of_bytes(t, "\xF0"), x9f = id_of_bytes(t, "\x9F"), e0 = id_of_bytes(t, "\xE0");
  const int32_t x80 = id_of_bytes(t, "\x80"), a = id_of_bytes(t, "A");
  EXPECT_EQ(t.decode(Ids{f0, x9f, a}),
            "\xEF\xBF\xBD"
            "A");                                                 // one truncated sequence: one U+FFFD
  EXPECT_EQ(t.decode(Ids{e0, x80}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // E0 80 can never start a character
  EXPECT_EQ(t.decode(Ids{a, f0}), "A\xEF\xBF\xBD");
}

TEST(TokenizerHarmony, NextLineIsWhitespaceAsInTiktoken) {
  // tiktoken's \s is Unicode White_Space, which has U+0085 (NEXT LINE): in " \u0085abc" the space
  // stands alone (\s+(?!\S)) and U+0085 leads the word, rather than " \u0085" being punctuation.
  const std::string nel = "\xC2\x85";
  Ids expected = harmony().encode(" ", false);
  const Ids word = harmony().encode(nel + "abc", false);
  expected.insert(expected.end(), word.begin(), word.end());
  EXPECT_EQ(harmony().encode(" " + nel + "abc", false), expected);
  Ids as_punctuation = harmony().encode(" " + nel, false);
  const Ids abc = harmony().encode("abc", false);
  as_punctuation.insert(as_punctuation.end(), abc.begin(), abc.end());
  EXPECT_NE(as_punctuation, expected) << "the case no longer tells the two readings apart";
}

TEST(TokenizerHarmony, EncodeIsThreadSafe) {
  const std::string text =
      "Concurrent encoders share one cache: naïve façade, 12345, 日本語, 🤖 and more text.";
  const Ids expected = harmony().encode(text, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        const std::string varied = text + std::to_string(round * 7 + int(t));
        const Ids ids = harmony().encode(varied, true);
        if (harmony().decode(ids) != varied) return;
        if (harmony().encode(text, true) != expected) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(std::count(ok.begin(), ok.end(), 1), 4);
}

TEST(TokenizerHarmony, LongRunsEncodeAndRoundTrip) {
  for (const std::string unit : {"a", " ", "\n", "日", "1", "!", "🤖"}) {
    std::string text;
    for (int i = 0; i < 20000; ++i) text += unit;
    const Ids ids = harmony().encode(text, false);
    EXPECT_EQ(harmony().decode(ids), text) << "run of " << unit;
  }
}

// ---- Streaming decode --------------------------------------------------------------------------

TEST(StreamDecoder, SplitEmojiNeverYieldsInvalidUtf8) {
  const std::string text = "emoji 🤖🚀👍🏽 and ZWJ 👨‍👩‍👧 done";
  const Ids ids = harmony().encode(text, false);
  bool some_token_is_partial = false;
  for (const int32_t id : ids) some_token_is_partial |= !is_valid_utf8(harmony().token_bytes(id));
  ASSERT_TRUE(some_token_is_partial) << "the test needs a character split across tokens";

  StreamDecoder stream(harmony());
  std::string joined;
  for (const int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece));
    joined += piece;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, harmony().decode(ids));
  EXPECT_EQ(joined, text);
}

TEST(StreamDecoder, InvalidAndUnfinishedSequencesBecomeReplacementCharacters) {
  const Tokenizer& t = harmony();
  const int32_t f0 = id_of_bytes(t, "\xF0"), x9f = id_of_bytes(t, "\x9F"), c3 = id_of_bytes(t, "\xC3");
  const int32_t paren = id_of_bytes(t, "("), a = id_of_bytes(t, "A");
  {
    StreamDecoder stream(t);
    EXPECT_EQ(stream.push(f0), "");
    EXPECT_EQ(stream.push(x9f), "");
    EXPECT_EQ(stream.push(a),
              "\xEF\xBF\xBD"
              "A");
    EXPECT_EQ(stream.finish(), "");
  }
  {
    StreamDecoder stream(t);
    EXPECT_EQ(stream.push(c3), "");
    EXPECT_EQ(stream.push(paren), "\xEF\xBF\xBD(");
  }
  {
    StreamDecoder stream(t);
    EXPECT_EQ(stream.push(a), "A");
    EXPECT_EQ(stream.push(f0), "");
    EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
    EXPECT_EQ(stream.finish(), "");
  }
}

TEST(StreamDecoder, SkipsSpecialTokensWhenAsked) {
  const Ids ids = harmony().encode("<|start|>user<|message|>hi<|end|>", true);
  StreamDecoder keep(harmony()), skip(harmony(), /*skip_special=*/true);
  std::string kept, skipped;
  for (const int32_t id : ids) {
    kept += keep.push(id);
    skipped += skip.push(id);
  }
  kept += keep.finish();
  skipped += skip.finish();
  EXPECT_EQ(kept, "<|start|>user<|message|>hi<|end|>");
  EXPECT_EQ(skipped, "userhi");
  EXPECT_EQ(skipped, harmony().decode(ids, true));
}

TEST(StreamDecoder, IsValidUtf8) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("é日🤖\xF4\x8F\xBF\xBF"));  // U+10FFFF is the last code point
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));          // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));              // surrogate
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));              // overlong
  EXPECT_FALSE(is_valid_utf8("\xC3"));                      // truncated
  EXPECT_FALSE(is_valid_utf8("\x80"));                      // stray continuation
  EXPECT_FALSE(is_valid_utf8("\xFF"));
}

// ---- A small hand-written tokenizer.json -------------------------------------------------------

// Byte-level spellings: "Ġ" is a space, "Ã©" the two bytes of "é". The split regex is Qwen2's,
// which isolates single digits.
const char* const kSmallTokenizer = R"json({
  "version": "1.0",
  "added_tokens": [
    {"id": 18, "content": "<think>", "special": false, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 19, "content": "<|endoftext|>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 20, "content": "<mask>", "special": true, "normalized": false, "lstrip": true, "rstrip": false, "single_word": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
  ]},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
    "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "Ġ": 5, "1": 6, "2": 7, "3": 8, "4": 9, "Ã": 10, "©": 11,
              "bc": 12, "ab": 13, "Ã©": 14, "12": 15, "aa": 16, "abc": 17},
    "merges": ["b c", "a b", "Ã ©", "1 2", "a a"]
  }
})json";

std::unique_ptr<Tokenizer> small_tokenizer(const std::string& edit_from = "",
                                           const std::string& edit_to = "") {
  std::string json = kSmallTokenizer;
  if (!edit_from.empty()) {
    const size_t at = json.find(edit_from);
    EXPECT_NE(at, std::string::npos) << edit_from;
    json.replace(at, edit_from.size(), edit_to);
  }
  return Tokenizer::from_json_text(json, "small/tokenizer.json");
}

TEST(TokenizerSmall, LowestRankMergeWins) {
  const auto t = small_tokenizer();
  EXPECT_EQ(t->encode("abc", false), (Ids{0, 12}));  // "b c" (rank 0) before "a b" (rank 1)
  EXPECT_EQ(t->encode("ab", false), (Ids{13}));
  EXPECT_EQ(t->encode("aaa", false), (Ids{16, 0}));  // equal ranks: leftmost first
  EXPECT_EQ(t->encode("abcd", false), (Ids{0, 12, 3}));
  EXPECT_EQ(t->decode(Ids{0, 12, 3}), "abcd");
}

TEST(TokenizerSmall, IgnoreMergesTakesWholeVocabularyTokens) {
  const auto t = small_tokenizer("\"ignore_merges\": false", "\"ignore_merges\": true");
  EXPECT_EQ(t->encode("abc", false), (Ids{17}));
  EXPECT_EQ(t->encode("aaa", false), (Ids{16, 0}));
}

TEST(TokenizerSmall, DigitsAreSplitOneByOne) {
  const auto t = small_tokenizer();
  EXPECT_EQ(t->encode("1234", false), (Ids{6, 7, 8, 9}));  // the "1 2" merge never sees "12"
  EXPECT_EQ(t->encode("a 12", false), (Ids{0, 5, 6, 7}));
}

TEST(TokenizerSmall, NfcNormalizesBeforeMerging) {
  const auto t = small_tokenizer();
  EXPECT_EQ(t->encode("\xC3\xA9", false), (Ids{14}));   // "é" precomposed
  EXPECT_EQ(t->encode("e\xCC\x81", false), (Ids{14}));  // "e" + U+0301 COMBINING ACUTE ACCENT
  EXPECT_EQ(t->decode(Ids{14}), "\xC3\xA9");
}

TEST(TokenizerSmall, AddedTokens) {
  const auto t = small_tokenizer();
  EXPECT_EQ(t->vocab_size(), 21);
  EXPECT_EQ(t->token_id("<think>"), 18);
  EXPECT_EQ(t->token_id("\xC3\x83\xC2\xA9"), 14);  // "Ã©"
  // Non-special added tokens match whether or not special tokens are allowed.
  EXPECT_EQ(t->encode("a<think>b", false), (Ids{0, 18, 1}));
  EXPECT_EQ(t->encode("a<|endoftext|>", true), (Ids{0, 19}));
  EXPECT_FALSE(t->is_special(18));
  EXPECT_TRUE(t->is_special(19));
  // <mask> strips the whitespace on its left.
  EXPECT_EQ(t->encode("a  <mask>", true), (Ids{0, 20}));
  EXPECT_EQ(t->decode(Ids{0, 18, 1, 19}), "a<think>b<|endoftext|>");
  EXPECT_EQ(t->decode(Ids{0, 18, 1, 19}, /*skip_special=*/true), "a<think>b");
}

TEST(TokenizerSmall, DisallowedSpecialTokenIsPlainText) {
  // Without special tokens allowed, "<|endoftext|>" is ordinary text, and this vocabulary has no
  // bytes for "<" or "|": the error says so rather than inventing ids.
  const auto t = small_tokenizer();
  EXPECT_THROW(t->encode("a<|endoftext|>", false), Error);
}

TEST(TokenizerSmall, MalformedFilesNameFileAndField) {
  auto message = error_of([] { Tokenizer::from_json_text(R"({"added_tokens": []})", "x/tokenizer.json"); });
  EXPECT_NE(message.find("x/tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("model"), std::string::npos) << message;

  message = error_of([] { small_tokenizer("\"type\": \"BPE\"", "\"type\": \"Unigram\""); });
  EXPECT_NE(message.find("small/tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("model.type"), std::string::npos) << message;
  EXPECT_NE(message.find("Unigram"), std::string::npos) << message;

  message = error_of([] { small_tokenizer("(?i:'s", "(?i:'s("); });
  EXPECT_NE(message.find("pre_tokenizer.pretokenizers[0].pattern.Regex"), std::string::npos) << message;
  EXPECT_NE(message.find("regex"), std::string::npos) << message;

  message = error_of([] { small_tokenizer("\"1 2\"", "\"1 x\""); });
  EXPECT_NE(message.find("model.merges[3]"), std::string::npos) << message;

  message = error_of([] { small_tokenizer("{\"type\": \"NFC\"}", "{\"type\": \"Lowercase\"}"); });
  EXPECT_NE(message.find("normalizer.type"), std::string::npos) << message;

  message = error_of([] { Tokenizer::from_json_text("{not json", "bad.json"); });
  EXPECT_NE(message.find("bad.json"), std::string::npos) << message;

  message = error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); });
  EXPECT_NE(message.find("/nonexistent/tokenizer.json"), std::string::npos) << message;
}

TEST(TokenizerSmall, PairMergesAndPlainByteLevelPreTokenizer) {
  // The newer [left, right] merge form and GPT-2's own regex through a lone ByteLevel pre-tokenizer.
  auto t = small_tokenizer(
      "\"merges\": [\"b c\", \"a b\", \"Ã ©\", \"1 2\", \"a a\"]",
      "\"merges\": [[\"b\", \"c\"], [\"a\", \"b\"], [\"Ã\", \"©\"], [\"1\", \"2\"], [\"a\", \"a\"]]");
  EXPECT_EQ(t->encode("abc", false), (Ids{0, 12}));
  const std::string gpt2 =
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},)";
  std::string json = kSmallTokenizer;
  const size_t begin = json.find("\"pre_tokenizer\"");
  const size_t end = json.find("\"post_processor\"");
  json.replace(begin, end - begin, gpt2);
  t = Tokenizer::from_json_text(json, "gpt2-like");
  EXPECT_EQ(t->encode("12 ab", false), (Ids{5, 15, 5, 13}));  // prefix space; digits stay together
}

TEST(TokenizerPreTokenizer, SplitBehaviorsMatchTokenizers) {
  // tokenizers' own example: `\w+|[^\w\s]+` inverted, so the spaces are the "matches".
  const std::string source = "test";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Removed", {"How", "are", "you", "doing", "?"}},
      {"Isolated", {"How", " ", "are", " ", "you", " ", "doing", "?"}},
      {"MergedWithPrevious", {"How ", "are ", "you ", "doing", "?"}},
      {"MergedWithNext", {"How", " are", " you", " doing", "?"}},
      {"Contiguous", {"How", " ", "are", " ", "you", " ", "doing?"}},
  };
  for (const auto& [behavior, expected] : cases) {
    const auto spec = nlohmann::json{{"type", "Split"},
                                     {"pattern", {{"Regex", "\\w+|[^\\w\\s]+"}}},
                                     {"behavior", behavior},
                                     {"invert", true}};
    const auto pre_tokenizer = tokenizer_detail::PreTokenizer::from_json(spec, {source, "pre_tokenizer"});
    tokenizer_detail::PreTokenizeScratch scratch;
    pre_tokenizer.split("How are you doing?", scratch);
    const std::vector<std::string> pieces(scratch.pieces.begin(), scratch.pieces.end());
    EXPECT_EQ(pieces, expected) << behavior;
  }
}

}  // namespace
}  // namespace anvil
