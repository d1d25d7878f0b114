// anvil: one binary, many verbs. Each verb lives in its own file and registers here.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/verbs.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"anvil: serve large language models on the GPUs people own, with the CPU as fallback"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ANVIL_VERSION);
  anvil::cli::register_verbs(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const anvil::Error& error) {
    std::fprintf(stderr, "anvil: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "anvil: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
