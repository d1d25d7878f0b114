#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace anvil {

std::vector<int64_t> kv_blocks_needed(const KvLayout& layout, int64_t block_size, int64_t length, int64_t chunk) {
  std::vector<int64_t> needed;
  for (int group = 0; group < layout.num_groups(); ++group) {
    const int64_t window = layout.group_window[size_t(group)];
    const int64_t span = window > 0 ? std::min(length, window + chunk) : length;
    // A span that starts mid-block touches one extra block.
    needed.push_back((span + block_size - 1) / block_size + (window > 0 ? 1 : 0));
  }
  return needed;
}

uint64_t kv_block_hash(uint64_t parent, std::span<const int32_t> block_tokens) {
  // FNV-1a over the parent hash and the token ids, then a final mix.
  uint64_t h = 0xcbf29ce484222325ull ^ parent;
  for (int32_t token : block_tokens) {
    h ^= uint64_t(uint32_t(token));
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

KvCache::KvCache(const KvLayout& layout, const std::vector<int64_t>& blocks_per_group, int64_t block_size)
    : layout_(layout), block_size_(block_size) {
  if (int(blocks_per_group.size()) != layout.num_groups())
    fail("KV cache needs a block count for each of {} groups", layout.num_groups());
  for (int group = 0; group < layout.num_groups(); ++group) {
    KvGroupShape shape;
    shape.num_layers = layout.group_layers[size_t(group)];
    shape.num_blocks = blocks_per_group[size_t(group)];
    shape.block_size = block_size;
    shape.kv_heads = layout.kv_heads;
    shape.head_dim = layout.head_dim;
    shape.device = layout.device;
    shape.dtype = layout.dtype;
    storage_.emplace_back(shape);
    Group& g = groups_.emplace_back();
    const size_t n = size_t(shape.num_blocks);
    g.refcount.assign(n, 0);
    g.hash.assign(n, 0);
    g.cached.assign(n, 0);
    g.block_tokens.resize(n);
    g.free_position.resize(n);
    for (int32_t b = 0; b < int32_t(n); ++b) g.free_position[size_t(b)] = g.free_order.insert(g.free_order.end(), b);
  }
}

int32_t KvCache::take_block(int group) {
  Group& g = groups_[size_t(group)];
  const int32_t block = g.free_order.front();
  g.free_order.pop_front();
  if (g.cached[size_t(block)]) {  // evict: its contents are about to be overwritten
    g.by_hash.erase(g.hash[size_t(block)]);
    g.cached[size_t(block)] = 0;
    g.block_tokens[size_t(block)].clear();
  }
  g.refcount[size_t(block)] = 1;
  return block;
}

void KvCache::hold(int group, int32_t block) {
  Group& g = groups_[size_t(group)];
  if (g.refcount[size_t(block)]++ == 0) g.free_order.erase(g.free_position[size_t(block)]);
}

void KvCache::drop(int group, int32_t block) {
  Group& g = groups_[size_t(group)];
  if (--g.refcount[size_t(block)] > 0) return;
  // Uncached blocks are reused first; cached ones wait at the back in case a prefix returns.
  g.free_position[size_t(block)] = g.cached[size_t(block)] ? g.free_order.insert(g.free_order.end(), block)
                                                           : g.free_order.insert(g.free_order.begin(), block);
}

bool KvCache::grow(SequenceKv& sequence, int64_t new_length) {
  sequence.block_tables.resize(size_t(layout_.num_groups()));
  const int64_t blocks = (new_length + block_size_ - 1) / block_size_;
  for (int group = 0; group < layout_.num_groups(); ++group) {
    const int64_t missing = blocks - int64_t(sequence.block_tables[size_t(group)].size());
    if (missing > free_blocks(group)) return false;
  }
  for (int group = 0; group < layout_.num_groups(); ++group) {
    auto& table = sequence.block_tables[size_t(group)];
    while (int64_t(table.size()) < blocks) table.push_back(take_block(group));
  }
  sequence.length = std::max(sequence.length, new_length);
  return true;
}

void KvCache::trim_windows(SequenceKv& sequence, int64_t next_position) {
  for (int group = 0; group < layout_.num_groups(); ++group) {
    const int64_t window = layout_.group_window[size_t(group)];
    if (window <= 0 || size_t(group) >= sequence.block_tables.size()) continue;
    // The earliest key any later query sees is next_position - window + 1.
    const int64_t first_visible = next_position - window + 1;
    auto& table = sequence.block_tables[size_t(group)];
    for (int64_t b = 0; b < int64_t(table.size()) && (b + 1) * block_size_ <= first_visible; ++b) {
      if (table[size_t(b)] >= 0) {
        drop(group, table[size_t(b)]);
        table[size_t(b)] = -1;
      }
    }
  }
}

void KvCache::release(SequenceKv& sequence) {
  for (size_t group = 0; group < sequence.block_tables.size(); ++group) {
    for (int32_t block : sequence.block_tables[group])
      if (block >= 0) drop(int(group), block);
    sequence.block_tables[group].clear();
  }
  sequence = SequenceKv{};
}

std::vector<std::span<const int32_t>> KvCache::tables(const SequenceKv& sequence) const {
  std::vector<std::span<const int32_t>> spans;
  for (const auto& table : sequence.block_tables) spans.emplace_back(table.data(), table.size());
  return spans;
}

void KvCache::register_full_blocks(SequenceKv& sequence, std::span<const int32_t> tokens) {
  const int64_t full = int64_t(tokens.size()) / block_size_;
  for (int64_t b = sequence.hashed_blocks; b < full; ++b) {
    const auto block_tokens = tokens.subspan(size_t(b * block_size_), size_t(block_size_));
    const uint64_t hash = kv_block_hash(sequence.last_hash, block_tokens);
    for (int group = 0; group < layout_.num_groups(); ++group) {
      if (size_t(group) >= sequence.block_tables.size() || b >= int64_t(sequence.block_tables[size_t(group)].size()))
        continue;
      const int32_t block = sequence.block_tables[size_t(group)][size_t(b)];
      Group& g = groups_[size_t(group)];
      if (block < 0 || g.cached[size_t(block)] || g.by_hash.count(hash)) continue;
      g.cached[size_t(block)] = 1;
      g.hash[size_t(block)] = hash;
      g.block_tokens[size_t(block)].assign(block_tokens.begin(), block_tokens.end());
      g.by_hash[hash] = block;
    }
    sequence.last_hash = hash;
    sequence.hashed_blocks = b + 1;
  }
}

int32_t KvCache::lookup(int group, uint64_t hash, std::span<const int32_t> block_tokens) const {
  const Group& g = groups_[size_t(group)];
  const auto found = g.by_hash.find(hash);
  if (found == g.by_hash.end()) return -1;
  const auto& stored = g.block_tokens[size_t(found->second)];
  if (!std::equal(stored.begin(), stored.end(), block_tokens.begin(), block_tokens.end())) return -1;
  return found->second;
}

int64_t KvCache::attach_cached_prefix(SequenceKv& sequence, std::span<const int32_t> tokens) {
  if (!sequence.block_tables.empty() && !sequence.block_tables[0].empty()) fail("prefix attach needs an empty sequence");
  // At least one token must be computed to produce logits.
  const int64_t candidates = (int64_t(tokens.size()) - 1) / block_size_;
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (int64_t b = 0; b < candidates; ++b) {
    parent = kv_block_hash(parent, tokens.subspan(size_t(b * block_size_), size_t(block_size_)));
    hashes.push_back(parent);
  }
  auto block_at = [&](int group, int64_t b) {
    return lookup(group, hashes[size_t(b)], tokens.subspan(size_t(b * block_size_), size_t(block_size_)));
  };
  // Longest k such that every group has the blocks a query at position k * block_size can see.
  int64_t k = candidates;
  for (; k > 0; --k) {
    bool ok = true;
    for (int group = 0; group < layout_.num_groups() && ok; ++group) {
      const int64_t window = layout_.group_window[size_t(group)];
      const int64_t first = window > 0 ? std::max<int64_t>(0, (k * block_size_ - window + 1) / block_size_) : 0;
      for (int64_t b = first; b < k && ok; ++b) ok = block_at(group, b) >= 0;
    }
    if (ok) break;
  }
  sequence.block_tables.assign(size_t(layout_.num_groups()), {});
  if (k == 0) return 0;
  for (int group = 0; group < layout_.num_groups(); ++group) {
    const int64_t window = layout_.group_window[size_t(group)];
    const int64_t first = window > 0 ? std::max<int64_t>(0, (k * block_size_ - window + 1) / block_size_) : 0;
    auto& table = sequence.block_tables[size_t(group)];
    for (int64_t b = 0; b < k; ++b) {
      if (b < first) {
        table.push_back(-1);
        continue;
      }
      const int32_t block = block_at(group, b);
      hold(group, block);
      table.push_back(block);
    }
  }
  sequence.length = k * block_size_;
  sequence.hashed_blocks = k;
  sequence.last_hash = hashes[size_t(k - 1)];
  return k * block_size_;
}

}  // namespace anvil
