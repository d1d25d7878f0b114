#pragma once
// Known-good command lines for large quantized models on a given GPU architecture, as owners
// reported them (../shared/specs/recipes.md; not measured by us). A config names one with
// `recipe: NAME` instead of spelling the flags; its `model`, `args` and `env` still apply on top.
#include <string>
#include <utility>
#include <vector>

#include "rig/config.h"

namespace anvil::rig {

struct Recipe {
  std::string name;
  std::string summary;         // model × quantization × engine × GPU
  std::string arch;            // compute capability the flags are for, e.g. "12.0"
  std::string default_model;   // empty: the config must give `model`
  std::vector<std::string> command;  // with ${MODEL}, ${PORT} and ${NAME}
  std::vector<std::pair<std::string, std::string>> env;
  ServerKind server = ServerKind::Vllm;
  double start_timeout_s = 900;
  double vram_gb = 0;          // resident memory as reported
  std::string avoids;          // the failure these settings avoid
  // Python run at interpreter start in the backend and every Python process it spawns (written
  // as sitecustomize.py on a PYTHONPATH entry); empty when none is needed.
  std::string python_startup;
};

const std::vector<Recipe>& recipes();
const Recipe* find_recipe(const std::string& name);

}  // namespace anvil::rig
