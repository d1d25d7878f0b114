#pragma once
// Block allocation over the paged KV storage, with prefix caching. Each sequence holds one block
// table per KV group. Blocks are reference-counted: a block full of known tokens is registered
// under the hash of its tokens and everything before it, and a later sequence with the same
// prefix shares it instead of recomputing it. Blocks nobody holds stay cached until their space
// is needed (least recently freed first). Sliding-window groups give blocks back once every
// position in them is out of the window, so they hold only their window (plus the current chunk)
// however long the sequence grows.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/kv_storage.h"
#include "models/model.h"

namespace anvil {

struct SequenceKv {
  std::vector<std::vector<int32_t>> block_tables;  // per group; -1 = given back
  int64_t length = 0;                              // positions allocated for
  int64_t hashed_blocks = 0;                       // leading blocks registered in the prefix cache
  uint64_t last_hash = 0;                          // hash of block hashed_blocks - 1
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
  // Blocks that can be handed out now (free, or cached but held by nobody).
  int64_t free_blocks(int group) const { return int64_t(groups_[size_t(group)].free_order.size()); }
  int64_t total_blocks(int group) const { return storage_[size_t(group)].shape().num_blocks; }

  // Makes room for positions [0, new_length); false (and nothing changed) when a pool is short.
  bool grow(SequenceKv& sequence, int64_t new_length);
  // Gives back sliding-window blocks that no query at position >= next_position can see.
  void trim_windows(SequenceKv& sequence, int64_t next_position);
  void release(SequenceKv& sequence);
  // Block tables as the model's step wants them.
  std::vector<std::span<const int32_t>> tables(const SequenceKv& sequence) const;

  // Prefix caching. Registers every block of `tokens` (the sequence's tokens whose KV is
  // computed) that became full since the last call.
  void register_full_blocks(SequenceKv& sequence, std::span<const int32_t> tokens);
  // Attaches the longest cached prefix of `tokens` to an empty sequence, leaving at least one
  // token to compute; returns the number of positions it covers.
  int64_t attach_cached_prefix(SequenceKv& sequence, std::span<const int32_t> tokens);

 private:
  struct Group {
    std::vector<int32_t> refcount;
    std::vector<uint64_t> hash;  // valid when cached[b]
    std::vector<uint8_t> cached;
    std::vector<std::vector<int32_t>> block_tokens;  // tokens a cached block holds, to rule out collisions
    std::unordered_map<uint64_t, int32_t> by_hash;
    std::list<int32_t> free_order;  // refcount 0; front is handed out first
    std::vector<std::list<int32_t>::iterator> free_position;
  };

  int32_t take_block(int group);
  void hold(int group, int32_t block);
  void drop(int group, int32_t block);
  int32_t lookup(int group, uint64_t hash, std::span<const int32_t> block_tokens) const;

  KvLayout layout_;
  int64_t block_size_;
  std::vector<KvGroupStorage> storage_;
  std::vector<Group> groups_;
};

// Hash of a block's tokens chained onto the hash of everything before it.
uint64_t kv_block_hash(uint64_t parent, std::span<const int32_t> block_tokens);

}  // namespace anvil
