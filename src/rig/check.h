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

// Each model's memory figure (rig/sizing.h: vram_gb, or anvil plan's for anvil models) and where
// it came from are printed. Groups swap their members, so a group needs its largest member on
// each GPU; groups run side by side, so the groups placed on one GPU add up. `gpus` are the GPUs
// to plan against: those visible, or a stand-in of a given size.
CheckReport check_config(const RigConfig& config, const std::vector<cuda::DeviceInfo>& gpus);

}  // namespace anvil::rig
