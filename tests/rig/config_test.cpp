// The rig's config: the issue's contract parses, and each kind of mistake is one line naming the
// file, the line and the field.
#include <gtest/gtest.h>

#include "core/error.h"
#include "rig/check.h"
#include "rig/config.h"
#include "rig/recipes.h"

namespace anvil::rig {
namespace {

RigConfig parse(const std::string& text) { return parse_config(text, "/etc/rig.yaml"); }

// The error's text, or a failure when the config was accepted.
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return {};
}

TEST(RigConfig, IssueContractParses) {
  const auto config = parse(R"(listen: 127.0.0.1:8000
models:
  gpt-oss:
    aliases: [llama3]
    engine: anvil              # runs `anvil serve` with the model and args below
    model: /models/gpt-oss-120b
    args: ["--kv-cache-dtype", "fp8"]
    group: big
  qwen:
    engine: command
    command: ["vllm", "serve", "Qwen/Qwen3-32B", "--port", "${PORT}"]
    health: /health
    group: big
)");
  EXPECT_EQ(config.host, "127.0.0.1");
  EXPECT_EQ(config.port, 8000);
  ASSERT_EQ(config.models.size(), 2u);
  const ModelConfig& gpt = config.models[0];
  EXPECT_EQ(gpt.name, "gpt-oss");
  EXPECT_EQ(gpt.engine, EngineKind::Anvil);
  EXPECT_EQ(gpt.model, "/models/gpt-oss-120b");
  EXPECT_EQ(gpt.args, (std::vector<std::string>{"--kv-cache-dtype", "fp8"}));
  EXPECT_EQ(gpt.group, "big");
  EXPECT_EQ(gpt.line, 3);
  const ModelConfig& qwen = config.models[1];
  EXPECT_EQ(qwen.engine, EngineKind::Command);
  EXPECT_EQ(qwen.command.back(), "${PORT}");
  EXPECT_FALSE(qwen.port.has_value());
  EXPECT_EQ(qwen.health_path, "/health");
  EXPECT_EQ(config.find("llama3"), &gpt);
  EXPECT_EQ(config.find("qwen"), &qwen);
  EXPECT_EQ(config.find("Qwen/Qwen3-32B"), nullptr);
}

TEST(RigConfig, FieldsAndDefaults) {
  const auto config = parse(R"(listen: ":9100"
api_key: secret
queue: {max_waiting: 3}
drain_timeout: 2m
stop_timeout: 5
state_dir: state
models:
  a:
    model: dir-a
    gpus: [0, GPU-8b1d2e3f]
    ttl: 90s
    start_timeout: 1h
    vram_gb: 12.5
    preload: true
    env: {FOO: "x${PORT}"}
  b:
    command: [sglang-server, --port, "${PORT}"]
    server: sglang
    cwd: /tmp
    upstream_model: real-name
)");
  EXPECT_EQ(config.host, "127.0.0.1");
  EXPECT_EQ(config.port, 9100);
  EXPECT_EQ(config.api_key, "secret");
  EXPECT_EQ(config.max_waiting, 3);
  EXPECT_EQ(config.drain_timeout_s, 120);
  EXPECT_EQ(config.stop_timeout_s, 5);
  EXPECT_EQ(config.state_dir, "/etc/state");  // relative to the config file
  EXPECT_EQ(config.log_dir, "/etc/state/logs");
  const ModelConfig& a = config.models[0];
  EXPECT_EQ(a.model, "/etc/dir-a");
  EXPECT_EQ(a.cuda_visible_devices, "0,GPU-8b1d2e3f");
  EXPECT_EQ(a.ttl_s, 90);
  EXPECT_EQ(a.start_timeout_s, 3600);
  EXPECT_EQ(*a.vram_gb, 12.5);
  EXPECT_TRUE(a.preload);
  EXPECT_EQ(a.group, "a");  // alone in its own group: runs beside the others
  const ModelConfig& b = config.models[1];
  EXPECT_EQ(b.engine, EngineKind::Command);  // implied by command
  EXPECT_EQ(b.health_path, "/health_generate");  // SGLang's readiness probe
  EXPECT_EQ(b.cwd, "/tmp");
  EXPECT_EQ(b.upstream_model, "real-name");
}

TEST(RigConfig, RecipeFillsTheCommand) {
  const auto config = parse(R"(models:
  big:
    recipe: gpt-oss-120b-sm120-vllm
    aliases: [llama3]
    args: [--max-num-seqs, "4"]
)");
  const ModelConfig& big = config.models[0];
  EXPECT_EQ(big.engine, EngineKind::Command);
  EXPECT_EQ(big.server, ServerKind::Vllm);
  EXPECT_EQ(big.model, "openai/gpt-oss-120b");
  EXPECT_EQ(big.command[0], "vllm");
  EXPECT_EQ(big.env.at("FLASHINFER_CUDA_ARCH_LIST"), "12.0f");
  EXPECT_EQ(big.args.back(), "4");
  EXPECT_GT(big.start_timeout_s, 600);
  ASSERT_TRUE(big.vram_gb.has_value());
  for (const Recipe& recipe : recipes()) {
    EXPECT_FALSE(recipe.avoids.empty()) << recipe.name;
    EXPECT_EQ(recipe.arch, "12.0") << recipe.name;
  }
  EXPECT_NE(error_of("models:\n  q:\n    recipe: qwen3.5-122b-mxfp4-sm120-vllm-marlin\n")
                .find("rig.yaml:2: models.q: missing model (recipe qwen3.5-122b-mxfp4-sm120-vllm-marlin"),
            std::string::npos);
  EXPECT_NE(error_of("models:\n  q:\n    recipe: nope\n").find("rig.yaml:3: models.q.recipe: unknown recipe 'nope' (known: "),
            std::string::npos);
}

TEST(RigConfig, UnknownKey) {
  EXPECT_EQ(error_of("listen: 127.0.0.1:8000\nmodel:\n  a: {model: x}\n"),
            "/etc/rig.yaml:2: model: unknown key (allowed: anvil_binary, api_key, drain_timeout, listen, log_dir, "
            "models, queue, state_dir, stop_timeout)");
  EXPECT_NE(error_of("models:\n  a:\n    model: x\n    gpu: 0\n").find("/etc/rig.yaml:4: models.a.gpu: unknown key (allowed: "),
            std::string::npos);
}

TEST(RigConfig, MissingCommandOrModel) {
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n  b:\n    engine: command\n    health: /health\n"),
            "/etc/rig.yaml:4: models.b: missing command (engine: command needs an argv list)");
  EXPECT_EQ(error_of("models:\n  a:\n    aliases: [x]\n"),
            "/etc/rig.yaml:2: models.a: missing model (engine: anvil serves a model directory)");
  EXPECT_EQ(error_of("models:\n  a:\n"), "/etc/rig.yaml:2: models.a: missing model (or command)");
  EXPECT_EQ(error_of("listen: 127.0.0.1:1\n"), "/etc/rig.yaml:1: models: missing (the backends the rig serves)");
  EXPECT_EQ(error_of("models:\n  a:\n    command: [srv]\n"),
            "/etc/rig.yaml:3: models.a.command: no ${PORT} in the command and no port: the rig cannot know where the "
            "backend listens");
}

