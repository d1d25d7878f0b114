#pragma once
// The CUDA code a binary carries, read from its fat binary entry headers: what `cuobjdump
// --list-elf` / `--list-ptx` would list, without the CUDA tools (the development machine has
// none, and a user's machine need not). The build's tests use it to prove that the binary holds
// native code for every target it was asked to compile.
#include <filesystem>
#include <string>
#include <vector>

namespace anvil {

struct FatbinEntry {
  bool ptx = false;  // PTX text; else a native ELF cubin
  int arch = 0;      // e.g. 90 for sm_90 / sm_90a, 120 for sm_120a
  std::string name() const { return (ptx ? "compute_" : "sm_") + std::to_string(arch); }
};

// Every entry of every fat binary container in the file, in file order. Throws anvil::Error when
// the file cannot be read; a file without CUDA code gives an empty list.
std::vector<FatbinEntry> read_fatbin_entries(const std::filesystem::path& binary);

}  // namespace anvil
