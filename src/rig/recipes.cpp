#include "rig/recipes.h"

namespace anvil::rig {

namespace {

// One arch value only: a list such as "12.0f;12.1a" crashes `import flashinfer` ("too many values
// to unpack"), and plain sm_120 lacks the FP4 conversion instructions the kernels JIT-compile.
const std::pair<std::string, std::string> kFlashinferSm120{"FLASHINFER_CUDA_ARCH_LIST", "12.0f"};

std::vector<Recipe> build() {
  std::vector<Recipe> all;
  all.push_back(Recipe{
      .name = "gpt-oss-120b-sm120-vllm",
      .summary = "gpt-oss-120b MXFP4 on one RTX PRO 6000 Blackwell (SM120) with vLLM",
      .arch = "12.0",
      .default_model = "openai/gpt-oss-120b",
      .command = {"vllm", "serve", "${MODEL}", "--host", "127.0.0.1", "--port", "${PORT}", "--served-model-name",
                  "${NAME}", "--quantization", "mxfp4", "--mxfp4-backend", "CUTLASS", "--mxfp4-layers",
                  "moe,qkv,o,lm_head", "--attention-backend", "FLASHINFER", "--kv-cache-dtype", "fp8",
                  "--gpu-memory-utilization", "0.70", "--max-model-len", "8192", "--max-num-seqs", "2",
                  "--max-num-batched-tokens", "8192", "--enable-prefix-caching"},
      .env = {kFlashinferSm120},
      .server = ServerKind::Vllm,
      .start_timeout_s = 900,
      .vram_gb = 67,  // 0.70 of 96 GB, the share these flags give vLLM
      .avoids = "ptxas \"Feature 'cvt.e2m1x2.f32' not supported on .target 'sm_120'\" (FP4 kernels JIT-compiled "
                "for plain sm_120); needs no --enforce-eager",
      .python_startup = "",
  });
  all.push_back(Recipe{
      .name = "qwen3.5-122b-mxfp4-sm120-vllm-marlin",
      .summary = "Qwen3.5-122B-A10B MXFP4 (W4A4 checkpoint) on one RTX PRO 6000 (SM120), vLLM with the Marlin W4A16 fallback",
      .arch = "12.0",
      .default_model = "",
      .command = {"vllm", "serve", "${MODEL}", "--host", "127.0.0.1", "--port", "${PORT}", "--served-model-name",
                  "${NAME}", "--quantization", "compressed-tensors", "--reasoning-parser", "qwen3",
                  "--tool-call-parser", "qwen3_coder", "--enable-auto-tool-choice", "--max-model-len", "16384",
                  "--gpu-memory-utilization", "0.90", "--kv-cache-dtype", "fp8"},
      .env = {kFlashinferSm120, {"VLLM_USE_V2_MODEL_RUNNER", "0"}},
      .server = ServerKind::Vllm,
      .start_timeout_s = 1200,  // about 690 s to load as reported
      .vram_gb = 87,
      .avoids = "\"mm_fp4 does not support backend 'cute-dsl' with capability 120\" (a kernel picked by "
                "capability >= 100): flashinfer.cute_dsl is made unimportable so the scheme falls back to Marlin",
      // None in sys.modules makes every import of the module fail; the file runs in each Python
      // process vLLM spawns too, since they inherit PYTHONPATH.
      .python_startup = "import sys\nsys.modules['flashinfer.cute_dsl'] = None\n",
  });
  all.push_back(Recipe{
      .name = "nemotron-3-super-nvfp4-sm120-vllm",
      .summary = "Nemotron-3-Super-120B-A12B NVFP4 (ModelOpt) on one RTX PRO 6000 (SM120), vLLM with FlashInfer CUTLASS MoE",
      .arch = "12.0",
      .default_model = "",
      .command = {"vllm", "serve", "${MODEL}", "--host", "127.0.0.1", "--port", "${PORT}", "--served-model-name",
                  "${NAME}", "--attention-backend", "TRITON_ATTN", "--mamba-ssm-cache-dtype", "float16",
                  "--kv-cache-dtype", "fp8", "--max-num-seqs", "512", "--dtype", "auto"},
      .env = {},
      .server = ServerKind::Vllm,
      .start_timeout_s = 1200,
      .vram_gb = 77,
      .avoids = "\"max_num_seqs (1024) exceeds available Mamba cache blocks (940)\" at CUDA-graph capture; no "
                "--quantization, no --speculative-config (MTP runs out of memory), no --swap-space (removed), "
                "no --moe-backend marlin (crashes at load)",
      .python_startup = "",
  });
  return all;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> all = build();
  return all;
}

const Recipe* find_recipe(const std::string& name) {
  for (const Recipe& recipe : recipes())
    if (recipe.name == name) return &recipe;
  return nullptr;
}

}  // namespace anvil::rig
