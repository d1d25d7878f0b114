#include "engine/constraint_grammar.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace anvil::constraint {

// ---- GrammarBuilder ----------------------------------------------------------------------------

uint32_t GrammarBuilder::new_rule() {
  rules_.emplace_back();
  return uint32_t(rules_.size() - 1);
}

void GrammarBuilder::add_alt(uint32_t rule, Sequence sequence) { rules_[rule].push_back(std::move(sequence)); }

uint32_t GrammarBuilder::rule_of(std::vector<Sequence> alternatives) {
  const uint32_t rule = new_rule();
  rules_[rule] = std::move(alternatives);
  return rule;
}

Symbol GrammarBuilder::bytes(const ByteSet& set) {
  const auto found = std::find(sets_.begin(), sets_.end(), set);
  if (found != sets_.end()) return {false, uint32_t(found - sets_.begin())};
  sets_.push_back(set);
  return {false, uint32_t(sets_.size() - 1)};
}

Symbol GrammarBuilder::byte(uint8_t b) {
  ByteSet set;
  set.add(b);
  return bytes(set);
}

Symbol GrammarBuilder::range(uint8_t lo, uint8_t hi) {
  ByteSet set;
  set.add_range(lo, hi);
  return bytes(set);
}

Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence sequence;
  for (const char c : text) sequence.push_back(byte(uint8_t(c)));
  return sequence;
}

uint32_t GrammarBuilder::repeat(const Sequence& item, int64_t min, int64_t max) {
  Sequence head;
  for (int64_t i = 0; i < min; ++i) head.insert(head.end(), item.begin(), item.end());
  if (max < 0) {
    // Right recursion: the matcher turns the trailing reference into a tail call, so the loop
    // never deepens the stack.
    const uint32_t loop = new_rule();
    Sequence again = item;
    again.push_back(ref(loop));
    add_alt(loop, {});
    add_alt(loop, std::move(again));
    head.push_back(ref(loop));
  } else if (max > min) {
    // Nested optionals, innermost first: up to (max - min) more items.
    uint32_t tail = new_rule();
    add_alt(tail, {});
    add_alt(tail, item);
    for (int64_t i = 1; i < max - min; ++i) {
      const uint32_t outer = new_rule();
      Sequence more = item;
      more.push_back(ref(tail));
      add_alt(outer, {});
      add_alt(outer, std::move(more));
      tail = outer;
    }
    head.push_back(ref(tail));
  }
  return rule_of({std::move(head)});
}

Grammar GrammarBuilder::build(uint32_t root, std::string_view empty_message) && {
  // A rule is productive once some alternative uses only productive rules; iterate to the
  // fixpoint. Dropping the rest means every stack the matcher can reach still has a way to
  // finish, so a constrained generation never paints itself into a corner.
  std::vector<char> productive(rules_.size(), 0);
  auto usable = [&](const Sequence& sequence) {
    return std::all_of(sequence.begin(), sequence.end(),
                       [&](const Symbol& s) { return !s.is_rule || productive[s.index]; });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (productive[r]) continue;
      if (std::any_of(rules_[r].begin(), rules_[r].end(), usable)) productive[r] = 1, changed = true;
    }
  }
  if (!productive[root]) throw Error(std::string(empty_message));

  Grammar g;
  g.sets = std::move(sets_);
  g.elems = {{Grammar::Kind::kRule, root}, {Grammar::Kind::kEnd, 0}};
  for (const auto& alternatives : rules_) {
    g.rule_first.push_back(uint32_t(g.alt_begin.size()));
    for (const auto& sequence : alternatives) {
      if (!usable(sequence)) continue;
      g.alt_begin.push_back(uint32_t(g.elems.size()));
      for (const Symbol& s : sequence) g.elems.push_back({s.is_rule ? Grammar::Kind::kRule : Grammar::Kind::kBytes, s.index});
      g.elems.push_back({Grammar::Kind::kEnd, 0});
    }
  }
  g.rule_first.push_back(uint32_t(g.alt_begin.size()));
  return g;
}

// ---- GrammarMatcher ----------------------------------------------------------------------------

