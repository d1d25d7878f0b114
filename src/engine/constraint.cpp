#include "engine/constraint.h"

#include <mutex>

#include "core/error.h"
#include "engine/constraint_grammar.h"
#include "engine/constraint_schema.h"
#include "engine/constraint_vocab.h"

namespace anvil {

namespace {

using constraint::GrammarMatcher;

// Past this many cached matcher states (a 1 KiB transition row each) the cache starts over from
// the current state; normal outputs stay far below it.
constexpr size_t kMaxCachedStates = 16384;

class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const constraint::Grammar> grammar, const Tokenizer& tokenizer)
      : trie_(constraint::VocabTrie::of(tokenizer)), matcher_(std::move(grammar)), state_(matcher_.initial()) {}

  void allowed_tokens(std::vector<uint8_t>& allowed) override { trie_->collect(matcher_, state_, allowed); }

  void accept(int32_t token) override {
    if (!trie_->usable(token)) fail("constrained output: token {} is special or empty and cannot appear", token);
    const int32_t next = matcher_.next(state_, trie_->bytes(token));
    if (next == GrammarMatcher::kDead) fail("constrained output: token {} does not fit here", token);
    state_ = next;
    if (matcher_.num_states() > kMaxCachedStates) state_ = matcher_.compact(state_);
  }

  bool is_complete() const override { return matcher_.complete(state_); }

 private:
  std::shared_ptr<const constraint::VocabTrie> trie_;
  GrammarMatcher matcher_;
  int32_t state_;
};

}  // namespace

std::unique_ptr<TokenConstraint> make_json_object_constraint(const Tokenizer& tokenizer) {
  // The grammar is the same for every request; only the matcher state is per request.
  static std::once_flag once;
  static std::shared_ptr<const constraint::Grammar> grammar;
  std::call_once(once, [] { grammar = std::make_shared<const constraint::Grammar>(constraint::json_object_grammar()); });
  return std::make_unique<GrammarConstraint>(grammar, tokenizer);
}

std::unique_ptr<TokenConstraint> make_json_schema_constraint(const std::string& schema_json, const Tokenizer& tokenizer) {
  auto grammar = std::make_shared<const constraint::Grammar>(constraint::json_schema_grammar(schema_json));
  return std::make_unique<GrammarConstraint>(std::move(grammar), tokenizer);
}

}  // namespace anvil
