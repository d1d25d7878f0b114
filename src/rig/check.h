#pragma once
// `anvil rig check`: what a config would run, and whether each group's memory fits the GPUs.
#include <string>
#include <vector>

#include "backend/cuda/runtime.h"
#include "rig/config.h"

namespace anvil::rig {

struct CheckReport {
  std::string text;  // printed as is
  std::vector<std::string> problems;  // each makes the check fail
};

// Groups swap their members, so a group needs its largest member's vram_gb; groups run side by
// side, so the groups placed on one GPU add up. Members without gpus are placed on every GPU
// (CUDA_VISIBLE_DEVICES unset), which is how engines see them.
CheckReport check_config(const RigConfig& config, const std::vector<cuda::DeviceInfo>& gpus);

}  // namespace anvil::rig
