#include "support/test_support.h"

#include <cstdlib>

#include <sys/wait.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace anvil::test {

// ANVIL_FIXTURES_DIR in the environment wins: the GPU machine gets a copy of the fixtures inside
// the repository (../shared does not travel there).
std::filesystem::path fixtures_dir() {
  if (const char* from_env = std::getenv("ANVIL_FIXTURES_DIR"); from_env && *from_env) return from_env;
  return ANVIL_FIXTURES_DIR;
}

TempDir::TempDir() {
  std::random_device device;
  const auto base = std::filesystem::temp_directory_path();
  for (;;) {
    path_ = base / ("anvil-test-" + std::to_string(device()));
    if (std::filesystem::create_directory(path_)) break;
  }
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::filesystem::path harmony_tokenizer_json() {
  static TempDir dir;
  static std::filesystem::path unpacked;
  if (!unpacked.empty()) return unpacked;
  const auto gz_path = fixtures_dir() / "o200k_harmony" / "tokenizer.json.gz";
  gzFile in = gzopen(gz_path.c_str(), "rb");
  if (!in) throw std::runtime_error("cannot open " + gz_path.string());
  std::string bytes;
  char buffer[1 << 16];
  int got;
  while ((got = gzread(in, buffer, sizeof buffer)) > 0) bytes.append(buffer, size_t(got));
  gzclose(in);
  unpacked = dir.path() / "tokenizer.json";
  write_file(unpacked, bytes);
  return unpacked;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

CommandResult run_anvil(const std::string& args) {
  static TempDir scratch;
  static int counter = 0;
  const auto out_path = scratch.path() / ("out" + std::to_string(counter));
  const auto err_path = scratch.path() / ("err" + std::to_string(counter++));
  const std::string command = std::string("'") + ANVIL_BINARY + "' " + args + " >'" + out_path.string() +
                              "' 2>'" + err_path.string() + "' </dev/null";
  const int status = std::system(command.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

}  // namespace anvil::test
