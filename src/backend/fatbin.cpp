#include "backend/fatbin.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace anvil {

namespace {

// Container: u32 magic, u16 version (1), u16 header size (16), u64 size of the entries after it.
// Entry: u16 kind (1 PTX, 2 or 0x10 ELF), u16, u32 entry header size (64, 80 or 112), u64 payload
// size (8-byte aligned), ..., u32 sm arch at offset 28; the next entry follows the payload.
constexpr uint32_t kMagic = 0xBA55ED50u;
constexpr size_t kContainerHeader = 16, kEntryMinimum = 64;

template <typename T>
T read_at(const std::vector<char>& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

}  // namespace

std::vector<FatbinEntry> read_fatbin_entries(const std::filesystem::path& binary) {
  std::ifstream file(binary, std::ios::binary);
  if (!file) fail("{}: cannot open", binary.string());
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<FatbinEntry> entries;
  size_t offset = 0;
  while (offset + kContainerHeader <= bytes.size()) {
    if (read_at<uint32_t>(bytes, offset) != kMagic || read_at<uint16_t>(bytes, offset + 4) != 1 ||
        read_at<uint16_t>(bytes, offset + 6) != kContainerHeader) {
      offset += 4;  // containers are at least 4-byte aligned in the section
      continue;
    }
    const uint64_t size = read_at<uint64_t>(bytes, offset + 8);
    const size_t end = offset + kContainerHeader + size;
    if (size == 0 || end > bytes.size()) {
      offset += 4;
      continue;
    }
    size_t entry = offset + kContainerHeader;
    while (entry + kEntryMinimum <= end) {
      const uint16_t kind = read_at<uint16_t>(bytes, entry);
      const uint32_t header = read_at<uint32_t>(bytes, entry + 4);
      const uint64_t payload = read_at<uint64_t>(bytes, entry + 8);
      if (header < kEntryMinimum || entry + header + payload > end) break;
      if (kind == 1 || kind == 2 || kind == 0x10)
        entries.push_back({kind == 1, int(read_at<uint32_t>(bytes, entry + 28))});
      entry += header + payload;
    }
    offset = end;
  }
  return entries;
}

}  // namespace anvil
