#pragma once
// Helpers shared by the test suites: where the fixtures are, temp dirs, running the CLI.
#include <filesystem>
#include <string>

namespace anvil::test {

// ../shared/fixtures relative to the source tree.
std::filesystem::path fixtures_dir();
// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The o200k_harmony tokenizer.json, unpacked once per process into a temp dir.
std::filesystem::path harmony_tokenizer_json();

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs build/anvil with the given shell-quoted argument string.
CommandResult run_anvil(const std::string& args);

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);

}  // namespace anvil::test
