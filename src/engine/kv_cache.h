#pragma once
// Block allocation over the paged KV storage: each sequence holds one block table per KV group.
// Sliding-window groups give back blocks once every position in them is out of the window, so
// they hold only their window (plus the current chunk) however long the sequence grows.
#include <cstdint>
#include <vector>

#include "backend/kv_storage.h"
#include "models/model.h"

namespace anvil {

struct SequenceKv {
  std::vector<std::vector<int32_t>> block_tables;  // per group; -1 = given back
  int64_t length = 0;                              // positions allocated for
};

// Blocks each group of `layout` needs for one sequence of `length` positions prefilled in chunks
// of at most `chunk` tokens.
std::vector<int64_t> kv_blocks_needed(const KvLayout& layout, int64_t block_size, int64_t length, int64_t chunk);

class KvCache {
 public:
  // blocks_per_group: pool size of each group of `layout`.
  KvCache(const KvLayout& layout, const std::vector<int64_t>& blocks_per_group, int64_t block_size);

  std::vector<KvGroupStorage>& storage() { return storage_; }
  const KvLayout& layout() const { return layout_; }
  int64_t block_size() const { return block_size_; }
  int64_t free_blocks(int group) const { return int64_t(free_[size_t(group)].size()); }
  int64_t total_blocks(int group) const { return storage_[size_t(group)].shape().num_blocks; }

  // Makes room for positions [0, new_length); false (and nothing changed) when a pool is short.
  bool grow(SequenceKv& sequence, int64_t new_length);
  // Gives back sliding-window blocks that no query at position >= next_position can see.
  void trim_windows(SequenceKv& sequence, int64_t next_position);
  void release(SequenceKv& sequence);
  // Block tables as the model's step wants them.
  std::vector<std::span<const int32_t>> tables(const SequenceKv& sequence) const;

 private:
  KvLayout layout_;
  int64_t block_size_;
  std::vector<KvGroupStorage> storage_;
  std::vector<std::vector<int32_t>> free_;  // per group: free block ids
};

}  // namespace anvil
