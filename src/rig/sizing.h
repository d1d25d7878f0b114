#pragma once
// How much GPU memory a backend takes, for `anvil rig check`'s placement: `vram_gb` when the
// config gives it; otherwise, for `engine: anvil`, what `anvil plan` computes for the model with
// the serve flags in its args (--gpu-memory-utilization, --kv-cache-memory, --max-model-len,
// --kv-cache-dtype, --max-num-batched-tokens, --device). Command backends without vram_gb have
// no figure: nothing says what an arbitrary command will allocate.
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/runtime.h"
#include "rig/config.h"

namespace anvil::rig {

struct MemoryFigure {
  std::optional<double> gb;   // GB (10^9 bytes, as vram_gb); none: not known, left out of the plan
  std::vector<int> gpus;      // GPU indices it lands on; the figure is split evenly across them
  std::string source;         // where the figure came from, for people
  std::vector<std::string> problems;  // each fails the check: the model cannot run as configured
};

// `gpus` are the GPUs the check plans against (those visible, or a stand-in of a given size).
// anvil serve runs on one GPU: the first it sees (its `gpus`, else all), or cuda:N of --device.
// Other backends are taken to spread over every GPU they see.
MemoryFigure memory_figure(const RigConfig& config, const ModelConfig& model, const std::vector<cuda::DeviceInfo>& gpus);

}  // namespace anvil::rig
