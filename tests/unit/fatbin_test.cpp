// The anvil binary carries native code for every target the build compiled (issue 4: "cuobjdump
// --list-elf on the built artifact shows each"), read from its own fat binary headers. A build
// without CUDA carries none.
#include <gtest/gtest.h>

#include <set>

#include "backend/cuda/runtime.h"
#include "backend/fatbin.h"

namespace anvil {
namespace {

TEST(Fatbin, TheBinaryCarriesEveryCompiledTarget) {
  const auto entries = read_fatbin_entries(ANVIL_BINARY);
  std::set<std::string> found;
  for (const auto& entry : entries) found.insert(entry.name());
  if (!cuda::compiled_in()) {
    EXPECT_TRUE(entries.empty());
    return;
  }
  ASSERT_FALSE(entries.empty()) << "no fat binary in " << ANVIL_BINARY;
  for (std::string target : cuda::compiled_targets()) {
    if (!target.empty() && target.back() == 'a') target.pop_back();  // sm_90a's entries say arch 90
    EXPECT_TRUE(found.count(target)) << target << " is missing from " << ANVIL_BINARY;
  }
  // Nothing else: a stray target would mean the build's flags are not the ones it reports.
  std::set<std::string> expected;
  for (std::string target : cuda::compiled_targets()) {
    if (target.back() == 'a') target.pop_back();
    expected.insert(target);
  }
  for (const auto& name : found) EXPECT_TRUE(expected.count(name)) << "unexpected " << name;
}

TEST(Fatbin, AFileWithoutCudaCodeHasNoEntries) {
  EXPECT_TRUE(read_fatbin_entries(std::string(ANVIL_SOURCE_DIR) + "/README.md").empty());
  EXPECT_ANY_THROW(read_fatbin_entries("/nonexistent/anvil"));
}

}  // namespace
}  // namespace anvil
