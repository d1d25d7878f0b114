#include "rig/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "rig/recipes.h"

namespace anvil::rig {

namespace {

// Walks the YAML tree with the field path in hand, so each error can say where it is.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  template <typename... Args>
  [[noreturn]] void error(const YAML::Node& at, const std::string& field, fmt::format_string<Args...> format,
                          Args&&... args) const {
    const int line = at.Mark().line >= 0 ? at.Mark().line + 1 : 1;
    fail("{}:{}: {}: {}", file_, line, field, fmt::format(format, std::forward<Args>(args)...));
  }

  // The map's keys in order, each checked against `allowed` and for repeats.
  std::vector<std::pair<YAML::Node, YAML::Node>> entries(const YAML::Node& map, const std::string& field,
                                                         const std::set<std::string>& allowed) const {
    if (!map.IsMap()) error(map, field, "expected a mapping");
    std::vector<std::pair<YAML::Node, YAML::Node>> out;
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) error(key, field, "keys must be plain names");
      const std::string name = key.Scalar();
      const std::string path = field.empty() ? name : field + "." + name;
      if (!allowed.empty() && !allowed.count(name)) error(key, path, "unknown key (allowed: {})", join(allowed));
      if (!seen.insert(name).second) error(key, path, "given twice");
      out.emplace_back(key, it->second);
    }
    return out;
  }

  std::string string(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) error(node, field, "expected a string");
    return node.Scalar();
  }

  double number(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) error(node, field, "expected a number");
    try {
      return node.as<double>();
    } catch (const YAML::Exception&) {
      error(node, field, "expected a number, got '{}'", node.Scalar());
    }
  }

  int integer(const YAML::Node& node, const std::string& field, int low, int high) const {
    if (!node.IsScalar()) error(node, field, "expected an integer");
    int value = 0;
    try {
      value = node.as<int>();
    } catch (const YAML::Exception&) {
      error(node, field, "expected an integer, got '{}'", node.Scalar());
    }
    if (value < low || value > high) error(node, field, "must be in [{}, {}], got {}", low, high, value);
    return value;
  }

  bool boolean(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) error(node, field, "expected true or false");
    try {
      return node.as<bool>();
    } catch (const YAML::Exception&) {
      error(node, field, "expected true or false, got '{}'", node.Scalar());
    }
  }

  // Seconds as a number, or with a unit: 90s, 15m, 2h.
  double duration(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) error(node, field, "expected a duration (seconds, or 30s / 5m / 1h)");
    std::string text = node.Scalar();
    double scale = 1;
    if (!text.empty() && (text.back() == 's' || text.back() == 'm' || text.back() == 'h')) {
      scale = text.back() == 'h' ? 3600 : text.back() == 'm' ? 60 : 1;
      text.pop_back();
    }
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(value >= 0) || value > 1e9)
      error(node, field, "expected a duration (seconds, or 30s / 5m / 1h), got '{}'", node.Scalar());
    return value * scale;
  }

  std::vector<std::string> strings(const YAML::Node& node, const std::string& field) const {
    if (!node.IsSequence()) error(node, field, "expected a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < node.size(); ++i) out.push_back(string(node[i], fmt::format("{}[{}]", field, i)));
    return out;
  }

  static std::string join(const std::set<std::string>& names) {
    std::string out;
    for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
  }

 private:
  std::string file_;
};

bool mentions_port(const std::string& text) { return text.find("${PORT}") != std::string::npos; }

void parse_listen(const Reader& reader, const YAML::Node& node, RigConfig& config) {
  const std::string text = reader.string(node, "listen");
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? "" : text.substr(0, colon);
  const std::string port = colon == std::string::npos ? text : text.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value < 0 || value > 65535)
    reader.error(node, "listen", "expected HOST:PORT with a port in [0, 65535], got '{}'", text);
  if (!host.empty()) config.host = host;
  config.port = int(value);
}

