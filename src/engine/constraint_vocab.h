#pragma once
// The vocabulary as a byte trie, laid out in preorder so a whole-vocabulary walk is one forward
// loop that skips a rejected prefix's subtree in one jump. Tokens sharing a prefix share its
// matcher steps, and a state's transitions are cached, so most edges cost one table load.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint_grammar.h"

namespace anvil {
class Tokenizer;
}

namespace anvil::constraint {

class VocabTrie {
 public:
  // Built once per tokenizer and shared: building sorts the whole vocabulary.
  static std::shared_ptr<const VocabTrie> of(const Tokenizer& tokenizer);
  explicit VocabTrie(const Tokenizer& tokenizer);

  // allowed[id] = 1 for every usable token whose bytes the matcher can read from state.
  void collect(GrammarMatcher& matcher, int32_t state, std::vector<uint8_t>& allowed) const;
  // Special tokens and empty ones never appear in constrained text.
  bool usable(int32_t id) const { return id >= 0 && size_t(id) < usable_.size() && usable_[size_t(id)]; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t num_nodes() const { return nodes_.size(); }

 private:
  struct Node {
    uint32_t skip;       // index just past this node's subtree
    uint32_t tok_begin;  // tokens ending here: ids_[tok_begin .. next node's tok_begin)
    uint16_t depth;
    uint8_t byte;
  };
  bool same_vocabulary(const Tokenizer& tokenizer) const;

  std::vector<Node> nodes_;  // [0] is the root; the last is a sentinel closing the token ranges
  std::vector<int32_t> ids_;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> usable_;
  size_t max_depth_ = 0;
};

}  // namespace anvil::constraint
