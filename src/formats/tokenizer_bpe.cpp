// The byte-level BPE model: merge table and the merge loop.
#include <algorithm>

#include "core/error.h"
#include "formats/tokenizer_internal.h"

namespace anvil::tokenizer_detail {

// ---- MergeTable --------------------------------------------------------------------------------

namespace {
uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }
}  // namespace

size_t MergeTable::slot_of(uint64_t key) const {
  // Fibonacci hashing spreads the structured (left, right) keys over the table.
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  while (slots_[slot].key != kEmpty && slots_[slot].key != key) slot = (slot + 1) & mask_;
  return slot;
}

void MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{kEmpty, -1, -1});
  mask_ = capacity - 1;
  for (const Slot& slot : old) {
    if (slot.key != kEmpty) slots_[slot_of(slot.key)] = slot;
  }
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) reserve(size_ + 1);
  const uint64_t key = pair_key(left, right);
  Slot& slot = slots_[slot_of(key)];
  if (slot.key == kEmpty) ++size_;
  slot = Slot{key, rank, merged};
}

std::pair<int32_t, int32_t> MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return {-1, -1};
  const Slot& slot = slots_[slot_of(pair_key(left, right))];
  if (slot.key == kEmpty) return {-1, -1};
  return {slot.rank, slot.merged};
}

// ---- BpeModel ----------------------------------------------------------------------------------

BpeModel::BpeModel(StringIdMap vocab, MergeTable merges, bool ignore_merges, std::optional<int32_t> unk_id)
    : vocab_(std::move(vocab)), merges_(std::move(merges)), ignore_merges_(ignore_merges), unk_id_(unk_id) {
  for (int byte = 0; byte < 256; ++byte) {
    const char c = char(byte);
    const auto found = vocab_.find(std::string_view(&c, 1));
    byte_ids_[size_t(byte)] = found == vocab_.end() ? -1 : found->second;
  }
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  if (piece.empty()) return;
  // tiktoken never splits a pre-token that is itself a token, and tokenizers' ignore_merges copies
  // that: it can differ from what the merges would build.
  if (ignore_merges_ || piece.size() == 1) {
    const auto found = vocab_.find(piece);
    if (found != vocab_.end()) {
      out.push_back(found->second);
      return;
    }
  }
  if (piece.size() <= kCacheMaxPieceBytes) {
    std::lock_guard lock(cache_mutex_);
    const auto cached = cache_.find(piece);
    if (cached != cache_.end()) {
      out.insert(out.end(), cached->second.begin(), cached->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge(piece, out, scratch);
  if (piece.size() <= kCacheMaxPieceBytes) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
  }
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();
  const int32_t count = int32_t(piece.size());
  for (int32_t i = 0; i < count; ++i) {
    int32_t id = byte_ids_[static_cast<unsigned char>(piece[size_t(i)])];
    if (id < 0) {
      if (!unk_id_)
        anvil::fail("byte 0x{:02X} has no token in the BPE vocabulary and there is no unk_token",
                    static_cast<unsigned char>(piece[size_t(i)]));
      id = *unk_id_;
    }
    symbols.push_back({id, i - 1, i + 1 < count ? i + 1 : -1, true});
  }
  // Lowest rank first, and the leftmost pair among equal ranks, as tokenizers' BPE does.
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push_candidate = [&](int32_t left) {
    const int32_t right = symbols[size_t(left)].next;
    if (right < 0) return;
    const auto [rank, merged] = merges_.find(symbols[size_t(left)].id, symbols[size_t(right)].id);
    if (rank < 0) return;
    heap.push_back({rank, left, merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < count; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = symbols[size_t(top.pos)];
    // Candidates go stale when a neighbour merged first; the pair now there must still be this merge.
    if (!left.alive || left.next < 0) continue;
    BpeScratch::Symbol& right = symbols[size_t(left.next)];
    const auto [rank, merged] = merges_.find(left.id, right.id);
    if (rank != top.rank || merged != top.merged) continue;
    left.id = merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

}  // namespace anvil::tokenizer_detail