std::string parse_gpus(const Reader& reader, const YAML::Node& node, const std::string& field) {
  auto one = [&](const YAML::Node& item, const std::string& item_field) {
    const std::string text = reader.string(item, item_field);
    const bool index = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    if (!index && !text.starts_with("GPU-") && !text.starts_with("MIG-"))
      reader.error(item, item_field, "expected a GPU index or UUID (GPU-... or MIG-...), got '{}'", text);
    return text;
  };
  if (node.IsSequence()) {
    if (node.size() == 0) reader.error(node, field, "the list is empty");
    std::string joined;
    for (size_t i = 0; i < node.size(); ++i) joined += (i ? "," : "") + one(node[i], fmt::format("{}[{}]", field, i));
    return joined;
  }
  return one(node, field);
}

ServerKind parse_server(const Reader& reader, const YAML::Node& node, const std::string& field) {
  const std::string text = reader.string(node, field);
  if (text == "anvil") return ServerKind::Anvil;
  if (text == "vllm") return ServerKind::Vllm;
  if (text == "sglang") return ServerKind::Sglang;
  if (text == "llama.cpp") return ServerKind::LlamaCpp;
  if (text == "other") return ServerKind::Other;
  reader.error(node, field, "expected one of anvil, vllm, sglang, llama.cpp, other, got '{}'", text);
}

bool valid_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != ':') return false;
  return true;
}