TEST(RigConfig, DuplicateAlias) {
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    aliases: [one, two]\n  b:\n    model: y\n    aliases:\n      - three\n      - two\n"),
            "/etc/rig.yaml:9: models.b.aliases[1]: 'two' is already an alias of models.a");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n  b:\n    model: y\n    aliases: [a]\n"),
            "/etc/rig.yaml:6: models.b.aliases[0]: 'a' is already the name of models.a");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n  a:\n    model: y\n"), "/etc/rig.yaml:4: models.a: given twice");
}

TEST(RigConfig, PortClash) {
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    port: 9001\n  b:\n    model: y\n    port: 9001\n"),
            "/etc/rig.yaml:7: models.b.port: port 9001 is also models.a's port");
  EXPECT_EQ(error_of("listen: 0.0.0.0:9000\nmodels:\n  a:\n    model: x\n    port: 9000\n"),
            "/etc/rig.yaml:5: models.a.port: port 9000 is the rig's own listen port");
}

TEST(RigConfig, BadYaml) {
  const std::string message = error_of("listen: 127.0.0.1:8000\nmodels:\n  a: {model: x\n  b: [\n");
  EXPECT_EQ(message.rfind("/etc/rig.yaml:", 0), 0u) << message;
  EXPECT_NE(message.find(": bad YAML: "), std::string::npos) << message;
  EXPECT_EQ(error_of("models:\n\tb: 1\n").rfind("/etc/rig.yaml:2: bad YAML: ", 0), 0u);
  EXPECT_EQ(error_of("- just\n- a list\n"), "/etc/rig.yaml:1: (top level): expected a mapping with listen and models");
}

