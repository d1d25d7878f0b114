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
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> shift_);
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
  shift_ = 64;
  for (size_t c = capacity; c > 1; c >>= 1) --shift_;
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

// ---- StringIndex -------------------------------------------------------------------------------

uint64_t StringIndex::hash(std::string_view key) {
  // FNV-1a, then a multiply-shift finish so the low bits (the slot) depend on every byte. Keys are
  // short (tokens average a few bytes), where this beats the library's hash.
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : key) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  h ^= h >> 32;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

size_t StringIndex::probe(std::string_view key, uint64_t h) const {
  size_t index = size_t(h) & mask_;
  for (;;) {
    const Slot& slot = slots_[index];
    if (slot.id < 0) return index;
    if (slot.hash_high == uint32_t(h >> 32) && slot.length == key.size() &&
        std::string_view(arena_).substr(slot.begin, slot.length) == key) {
      return index;
    }
    index = (index + 1) & mask_;
  }
}

void StringIndex::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const Slot& slot : old) {
    if (slot.id < 0) continue;
    const std::string_view key = std::string_view(arena_).substr(slot.begin, slot.length);
    slots_[probe(key, hash(key))] = slot;
  }
}

void StringIndex::insert(std::string_view key, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) reserve(size_ + 1);
  if (arena_.size() + key.size() > UINT32_MAX) anvil::fail("vocabulary holds over 4 GiB of text");
  const uint64_t h = hash(key);
  Slot& slot = slots_[probe(key, h)];
  if (slot.id >= 0) {
    slot.id = id;
    return;
  }
  slot = Slot{uint32_t(arena_.size()), uint32_t(key.size()), uint32_t(h >> 32), id};
  arena_.append(key);
  ++size_;
}

int32_t StringIndex::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  return slots_[probe(key, hash(key))].id;
}

// ---- BpeModel ----------------------------------------------------------------------------------

BpeModel::BpeModel(std::string source, StringIndex vocab, MergeTable merges, bool ignore_merges,
                   std::optional<int32_t> unk_id)
    : source_(std::move(source)),
      vocab_(std::move(vocab)),
      merges_(std::move(merges)),
      ignore_merges_(ignore_merges),
      unk_id_(unk_id) {
  for (int byte = 0; byte < 256; ++byte) {
    const char c = char(byte);
    byte_ids_[size_t(byte)] = vocab_.find(std::string_view(&c, 1));
  }
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  if (piece.empty()) return;
  // tiktoken never splits a pre-token that is itself a token, and tokenizers' ignore_merges copies
  // that: it can differ from what the merges would build.
  if (ignore_merges_ || piece.size() == 1) {
    const int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out.push_back(id);
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
      if (!unk_id_) {
        anvil::fail("{}: byte 0x{:02X} has no token in the vocabulary and there is no unk_token", source_,
                    static_cast<unsigned char>(piece[size_t(i)]));
      }
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
