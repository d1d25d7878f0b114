#pragma once
// A context-free grammar over bytes and a matcher that follows it byte by byte.
//
// The matcher is a pushdown automaton in the style of llama.cpp's grammar stacks: a parse
// position is a stack of grammar positions (the top one is a byte set still to match, the rest are
// where to return to). Stacks are interned as a tree of (position, parent) nodes, so a stack is one
// integer and a set of stacks can be interned too. Each distinct set of stacks becomes a state of
// a lazily built DFA with a dense 256-entry transition row, so walking the vocabulary trie costs
// one array load per trie edge once a state has been seen.
#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace anvil::constraint {

struct ByteSet {
  std::array<uint64_t, 4> words{};
  void add(uint8_t b) { words[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(uint8_t(b));
  }
  bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteSet&) const = default;
};

// One element of an alternative: a byte set or a reference to a rule.
struct Symbol {
  bool is_rule = false;
  uint32_t index = 0;
};
using Sequence = std::vector<Symbol>;

struct Grammar {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Elem {
    Kind kind;
    uint32_t arg;  // byte set index or rule index
  };
  // Alternatives are runs of elements closed by kEnd. elems[0] refers to the root rule and
  // elems[1] ends it, so the start is an ordinary position.
  std::vector<Elem> elems;
  std::vector<uint32_t> alt_begin;   // element index where each alternative starts
  std::vector<uint32_t> rule_first;  // rule r's alternatives: alt_begin[rule_first[r] .. rule_first[r+1])
  std::vector<ByteSet> sets;
};

class GrammarBuilder {
 public:
  uint32_t new_rule();
  void add_alt(uint32_t rule, Sequence sequence);
  // A rule whose alternatives are the given sequences.
  uint32_t rule_of(std::vector<Sequence> alternatives);
  Symbol bytes(const ByteSet& set);
  Symbol byte(uint8_t b);
  Symbol range(uint8_t lo, uint8_t hi);
  static Symbol ref(uint32_t rule) { return {true, rule}; }
  Sequence literal(std::string_view text);
  // item repeated min..max times (max < 0: unbounded). item must not match the empty string,
  // or the unbounded loop would never consume input.
  uint32_t repeat(const Sequence& item, int64_t min, int64_t max);
  // Drops alternatives that use rules matching no finite string, then flattens. Throws
  // anvil::Error(empty_message) when the root itself matches nothing.
  Grammar build(uint32_t root, std::string_view empty_message) &&;

 private:
  std::vector<std::vector<Sequence>> rules_;
  std::vector<ByteSet> sets_;
};

class GrammarMatcher {
 public:
  static constexpr int32_t kDead = -1;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  int32_t initial() const { return initial_; }
  // The state after byte b, or kDead.
  int32_t next(int32_t state, uint8_t b) {
    const int32_t cached = table_[size_t(state) * 256 + b];
    return cached != kUnknown ? cached : compute(state, b);
  }
  int32_t next(int32_t state, std::string_view bytes);
  // True when the bytes so far form a whole sentence.
  bool complete(int32_t state) const { return states_[size_t(state)].complete; }
  size_t num_states() const { return states_.size(); }
  // Forgets every cached state but `keep` and returns keep's new id: long outputs visit new
  // states all the time, and their rows would otherwise grow without bound.
  int32_t compact(int32_t keep);

 private:
  static constexpr int32_t kUnknown = -2;
  struct Node {
    uint32_t pos;     // grammar element the stack's top waits at
    uint32_t parent;  // rest of the stack; node 0 is the empty stack
  };
  struct State {
    uint32_t first, count;  // its stacks: pool_[first .. first+count)
    bool complete;
  };
  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  int32_t compute(int32_t state, uint8_t b);
  void expand(uint32_t pos, uint32_t parent, int depth);
  uint32_t node(uint32_t pos, uint32_t parent);
  int32_t intern_scratch();
  void reset_caches();

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_index_;
  std::vector<State> states_;
  std::vector<uint32_t> pool_;
  std::unordered_map<std::vector<uint32_t>, int32_t, VectorHash> state_index_;
  std::vector<int32_t> table_;
  std::vector<uint32_t> scratch_;
  int32_t initial_ = 0;
};

}  // namespace anvil::constraint
