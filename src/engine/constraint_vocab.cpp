#include "engine/constraint_vocab.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "formats/tokenizer.h"

namespace anvil::constraint {

namespace {
bool usable_token(const Tokenizer& tokenizer, int32_t id, const std::string& bytes) {
  // Depth is 16-bit; no real token comes near that length.
  return !tokenizer.is_special(id) && !bytes.empty() && bytes.size() < 65535;
}
}  // namespace

VocabTrie::VocabTrie(const Tokenizer& tokenizer) {
  const int32_t vocab = tokenizer.vocab_size();
  bytes_.resize(size_t(vocab));
  usable_.resize(size_t(vocab));
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab; ++id) {
    bytes_[size_t(id)] = tokenizer.token_bytes(id);
    const bool usable = usable_token(tokenizer, id, bytes_[size_t(id)]);
    usable_[size_t(id)] = usable;
    if (usable) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });

  // In sorted order each token shares its longest common prefix with the previous one, so
  // appending the nodes past that prefix yields the trie in preorder.
  nodes_.push_back({0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // node at each depth along the previous token
  const std::string* previous = nullptr;
  for (const int32_t id : order) {
    const std::string& text = bytes_[size_t(id)];
    size_t common = 0;
    if (previous) {
      const size_t limit = std::min(previous->size(), text.size());
      while (common < limit && (*previous)[common] == text[common]) ++common;
    }
    while (path.size() - 1 > common) {
      nodes_[path.back()].skip = uint32_t(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < text.size(); ++d) {
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back({0, uint32_t(ids_.size()), uint16_t(d + 1), uint8_t(text[d])});
    }
    ids_.push_back(id);
    max_depth_ = std::max(max_depth_, text.size());
    previous = &text;
  }
  for (const uint32_t n : path) nodes_[n].skip = uint32_t(nodes_.size());
  nodes_.push_back({uint32_t(nodes_.size() + 1), uint32_t(ids_.size()), 0, 0});
}

bool VocabTrie::same_vocabulary(const Tokenizer& tokenizer) const {
  if (size_t(tokenizer.vocab_size()) != bytes_.size()) return false;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& bytes = tokenizer.token_bytes(int32_t(id));
    if (bytes != bytes_[id] || usable_token(tokenizer, int32_t(id), bytes) != bool(usable_[id])) return false;
  }
  return true;
}

std::shared_ptr<const VocabTrie> VocabTrie::of(const Tokenizer& tokenizer) {
  // Keyed by address, and checked against the vocabulary itself: a tokenizer freed and another
  // allocated at the same address must not inherit a stale trie.
  static std::mutex mutex;
  static std::vector<std::pair<const Tokenizer*, std::shared_ptr<const VocabTrie>>> cache;
  const std::lock_guard lock(mutex);
  for (const auto& [owner, trie] : cache) {
    if (owner == &tokenizer && trie->same_vocabulary(tokenizer)) return trie;
  }
  auto trie = std::make_shared<const VocabTrie>(tokenizer);
  std::erase_if(cache, [&](const auto& entry) { return entry.first == &tokenizer; });
  cache.emplace_back(&tokenizer, trie);
  if (cache.size() > 4) cache.erase(cache.begin());
  return trie;
}

void VocabTrie::collect(GrammarMatcher& matcher, int32_t state, std::vector<uint8_t>& allowed) const {
  std::vector<int32_t> states(max_depth_ + 1);  // matcher state after each byte of the current path
  states[0] = state;
  const Node* nodes = nodes_.data();
  const size_t end = nodes_.size() - 1;
  const size_t limit = allowed.size();
  for (size_t i = 1; i < end;) {
    const Node& node = nodes[i];
    const int32_t to = matcher.next(states[node.depth - 1], node.byte);
    if (to == GrammarMatcher::kDead) {
      i = node.skip;
      continue;
    }
    states[node.depth] = to;
    for (uint32_t t = node.tok_begin, stop = nodes[i + 1].tok_begin; t < stop; ++t) {
      if (size_t(ids_[t]) < limit) allowed[size_t(ids_[t])] = 1;
    }
    ++i;
  }
}

}  // namespace anvil::constraint