TEST(RigConfig, BadTypes) {
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    port: http\n"), "/etc/rig.yaml:4: models.a.port: expected an integer, got 'http'");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    port: 70000\n"), "/etc/rig.yaml:4: models.a.port: must be in [1, 65535], got 70000");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    aliases: llama3\n"), "/etc/rig.yaml:4: models.a.aliases: expected a list of strings");
  EXPECT_EQ(error_of("models:\n  a:\n    model: [x]\n"), "/etc/rig.yaml:3: models.a.model: expected a string");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    ttl: soon\n"),
            "/etc/rig.yaml:4: models.a.ttl: expected a duration (seconds, or 30s / 5m / 1h), got 'soon'");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    engine: docker\n"), "/etc/rig.yaml:4: models.a.engine: expected anvil or command, got 'docker'");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    gpus: first\n"),
            "/etc/rig.yaml:4: models.a.gpus: expected a GPU index or UUID (GPU-... or MIG-...), got 'first'");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    health: health\n"),
            "/etc/rig.yaml:4: models.a.health: expected a URL path such as /health, got 'health'");
  EXPECT_EQ(error_of("listen: localhost\nmodels:\n  a: {model: x}\n"),
            "/etc/rig.yaml:1: listen: expected HOST:PORT with a port in [0, 65535], got 'localhost'");
  EXPECT_EQ(error_of("models:\n  a:\n    model: x\n    preload: sometimes\n"),
            "/etc/rig.yaml:4: models.a.preload: expected true or false, got 'sometimes'");
  EXPECT_EQ(error_of("models:\n  a/b:\n    model: x\n").rfind("/etc/rig.yaml:2: models.a/b: model names may hold", 0), 0u);
  EXPECT_EQ(error_of("models:\n  a:\n    engine: anvil\n    model: x\n    command: [y, '${PORT}']\n"),
            "/etc/rig.yaml:5: models.a.command: only engine: command takes a command");
}

TEST(RigCheck, PlansMemoryPerGroup) {
  const auto config = parse(R"(models:
  a: {command: [s, "${PORT}"], group: g, vram_gb: 60}
  b: {command: [s, "${PORT}"], group: g, vram_gb: 80}
  c: {command: [s, "${PORT}"], vram_gb: 10}
  d: {command: [s, "${PORT}"]}
)");
  cuda::DeviceInfo gpu;
  gpu.index = 0;
  gpu.name = "Test GPU";
  gpu.major = 12;
  gpu.total_memory = size_t(96e9);
  auto report = check_config(config, {gpu});
  EXPECT_TRUE(report.problems.empty());
  EXPECT_NE(report.text.find("90.0 of 96.0 GB planned"), std::string::npos) << report.text;  // max(60, 80) + 10
  EXPECT_NE(report.text.find("no memory figure for d: not counted"), std::string::npos) << report.text;
  gpu.total_memory = size_t(80e9);
  report = check_config(config, {gpu});
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0], "GPU 0: the groups placed on it need 90.0 GB, it has 80.0 GB");
}

}  // namespace
}  // namespace anvil::rig
