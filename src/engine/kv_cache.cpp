#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace anvil {

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
    storage_.emplace_back(shape);
    auto& free_list = free_.emplace_back();
    // Lowest ids handed out first: pop from the back.
    for (int64_t b = shape.num_blocks - 1; b >= 0; --b) free_list.push_back(int32_t(b));
  }
}

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

bool KvCache::grow(SequenceKv& sequence, int64_t new_length) {
  sequence.block_tables.resize(size_t(layout_.num_groups()));
  const int64_t blocks = (new_length + block_size_ - 1) / block_size_;
  for (int group = 0; group < layout_.num_groups(); ++group) {
    const int64_t missing = blocks - int64_t(sequence.block_tables[size_t(group)].size());
    if (missing > int64_t(free_[size_t(group)].size())) return false;
  }
  for (int group = 0; group < layout_.num_groups(); ++group) {
    auto& table = sequence.block_tables[size_t(group)];
    auto& free_list = free_[size_t(group)];
    while (int64_t(table.size()) < blocks) {
      table.push_back(free_list.back());
      free_list.pop_back();
    }
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
        free_[size_t(group)].push_back(table[size_t(b)]);
        table[size_t(b)] = -1;
      }
    }
  }
}

void KvCache::release(SequenceKv& sequence) {
  for (size_t group = 0; group < sequence.block_tables.size(); ++group) {
    for (int32_t block : sequence.block_tables[group])
      if (block >= 0) free_[group].push_back(block);
    sequence.block_tables[group].clear();
  }
  sequence.length = 0;
}

std::vector<std::span<const int32_t>> KvCache::tables(const SequenceKv& sequence) const {
  std::vector<std::span<const int32_t>> spans;
  for (const auto& table : sequence.block_tables) spans.emplace_back(table.data(), table.size());
  return spans;
}

}  // namespace anvil