ModelConfig parse_model(const Reader& reader, const YAML::Node& key, const YAML::Node& body) {
  ModelConfig model;
  model.name = key.Scalar();
  model.line = key.Mark().line + 1;
  const std::string base = "models." + model.name;
  if (!valid_name(model.name))
    reader.error(key, base, "model names may hold letters, digits and . _ - : (it names log and pid files); "
                            "put other spellings in aliases");
  if (body.IsNull()) reader.error(key, base, "missing model (or command)");
  static const std::set<std::string> allowed = {
      "aliases", "engine", "server", "model", "args", "command", "env", "cwd", "port", "gpus", "health",
      "start_timeout", "ttl", "group", "vram_gb", "recipe", "upstream_model", "preload"};
  std::optional<EngineKind> engine;
  std::optional<ServerKind> server;
  std::optional<double> start_timeout;
  YAML::Node port_node, command_node;
  bool health_set = false;
  for (const auto& [k, v] : reader.entries(body, base, allowed)) {
    const std::string name = k.Scalar();
    const std::string field = base + "." + name;
    if (name == "aliases") {
      model.aliases = reader.strings(v, field);
    } else if (name == "engine") {
      const std::string text = reader.string(v, field);
      if (text == "anvil") engine = EngineKind::Anvil;
      else if (text == "command") engine = EngineKind::Command;
      else reader.error(v, field, "expected anvil or command, got '{}'", text);
    } else if (name == "server") {
      server = parse_server(reader, v, field);
    } else if (name == "model") {
      model.model = reader.string(v, field);
    } else if (name == "args") {
      model.args = reader.strings(v, field);
    } else if (name == "command") {
      model.command = reader.strings(v, field);
      if (model.command.empty()) reader.error(v, field, "the command is empty");
      command_node = v;
    } else if (name == "env") {
      for (const auto& [ek, ev] : reader.entries(v, field, {})) model.env[ek.Scalar()] = reader.string(ev, field + "." + ek.Scalar());
    } else if (name == "cwd") {
      model.cwd = reader.string(v, field);
    } else if (name == "port") {
      model.port = reader.integer(v, field, 1, 65535);
      port_node = v;
    } else if (name == "gpus") {
      model.cuda_visible_devices = parse_gpus(reader, v, field);
    } else if (name == "health") {
      model.health_path = reader.string(v, field);
      if (!model.health_path.starts_with("/")) reader.error(v, field, "expected a URL path such as /health, got '{}'", model.health_path);
      health_set = true;
    } else if (name == "start_timeout") {
      start_timeout = reader.duration(v, field);
      if (*start_timeout <= 0) reader.error(v, field, "must be positive");
    } else if (name == "ttl") {
      model.ttl_s = reader.duration(v, field);
    } else if (name == "group") {
      model.group = reader.string(v, field);
    } else if (name == "vram_gb") {
      model.vram_gb = reader.number(v, field);
      if (!(*model.vram_gb >= 0)) reader.error(v, field, "must be zero or positive");
    } else if (name == "recipe") {
      model.recipe = reader.string(v, field);
      if (!find_recipe(model.recipe)) {
        std::set<std::string> known;
        for (const Recipe& recipe : recipes()) known.insert(recipe.name);
        reader.error(v, field, "unknown recipe '{}' (known: {})", model.recipe, Reader::join(known));
      }
    } else if (name == "upstream_model") {
      model.upstream_model = reader.string(v, field);
    } else if (name == "preload") {
      model.preload = reader.boolean(v, field);
    }
  }

  const Recipe* recipe = model.recipe.empty() ? nullptr : find_recipe(model.recipe);
  model.engine = engine.value_or(model.command.empty() && !recipe ? EngineKind::Anvil : EngineKind::Command);
  if (model.engine == EngineKind::Anvil) {
    if (!model.command.empty()) reader.error(command_node, base + ".command", "only engine: command takes a command");
    if (recipe) reader.error(key, base + ".recipe", "recipes run other engines; use engine: command");
    if (model.model.empty()) reader.error(key, base, "missing model (engine: anvil serves a model directory)");
    model.server = ServerKind::Anvil;
  } else {
    if (recipe && !model.command.empty()) reader.error(command_node, base + ".command", "give a command or a recipe, not both");
    if (!recipe && model.command.empty()) reader.error(key, base, "missing command (engine: command needs an argv list)");
    if (recipe) {
      model.command = recipe->command;
      for (const auto& [name, value] : recipe->env) model.env.try_emplace(name, value);
      if (model.model.empty()) model.model = recipe->default_model;
      if (model.model.empty()) reader.error(key, base, "missing model (recipe {} needs the checkpoint to serve)", recipe->name);
      if (!model.vram_gb && recipe->vram_gb > 0) model.vram_gb = recipe->vram_gb;
      if (!start_timeout) start_timeout = recipe->start_timeout_s;
      if (!server) server = recipe->server;
    }
    model.server = server.value_or(ServerKind::Other);
    bool port_placeholder = false;
    for (const auto& text : model.command) port_placeholder |= mentions_port(text);
    for (const auto& text : model.args) port_placeholder |= mentions_port(text);
    for (const auto& [name, value] : model.env) port_placeholder |= mentions_port(value);
    if (!port_placeholder && !model.port)
      reader.error(command_node ? command_node : key, base + ".command",
                   "no ${{PORT}} in the command and no port: the rig cannot know where the backend listens");
  }
  if (!health_set && model.server == ServerKind::Sglang) model.health_path = "/health_generate";
  if (start_timeout) model.start_timeout_s = *start_timeout;
  if (model.group.empty()) model.group = model.name;
  (void)port_node;
  return model;
}

void check_names_and_ports(const Reader& reader, const YAML::Node& models, RigConfig& config) {
  std::map<std::string, std::string> owner;  // name or alias -> model
  for (const auto& model : config.models) owner[model.name] = model.name;
  std::map<int, std::string> ports;
  for (const auto& model : config.models) {
    const YAML::Node body = models[model.name];
    for (size_t i = 0; i < model.aliases.size(); ++i) {
      const std::string& alias = model.aliases[i];
      const std::string field = fmt::format("models.{}.aliases[{}]", model.name, i);
      if (alias.empty()) reader.error(body["aliases"][i], field, "an alias cannot be empty");
      const auto [it, inserted] = owner.emplace(alias, model.name);
      if (!inserted) {
        const bool is_name = config.find(alias) && config.find(alias)->name == alias;
        reader.error(body["aliases"][i], field, "'{}' is already {}", alias,
                     is_name ? "the name of models." + alias : "an alias of models." + it->second);
      }
    }
    if (model.port) {
      const YAML::Node at = body["port"];
      if (*model.port == config.port)
        reader.error(at, "models." + model.name + ".port", "port {} is the rig's own listen port", *model.port);
      const auto [it, inserted] = ports.emplace(*model.port, model.name);
      if (!inserted)
        reader.error(at, "models." + model.name + ".port", "port {} is also models.{}'s port", *model.port, it->second);
    }
  }
}

}  // namespace