size_t GrammarMatcher::VectorHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 0xcbf29ce484222325ull ^ v.size();
  for (const uint32_t x : v) h = (h ^ x) * 0x100000001b3ull;
  return size_t(h ^ (h >> 29));
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  reset_caches();
  expand(0, 0, 0);
  initial_ = intern_scratch();
  if (initial_ == kDead) fail("constraint grammar: no start state");
}

void GrammarMatcher::reset_caches() {
  nodes_.assign(1, Node{0, 0});
  node_index_.clear();
  states_.clear();
  pool_.clear();
  state_index_.clear();
  table_.clear();
  scratch_.clear();
}

uint32_t GrammarMatcher::node(uint32_t pos, uint32_t parent) {
  const uint64_t key = uint64_t(pos) << 32 | parent;
  const auto [it, inserted] = node_index_.try_emplace(key, uint32_t(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarMatcher::expand(uint32_t pos, uint32_t parent, int depth) {
  // The grammars built here have no left recursion, so this depth is the nesting of rules
  // entered without consuming a byte; a runaway means a builder bug, not a long input.
  if (depth > 4096) fail("constraint grammar: rules nest without consuming input");
  const Grammar& g = *grammar_;
  const Grammar::Elem& e = g.elems[pos];
  switch (e.kind) {
    case Grammar::Kind::kBytes:
      scratch_.push_back(node(pos, parent));
      return;
    case Grammar::Kind::kEnd:
      if (parent == 0) {
        scratch_.push_back(0);  // the empty stack: a whole sentence has been read
      } else {
        const Node up = nodes_[parent];
        expand(up.pos, up.parent, depth + 1);
      }
      return;
    case Grammar::Kind::kRule: {
      // A reference in tail position returns straight to our caller: loops stay flat.
      const uint32_t resume = g.elems[pos + 1].kind == Grammar::Kind::kEnd ? parent : node(pos + 1, parent);
      for (uint32_t a = g.rule_first[e.arg]; a < g.rule_first[e.arg + 1]; ++a) expand(g.alt_begin[a], resume, depth + 1);
      return;
    }
  }
}

int32_t GrammarMatcher::intern_scratch() {
  if (scratch_.empty()) return kDead;
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  const auto [it, inserted] = state_index_.try_emplace(scratch_, int32_t(states_.size()));
  if (inserted) {
    states_.push_back({uint32_t(pool_.size()), uint32_t(scratch_.size()), scratch_.front() == 0});
    pool_.insert(pool_.end(), scratch_.begin(), scratch_.end());
    table_.resize(table_.size() + 256, kUnknown);
  }
  scratch_.clear();
  return it->second;
}

int32_t GrammarMatcher::compute(int32_t state, uint8_t b) {
  const Grammar& g = *grammar_;
  const State s = states_[size_t(state)];
  scratch_.clear();
  for (uint32_t k = 0; k < s.count; ++k) {
    const uint32_t stack = pool_[s.first + k];
    if (stack == 0) continue;
    const Node top = nodes_[stack];
    if (g.sets[g.elems[top.pos].arg].has(b)) expand(top.pos + 1, top.parent, 0);
  }
  const int32_t result = intern_scratch();
  table_[size_t(state) * 256 + b] = result;
  return result;
}

int32_t GrammarMatcher::next(int32_t state, std::string_view bytes) {
  for (const char c : bytes) {
    if (state == kDead) break;
    state = next(state, uint8_t(c));
  }
  return state;
}

int32_t GrammarMatcher::compact(int32_t keep) {
  // Re-intern keep's stacks from scratch; everything else is only a cache.
  std::vector<std::vector<uint32_t>> stacks;  // positions, bottom first
  const State s = states_[size_t(keep)];
  for (uint32_t k = 0; k < s.count; ++k) {
    std::vector<uint32_t> positions;
    for (uint32_t n = pool_[s.first + k]; n != 0; n = nodes_[n].parent) positions.push_back(nodes_[n].pos);
    std::reverse(positions.begin(), positions.end());
    stacks.push_back(std::move(positions));
  }
  reset_caches();
  std::vector<uint32_t> rebuilt;
  for (const auto& positions : stacks) {
    uint32_t n = 0;
    for (const uint32_t pos : positions) n = node(pos, n);
    rebuilt.push_back(n);
  }
  scratch_ = std::move(rebuilt);
  initial_ = kDead;  // the start is not needed once output has begun
  return intern_scratch();
}

}  // namespace anvil::constraint