const ModelConfig* RigConfig::find(const std::string& name_or_alias) const {
  for (const auto& model : models)
    if (model.name == name_or_alias) return &model;
  for (const auto& model : models)
    for (const auto& alias : model.aliases)
      if (alias == name_or_alias) return &model;
  return nullptr;
}

std::filesystem::path default_state_dir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "anvil" / "rig";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".local/state/anvil/rig";
  return std::filesystem::temp_directory_path() / "anvil-rig";
}

const char* server_kind_name(ServerKind kind) {
  switch (kind) {
    case ServerKind::Anvil: return "anvil";
    case ServerKind::Vllm: return "vllm";
    case ServerKind::Sglang: return "sglang";
    case ServerKind::LlamaCpp: return "llama.cpp";
    case ServerKind::Other: return "other";
  }
  return "other";
}

RigConfig parse_config(const std::string& text, const std::filesystem::path& file) {
  const Reader reader(file.string());
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& error) {
    fail("{}:{}: bad YAML: {}", file.string(), error.mark.line + 1, error.msg);
  }
  if (!root.IsMap()) reader.error(root, "(top level)", "expected a mapping with listen and models");
  RigConfig config;
  config.file = file;
  static const std::set<std::string> allowed = {"listen",   "models",    "api_key", "queue",       "drain_timeout",
                                                "stop_timeout", "state_dir", "log_dir", "anvil_binary"};
  YAML::Node models;
  bool has_models = false;
  for (const auto& [key, value] : reader.entries(root, "", allowed)) {
    const std::string name = key.Scalar();
    if (name == "listen") parse_listen(reader, value, config);
    else if (name == "models") {
      models = value;
      has_models = true;
    }
    else if (name == "api_key") config.api_key = reader.string(value, name);
    else if (name == "drain_timeout") config.drain_timeout_s = reader.duration(value, name);
    else if (name == "stop_timeout") config.stop_timeout_s = reader.duration(value, name);
    else if (name == "state_dir") config.state_dir = reader.string(value, name);
    else if (name == "log_dir") config.log_dir = reader.string(value, name);
    else if (name == "anvil_binary") config.anvil_binary = reader.string(value, name);
    else if (name == "queue") {
      for (const auto& [qk, qv] : reader.entries(value, "queue", {"max_waiting"}))
        config.max_waiting = reader.integer(qv, "queue." + qk.Scalar(), 0, 1'000'000);
    }
  }
  if (!has_models) reader.error(root, "models", "missing (the backends the rig serves)");
  if (!models.IsMap() || models.size() == 0) reader.error(models, "models", "expected a mapping of model names to their settings");
  for (const auto& [key, value] : reader.entries(models, "models", {})) config.models.push_back(parse_model(reader, key, value));
  check_names_and_ports(reader, models, config);

  const auto base = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  auto resolve = [&](std::filesystem::path& path) {
    if (!path.empty() && path.is_relative()) path = base / path;
  };
  resolve(config.state_dir);
  resolve(config.log_dir);
  if (config.state_dir.empty()) config.state_dir = default_state_dir();
  if (config.log_dir.empty()) config.log_dir = config.state_dir / "logs";
  for (auto& model : config.models)
    if (model.engine == EngineKind::Anvil) {
      std::filesystem::path dir = model.model;
      resolve(dir);
      model.model = dir.string();
    }
  return config;
}

RigConfig load_config(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot read the rig config", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file);
}

}  // namespace anvil::rig
