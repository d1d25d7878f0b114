#include "tools/doctor.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/vector_ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "tools/plan.h"

namespace anvil::tools {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kGiB = uint64_t(1) << 30;

std::string gib(uint64_t bytes) { return fmt::format("{:.1f} GiB", double(bytes) / double(kGiB)); }

std::string cc_text(int major, int minor) { return std::to_string(major) + "." + std::to_string(minor); }

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string shorten(const std::string& text, size_t limit = 160) {
  return text.size() <= limit ? text : text.substr(0, limit - 3) + "...";
}

// "8.0;8.6 9.0+PTX,12.0f" -> entries.
std::vector<std::string> split_arch_list(const std::string& text) {
  std::vector<std::string> entries;
  std::string current;
  for (char c : text + ";") {
    if (c == ';' || c == ',' || c == ' ' || c == '\t') {
      if (!current.empty()) entries.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  return entries;
}

// "12.0f" -> {12, 0, "f"}; "9.0+PTX" -> {9, 0, "+ptx"}; nullopt for names such as "Hopper".
struct ArchEntry {
  int major = 0, minor = 0;
  std::string suffix;
  bool ptx = false;
};
std::optional<ArchEntry> parse_arch_digits(const std::string& raw) {
  std::string text = lower(raw);
  ArchEntry entry;
  if (const size_t plus = text.find("+ptx"); plus != std::string::npos) {
    entry.ptx = true;
    text = text.substr(0, plus);
  }
  if (text.rfind("sm_", 0) == 0 || text.rfind("compute_", 0) == 0) {
    // sm_120a -> 12.0a
    const std::string digits = text.substr(text.find('_') + 1);
    size_t n = 0;
    while (n < digits.size() && std::isdigit(static_cast<unsigned char>(digits[n]))) ++n;
    if (n < 2) return std::nullopt;
    entry.major = std::stoi(digits.substr(0, n - 1));
    entry.minor = digits[n - 1] - '0';
    entry.suffix = digits.substr(n);
    return entry;
  }
  const size_t dot = text.find('.');
  if (dot == std::string::npos || dot == 0) return std::nullopt;
  const std::string major = text.substr(0, dot);
  size_t n = dot + 1;
  while (n < text.size() && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  if (n == dot + 1 || !std::all_of(major.begin(), major.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  entry.major = std::stoi(major);
  entry.minor = std::stoi(text.substr(dot + 1, n - dot - 1));
  entry.suffix = text.substr(n);
  return entry;
}

std::optional<ArchEntry> parse_arch(const std::string& raw) {
  try {
    return parse_arch_digits(raw);
  } catch (const std::exception&) {  // digits too many for an int: no arch
    return std::nullopt;
  }
}

// The FLASHINFER_CUDA_ARCH_LIST value that suits a GPU: arch-specific code for Hopper and newer
// (the family target 12.0f on SM120, 12.1a on GB10, as the recipes say).
std::string flashinfer_arch_for(int major, int minor) {
  if (major == 12 && minor == 0) return "12.0f";
  if (major >= 9) return cc_text(major, minor) + "a";
  return cc_text(major, minor);
}

bool truthy(const std::string& value) {
  const std::string v = lower(value);
  return !v.empty() && v != "0" && v != "false" && v != "no" && v != "off";
}

class Doctor {
 public:
  Doctor(const DoctorInput& input, const DoctorOptions& options) : in_(input), options_(options) {}

  DoctorReport run() {
    report_.json = json::object();
    host();
    gpus();
    model();
    port();
    servers();
    docker();
    environment();
    finish();
    return std::move(report_);
  }

 private:
  void add(const std::string& id, Severity severity, std::string message, std::string fix = "") {
    report_.findings.push_back({id, severity, std::move(message), std::move(fix)});
  }

  const WslInfo::ConfigFile* wsl_config_with_memory() const {
    for (const auto& config : wsl_.configs)
      if (config.memory_bytes) return &config;
    return nullptr;
  }

  // WSL2's default cap is half the PC's RAM; the PC's RAM is then about twice MemTotal, rounded
  // up to a multiple of 8 GiB (MemTotal is a little under the cap).
  std::optional<uint64_t> wsl_host_ram_estimate() const {
    if (!wsl_.detected || wsl_.version != 2 || !memory_ || wsl_config_with_memory()) return std::nullopt;
    const uint64_t step = 8 * kGiB;
    return (2 * memory_->total + step - 1) / step * step;
  }
  // Leave Windows a quarter of the RAM and at least 8 GiB.
  static uint64_t wsl_safe_cap(uint64_t host_ram) {
    const uint64_t quarter = host_ram / 4;
    const uint64_t keep = std::max<uint64_t>(quarter, 8 * kGiB);
    return host_ram > keep ? (host_ram - keep) / kGiB * kGiB : host_ram / 2;
  }

  void host() {
    kernel_ = read_kernel(in_.paths);
    memory_ = read_memory(in_.paths);
    wsl_ = detect_wsl(in_.paths, kernel_);
    json memory = nullptr;
    if (memory_) {
      memory = {{"total_bytes", memory_->total},
                {"available_bytes", memory_->available},
                {"swap_bytes", memory_->swap_total},
                {"cgroup_limit_bytes", memory_->cgroup_limit ? json(*memory_->cgroup_limit) : json(nullptr)},
                {"usable_bytes", memory_->usable()}};
    }
    json wsl = nullptr;
    if (wsl_.detected) {
      json configs = json::array();
      for (const auto& config : wsl_.configs)
        configs.push_back({{"path", config.path.string()},
                           {"memory", config.memory_text.empty() ? json(nullptr) : json(config.memory_text)}});
      wsl = {{"version", wsl_.version}, {"wslconfig", configs}};
    }
    report_.json["host"] = {{"kernel", kernel_.release}, {"memory", memory}, {"wsl", wsl}};
    report_.json["cpu"] = {{"threads", in_.cpu_threads}, {"kernels", in_.cpu_kernels}};
    if (!memory_) add("memory_unknown", Severity::Info, "cannot read " + (in_.paths.proc / "meminfo").string());

    if (!wsl_.detected) return;
    if (wsl_.version == 1) {
      add("wsl1", Severity::Warning, "WSL1 detected (kernel " + kernel_.release + "): WSL1 has no GPU support",
          "convert the distribution to WSL2 from Windows: wsl --set-version <distro> 2");
      return;
    }
    if (!memory_) return;
    const uint64_t cap = memory_->total;
    if (const auto* config = wsl_config_with_memory()) {
      add("wsl_memory", Severity::Info,
          fmt::format("WSL2: Linux memory is capped at {} by memory={} in {}", gib(cap), config->memory_text,
                      config->path.string()),
          "keep memory= at most three quarters of the PC's RAM (Windows needs 8 GB or more); set higher, Windows "
          "starves and WSL can wedge");
      return;
    }
    const uint64_t host_ram = *wsl_host_ram_estimate();
    const uint64_t safe = wsl_safe_cap(host_ram);
    const std::string where = wsl_.configs.empty() ? "%UserProfile%\\.wslconfig" : wsl_.configs.front().path.string();
    const std::string message = fmt::format(
        "WSL2: Linux memory is capped at {} (no memory= in .wslconfig: the default, half of the PC's RAM, about {} "
        "GB)",
        gib(cap), host_ram / kGiB);
    if (safe > cap + kGiB) {
      add("wsl_memory", Severity::Warning, message,
          fmt::format("to load larger checkpoints from RAM, put \"[wsl2]\" and \"memory={}GB\" in {}, then run "
                      "`wsl --shutdown` from Windows; go no higher (Windows needs a quarter of the RAM, at least 8 "
                      "GB, or WSL can wedge)",
                      safe / kGiB, where));
    } else {
      add("wsl_memory", Severity::Info, message);
    }
  }

  const cuda::ArchKernels* table_row(int major, int minor) const {
    for (const auto& row : in_.kernel_table)
      if (row.major == major && row.minor == minor) return &row;
    return nullptr;
  }

  void gpus() {
    const GpuProbe& probe = in_.gpus;
    report_.json["cuda"] = {{"compiled_in", in_.cuda_compiled_in},
                            {"targets", in_.cuda_targets},
                            {"build_version", in_.cuda_build_version ? json(cuda_version_text(in_.cuda_build_version)) : json(nullptr)},
                            {"cublaslt", in_.cublaslt.empty() ? json(nullptr) : json(in_.cublaslt)}};
    const auto kernel_driver = nvidia_kernel_driver_version(in_.paths);
    report_.json["driver"] = {
        {"loaded", probe.driver_loaded},
        {"status", probe.status},
        {"version", kernel_driver ? json(*kernel_driver) : json(nullptr)},
        {"cuda_version", probe.cuda_driver_version ? json(cuda_version_text(probe.cuda_driver_version)) : json(nullptr)}};

    std::string supported;
    for (const auto& row : in_.kernel_table) supported += (supported.empty() ? "" : ", ") + cc_text(row.major, row.minor);
    json gpus = json::array();
    for (const auto& gpu : probe.gpus) {
      const std::string cc = cc_text(gpu.major, gpu.minor);
      json entry = {{"index", gpu.index},
                    {"name", gpu.name},
                    {"compute_capability", cc},
                    {"memory_total_bytes", gpu.total_memory},
                    {"memory_free_bytes", gpu.free_known ? json(gpu.free_memory) : json(nullptr)},
                    {"memory_gib", double(gpu.total_memory) / double(kGiB)},
                    {"free_gib", gpu.free_known ? json(double(gpu.free_memory) / double(kGiB)) : json(nullptr)},
                    {"multiprocessors", gpu.multiprocessors},
                    {"shared_memory_per_block_kib", gpu.shared_memory_per_block_optin / 1024},
                    {"pci_bus_id", gpu.pci_bus_id},
                    {"kernels", nullptr}};
      const std::string label = fmt::format("GPU {} ({}, compute capability {})", gpu.index, gpu.name, cc);
      const cuda::ArchKernels* row = table_row(gpu.major, gpu.minor);
      if (!in_.cuda_compiled_in) {
        entry["problem"] = "this anvil was built without CUDA";
        add("no_cuda_build", Severity::Warning, label + ": this anvil was built without CUDA and runs on the CPU only",
            "rebuild on a machine with the CUDA toolkit (nvcc) so the GPU kernels are compiled in");
      } else if (!row) {
        entry["problem"] = "no kernels for compute capability " + cc;
        add("gpu_unsupported", Severity::Warning,
            fmt::format("{}: anvil has no kernels for compute capability {} (it has them for {}); it runs on the CPU",
                        label, cc, supported),
            "serve with --device cpu, or use a GPU of a supported generation");
      } else if (std::find(in_.cuda_targets.begin(), in_.cuda_targets.end(), row->target) == in_.cuda_targets.end()) {
        entry["problem"] = "this build has no " + row->target + " code";
        add("gpu_target_missing", Severity::Warning,
            fmt::format("{}: this anvil build has no {} code (built for: {})", label, row->target,
                        fmt::format("{}", fmt::join(in_.cuda_targets, ", "))),
            "rebuild with -DANVIL_CUDA_TARGETS including " + row->target);
      } else {
        json ops = json::object();
        for (const auto& op : row->ops) ops[op.op] = op.family;
        entry["kernels"] = {{"target", row->target}, {"ops", ops}};
      }
      if (gpu.free_known && gpu.total_memory > gpu.free_memory) {
        const uint64_t used = gpu.total_memory - gpu.free_memory;
        if (used > std::max<uint64_t>(2 * kGiB, gpu.total_memory / 20))
          add("gpu_memory_in_use", Severity::Warning,
              fmt::format("{}: {} of {} is already in use by other processes", label, gib(used), gib(gpu.total_memory)),
              "`nvidia-smi` lists the processes; stop stale servers and containers (see below) before serving");
      }
      gpus.push_back(entry);
    }
    report_.json["gpus"] = gpus;

    json table = json::array();
    for (const auto& row : in_.kernel_table) {
      json ops = json::object();
      for (const auto& op : row.ops) ops[op.op] = op.family;
      table.push_back({{"compute_capability", cc_text(row.major, row.minor)},
                       {"gpus", row.gpus},
                       {"target", row.target},
                       {"compiled", std::find(in_.cuda_targets.begin(), in_.cuda_targets.end(), row.target) !=
                                        in_.cuda_targets.end()},
                       {"ops", ops}});
    }
    report_.json["kernel_table"] = table;

    if (probe.gpus.empty()) {
      if (!probe.driver_problem) {
        add("no_gpu", Severity::Info, "no GPU: " + probe.status + "; anvil runs on the CPU");
      } else {
        add("gpu_driver", Severity::Warning, probe.status,
            "check the driver with `nvidia-smi`; a driver/library version mismatch needs a reboot or a reinstall");
      }
    }
    if (in_.cuda_compiled_in && probe.cuda_driver_version > 0 && in_.cuda_build_version > 0 &&
        probe.cuda_driver_version < in_.cuda_build_version) {
      add("driver_too_old", Severity::Warning,
          fmt::format("the NVIDIA driver supports CUDA {} but this anvil was built with CUDA {}: its GPU kernels will "
                      "not load",
                      cuda_version_text(probe.cuda_driver_version), cuda_version_text(in_.cuda_build_version)),
          fmt::format("install a driver that supports CUDA {}{}", cuda_version_text(in_.cuda_build_version),
                      in_.cuda_build_version >= 13000 ? " (R580 or newer)" : ""));
    }
  }

  void model() {
    if (!options_.model_dir) return;
    const fs::path dir = *options_.model_dir;
    json model = {{"path", dir.string()}};
    std::error_code ec;
    if (wsl_.detected) {
      const std::string absolute = fs::absolute(dir, ec).string();
      if (absolute.size() >= 7 && absolute.rfind("/mnt/", 0) == 0 && std::isalpha(static_cast<unsigned char>(absolute[5])) &&
          absolute[6] == '/')
        add("wsl_windows_drive", Severity::Warning,
            "the checkpoint is on a Windows drive (" + absolute + "): WSL2 reads it through 9P, many times slower than "
            "its own disk",
            "copy it into the Linux filesystem (e.g. ~/models) and serve it from there");
    }
    if (!fs::is_directory(dir, ec)) {
      add("model_unreadable", Severity::Error,
          fmt::format("--model {}: {}", dir.string(), fs::exists(dir, ec) ? "not a directory" : "no such directory"),
          "pass the checkpoint's directory (the one holding config.json)");
      report_.json["model"] = model;
      return;
    }
    uint64_t checkpoint = 0;
    bool estimated = false;
    std::optional<uint64_t> weights;
    try {
      std::vector<std::string> missing;
      const auto files = safetensors_files(dir, &missing);
      for (const auto& file : files) checkpoint += fs::file_size(file, ec);
      if (files.empty() || !missing.empty()) {
        const ModelShape shape = read_model_shape(dir);
        checkpoint = estimate_weights(shape).checkpoint_total();  // the files' bytes, as the page cache holds them
        estimated = true;
      }
      weights = checkpoint;
    } catch (const Error& error) {
      add("model_unreadable", Severity::Error, fmt::format("--model {}: {}", dir.string(), error.what()),
          "pass a checkpoint directory with config.json (and its safetensors files)");
      report_.json["model"] = model;
      return;
    }
    model["checkpoint_bytes"] = checkpoint;
    model["estimated"] = estimated;
    report_.json["model"] = model;
    const std::string size_text =
        fmt::format("{:.1f} GB{}", double(checkpoint) / 1e9, estimated ? " (estimated from config.json)" : "");

    if (memory_ && memory_->usable() < checkpoint) {
      const bool cgroup = memory_->cgroup_limit && *memory_->cgroup_limit < memory_->total;
      std::string fix =
          "loading then reads the checkpoint from disk shard by shard instead of from the page cache, and takes "
          "minutes (a 75 GB checkpoint under a 53 GB WSL2 cap took 7-10 minutes): keep it on a fast local disk";
      if (const auto host_ram = wsl_host_ram_estimate()) {
        const uint64_t safe = wsl_safe_cap(*host_ram);
        if (safe >= checkpoint) fix += fmt::format(", or raise the WSL2 cap to memory={}GB in .wslconfig", safe / kGiB);
      } else if (cgroup) {
        fix += ", or raise the container's memory limit";
      }
      fix += ", or add RAM";
      add("ram_smaller_than_checkpoint", Severity::Warning,
          fmt::format("host RAM{} {} is smaller than the checkpoint {} in {}",
                      cgroup ? " (this cgroup's limit)" : wsl_.detected ? " (the WSL2 cap)" : "", gib(memory_->usable()),
                      size_text, dir.string()),
          fix);
    }
    if (weights && !in_.gpus.gpus.empty()) {
      uint64_t largest = 0;
      for (const auto& gpu : in_.gpus.gpus) largest = std::max(largest, gpu.total_memory);
      if (*weights > largest)
        add("model_exceeds_gpu", Severity::Warning,
            fmt::format("the weights ({}) are larger than the largest GPU's memory ({})", size_text, gib(largest)),
            "`anvil plan " + dir.string() + "` shows what fits; serve with --device cpu or on a larger GPU");
    }
  }

  void port() {
    sockets_ = listening_sockets(in_.paths);
    owners_ = socket_owners(in_.paths);
    processes_ = list_processes(in_.paths);
    json holders = json::array();
    std::set<int> held_ports;
    for (const auto& socket : sockets_) held_ports.insert(socket.port);
    std::vector<std::string> descriptions;
    std::set<int> seen_pids;
    bool unknown_owner = false;
    for (const auto& socket : sockets_) {
      if (socket.port != options_.port) continue;
      const auto owner = owners_.find(socket.inode);
      json holder = {{"address", socket.address}, {"pid", nullptr}, {"command", nullptr}};
      if (owner == owners_.end()) {
        unknown_owner = true;
      } else {
        holder["pid"] = owner->second;
        const ProcessInfo* process = find_process(owner->second);
        if (process) holder["command"] = process->command_line();
        if (seen_pids.insert(owner->second).second)
          descriptions.push_back(fmt::format("pid {} ({})", owner->second,
                                             process ? shorten(process->command_line(), 100) : "unknown command"));
      }
      holders.push_back(holder);
    }
    report_.json["port"] = {{"port", options_.port}, {"free", holders.empty()}, {"holders", holders}};
    if (holders.empty()) {
      add("port_free", Severity::Info, fmt::format("port {} is free", options_.port));
      return;
    }
    int free_port = options_.port + 1;
    while (held_ports.count(free_port) && free_port < 65535) ++free_port;
    std::string who;
    for (const auto& d : descriptions) who += (who.empty() ? "" : ", ") + d;
    if (unknown_owner)
      who += std::string(who.empty() ? "" : ", and ") +
             "a process this user cannot see (another user's, or another container's)";
    std::string fix = descriptions.empty()
                          ? fmt::format("`sudo ss -ltnp 'sport = :{}'` names it; or serve on another port: anvil serve "
                                        "--port {}",
                                        options_.port, free_port)
                          : fmt::format("stop it if it is stale (kill {}), or serve on another port: anvil serve --port {}",
                                        *seen_pids.begin(), free_port);
    add("port_in_use", Severity::Error, fmt::format("port {} is already held by {}", options_.port, who), fix);
  }

  const ProcessInfo* find_process(int pid) const {
    for (const auto& process : processes_)
      if (process.pid == pid) return &process;
    return nullptr;
  }

  void servers() {
    json list = json::array();
    for (const auto& server : find_servers(processes_, in_.self_pid)) {
      std::set<int> ports;
      for (const auto& socket : sockets_) {
        const auto owner = owners_.find(socket.inode);
        if (owner != owners_.end() && owner->second == server.process.pid) ports.insert(socket.port);
      }
      std::string port_text;
      for (int p : ports) port_text += (port_text.empty() ? "" : ", ") + std::to_string(p);
      list.push_back({{"engine", server.engine},
                      {"pid", server.process.pid},
                      {"command", server.process.command_line()},
                      {"container", server.process.container.empty() ? json(nullptr) : json(server.process.container)},
                      {"ports", std::vector<int>(ports.begin(), ports.end())}});
      const std::string where = server.process.container.empty() ? "" : " in container " + server.process.container;
      add("server_running", Severity::Warning,
          fmt::format("{} server running: pid {}{}{}: {}", server.engine, server.process.pid, where,
                      port_text.empty() ? "" : ", listening on " + port_text, shorten(server.process.command_line())),
          fmt::format("if it is stale, stop it ({}): it holds GPU memory and its ports",
                      server.process.container.empty() ? "kill " + std::to_string(server.process.pid)
                                                       : "docker stop " + server.process.container));
    }
    report_.json["servers"] = list;
  }

  void docker() {
    const DockerInfo info = probe_docker(in_.env, in_.run);
    json containers = json::array();
    for (const auto& c : info.containers)
      containers.push_back({{"id", c.id.substr(0, 12)}, {"name", c.name}, {"image", c.image}, {"status", c.status}, {"gpus", c.gpus}});
    report_.json["docker"] = {{"present", info.present},
                              {"reachable", info.reachable},
                              {"problem", info.problem.empty() ? json(nullptr) : json(info.problem)},
                              {"containers", containers}};
    if (info.present && !info.problem.empty())
      add("docker_unreachable", Severity::Info, "docker is installed but its containers could not be listed: " + info.problem);
    for (const auto& c : info.containers) {
      if (!c.gpus) continue;
      add("container_gpu", Severity::Warning,
          fmt::format("container {} ({}, {}) has GPUs attached and holds GPU memory while it runs", c.name, c.image, c.status),
          "if it is left over from an earlier run, stop it: docker stop " + c.name);
    }
  }

  void environment() {
    const auto get = [&](const char* key) -> std::optional<std::string> {
      const auto it = in_.env.find(key);
      if (it == in_.env.end()) return std::nullopt;
      return it->second;
    };
    std::set<std::pair<int, int>> capabilities;
    for (const auto& gpu : in_.gpus.gpus) capabilities.insert({gpu.major, gpu.minor});
    const bool sm12x = std::any_of(capabilities.begin(), capabilities.end(), [](auto cc) { return cc.first == 12; });
    std::string suggestion = "12.0f on an RTX PRO 6000 / RTX 5090";
    if (!capabilities.empty()) suggestion = flashinfer_arch_for(capabilities.begin()->first, capabilities.begin()->second);

    if (const auto visible = get("CUDA_VISIBLE_DEVICES")) {
      const std::string v = lower(*visible);
      if (v.empty() || v == "-1" || v == "none" || v == "void")
        add("cuda_visible_devices", Severity::Warning, "CUDA_VISIBLE_DEVICES='" + *visible + "' hides every GPU",
            "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0)");
      else
        add("cuda_visible_devices", Severity::Info, "CUDA_VISIBLE_DEVICES='" + *visible + "': only those GPUs are listed");
    }

    if (const auto list = get("FLASHINFER_CUDA_ARCH_LIST")) {
      const auto entries = split_arch_list(*list);
      if (entries.size() > 1)
        add("flashinfer_arch_list", Severity::Warning,
            "FLASHINFER_CUDA_ARCH_LIST='" + *list + "' has " + std::to_string(entries.size()) +
                " values: `import flashinfer` fails with \"ValueError: too many values to unpack (expected 2)\"",
            "set exactly one value, the GPU's: FLASHINFER_CUDA_ARCH_LIST=" + suggestion);
      for (const auto& entry : entries) {
        const auto arch = parse_arch(entry);
        if (arch && arch->major == 12 && arch->suffix.empty())
          add("flashinfer_arch_suffix", Severity::Warning,
              "FLASHINFER_CUDA_ARCH_LIST names " + entry + " without the a/f suffix: FP4 kernels are then compiled for "
              "plain sm_" + std::to_string(arch->major) + std::to_string(arch->minor) +
                  " and fail (\"ptxas: Feature 'cvt.e2m1x2.f32' not supported on .target 'sm_120'\")",
              "FLASHINFER_CUDA_ARCH_LIST=" + flashinfer_arch_for(arch->major, arch->minor));
      }
      for (const auto& [major, minor] : capabilities) {
        const bool listed = std::any_of(entries.begin(), entries.end(), [&](const std::string& e) {
          const auto arch = parse_arch(e);
          return arch && arch->major == major && arch->minor == minor;
        });
        if (!listed && !entries.empty())
          add("flashinfer_arch_missing", Severity::Warning,
              "FLASHINFER_CUDA_ARCH_LIST='" + *list + "' does not include this GPU's compute capability " +
                  cc_text(major, minor) + ": FlashInfer builds no kernels for it",
              "FLASHINFER_CUDA_ARCH_LIST=" + flashinfer_arch_for(major, minor));
      }
    }

    if (const auto list = get("TORCH_CUDA_ARCH_LIST"); list && !capabilities.empty()) {
      std::vector<ArchEntry> entries;
      bool all_parsed = true;
      for (const auto& e : split_arch_list(*list)) {
        const auto arch = parse_arch(e);
        if (arch) entries.push_back(*arch);
        else all_parsed = false;  // named generations ("Hopper"): not judged
      }
      for (const auto& [major, minor] : capabilities) {
        if (!all_parsed) break;
        const bool covered = std::any_of(entries.begin(), entries.end(), [&](const ArchEntry& a) {
          if (a.major == major && a.minor == minor) return true;
          // PTX of an older generic target is JIT-compiled for newer GPUs.
          return a.ptx && a.suffix.empty() && std::make_pair(a.major, a.minor) <= std::make_pair(major, minor);
        });
        if (!covered)
          add("torch_arch_list", Severity::Warning,
              "TORCH_CUDA_ARCH_LIST='" + *list + "' has no entry for compute capability " + cc_text(major, minor) +
                  ": PyTorch extensions built from source (vLLM, FlashInfer, flash-attention) get no kernels for this "
                  "GPU (\"no kernel image is available for execution on the device\")",
              "add " + cc_text(major, minor) + " to TORCH_CUDA_ARCH_LIST, or unset it to build for the GPUs present");
      }
    }

    if (!sm12x) return;
    if (const auto backend = get("VLLM_ATTENTION_BACKEND")) {
      const std::string b = lower(*backend);
      if (b == "flash_attn" || b == "flash_attn_vllm_v1")
        add("vllm_attention_backend", Severity::Warning,
            "VLLM_ATTENTION_BACKEND=" + *backend + " on SM120: FlashAttention 2/3 do not target SM120, and gpt-oss "
            "(attention sinks) is rejected with \"sink setting not supported\"",
            "unset it (vLLM picks TRITON_ATTN on SM120) or set TRITON_ATTN; newer vLLM takes --attention-backend and "
            "ignores unknown variables");
      else if (b == "flashinfer")
        add("vllm_attention_backend", Severity::Warning,
            "VLLM_ATTENTION_BACKEND=FLASHINFER on SM120: FlashInfer before 0.6.16 has no attention sinks there, so "
            "gpt-oss is rejected with \"sink setting not supported\"",
            "use FlashInfer 0.6.16 or newer, or unset it / set TRITON_ATTN");
    }
    for (const char* key : {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
                            "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"}) {
      const auto value = get(key);
      if (!value || !truthy(*value)) continue;
      const bool sm90 = std::string(key).find("BF16") != std::string::npos;
      add("vllm_moe_backend", Severity::Warning,
          std::string(key) + "=" + *value + " on SM120 selects FlashInfer's " +
              (sm90 ? "SM90-only BF16 x MXFP4 CUTLASS MoE" : "SM100-only MXFP4 MoE") +
              (sm90 ? "" : ", which fails there (\"kernel requires 10.x architecture\")"),
          std::string("unset ") + key + ": on SM120 vLLM's MXFP4 MoE runs on Marlin");
    }
  }

  void finish() {
    int errors = 0, warnings = 0;
    json findings = json::array();
    for (const auto& f : report_.findings) {
      errors += f.severity == Severity::Error;
      warnings += f.severity == Severity::Warning;
      findings.push_back({{"id", f.id}, {"severity", severity_name(f.severity)}, {"message", f.message}, {"fix", f.fix}});
    }
    report_.json["findings"] = findings;
    report_.json["summary"] = {{"errors", errors}, {"warnings", warnings}};
    report_.json["status"] = errors ? "errors" : warnings ? "warnings" : "ok";
    report_.json["exit_code"] = report_.exit_code();
  }

  const DoctorInput& in_;
  const DoctorOptions& options_;
  DoctorReport report_;
  KernelInfo kernel_;
  std::optional<MemoryInfo> memory_;
  WslInfo wsl_;
  std::vector<ListeningSocket> sockets_;
  std::map<uint64_t, int> owners_;
  std::vector<ProcessInfo> processes_;
};

}  // namespace

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::Info: return "info";
    case Severity::Warning: return "warning";
    case Severity::Error: return "error";
  }
  return "info";
}

int DoctorReport::exit_code() const {
  int code = 0;
  for (const auto& f : findings) {
    if (f.severity == Severity::Error) return 2;
    if (f.severity == Severity::Warning) code = 1;
  }
  return code;
}

DoctorInput gather_doctor_input() {
  DoctorInput input;
  input.env = current_environment();
  input.self_pid = int(::getpid());
  input.gpus = probe_gpus();
  input.cuda_compiled_in = cuda::compiled_in();
  input.cuda_targets = cuda::compiled_targets();
  input.cuda_build_version = cuda::build_cuda_version();
  input.cublaslt = cuda::cublaslt_status();
  input.kernel_table = cuda::kernel_table();
  input.cpu_kernels = cpu_kernel_isa();
  input.cpu_threads = int(default_thread_pool().size());
  return input;
}

DoctorReport run_doctor(const DoctorInput& input, const DoctorOptions& options) { return Doctor(input, options).run(); }

std::string format_doctor_text(const DoctorReport& report) {
  const json& r = report.json;
  std::string out;
  const auto line = [&](const std::string& text) { out += text + "\n"; };
  const json& memory = r["host"]["memory"];
  std::string host = "Host: Linux " + r["host"]["kernel"].get<std::string>();
  if (!memory.is_null())
    host += fmt::format(", RAM {} ({} available{})", gib(memory["total_bytes"].get<uint64_t>()),
                        gib(memory["available_bytes"].get<uint64_t>()),
                        memory["cgroup_limit_bytes"].is_null()
                            ? ""
                            : ", cgroup limit " + gib(memory["cgroup_limit_bytes"].get<uint64_t>()));
  if (!r["host"]["wsl"].is_null()) host += fmt::format(", WSL{}", r["host"]["wsl"]["version"].get<int>());
  line(host);
  line(fmt::format("CPU: {} threads, kernels {}", r["cpu"]["threads"].get<int>(), r["cpu"]["kernels"].get<std::string>()));
  const json& cuda_info = r["cuda"];
  std::string targets;
  for (const auto& t : cuda_info["targets"]) targets += (targets.empty() ? "" : " ") + t.get<std::string>();
  line(cuda_info["compiled_in"].get<bool>()
           ? fmt::format("CUDA: built for {} (CUDA {})", targets,
                         cuda_info["build_version"].is_null() ? "?" : cuda_info["build_version"].get<std::string>())
           : "CUDA: not built in (CPU-only build)");
  if (!cuda_info["cublaslt"].is_null()) line("cuBLASLt: " + cuda_info["cublaslt"].get<std::string>());
  const json& driver = r["driver"];
  if (driver["loaded"].get<bool>())
    line(fmt::format("Driver: {}, CUDA {}", driver["version"].is_null() ? "version unknown" : driver["version"].get<std::string>(),
                     driver["cuda_version"].is_null() ? "?" : driver["cuda_version"].get<std::string>()));
  else
    line("Driver: none loaded (" + driver["status"].get<std::string>() + ")");
  if (r["gpus"].empty()) line("GPUs: none; anvil runs on the CPU");
  for (const auto& gpu : r["gpus"]) {
    line(fmt::format("GPU {}: {}, compute capability {}, {:.1f} GiB ({} free), {} SMs -> {}", gpu["index"].get<int>(),
                     gpu["name"].get<std::string>(), gpu["compute_capability"].get<std::string>(),
                     gpu["memory_gib"].get<double>(),
                     gpu["free_gib"].is_null() ? std::string("?") : fmt::format("{:.1f} GiB", gpu["free_gib"].get<double>()),
                     gpu["multiprocessors"].get<int>(),
                     gpu["kernels"].is_null() ? gpu.value("problem", std::string("no kernels"))
                                              : gpu["kernels"]["target"].get<std::string>() + " kernels"));
  }
  if (r["kernel_table"].empty()) {
    line("\nKernel table: none in this build (no CUDA)");
  } else {
    line("\nKernel table (exact compute capability -> kernels; anything else is refused):");
    size_t op_width = 0;  // the longest op name, so every family starts in one column
    for (const auto& row : r["kernel_table"])
      for (const auto& [op, family] : row["ops"].items()) op_width = std::max(op_width, op.size());
    for (const auto& row : r["kernel_table"]) {
      line(fmt::format("  {:<5} {:<8} {}{}", row["compute_capability"].get<std::string>(), row["target"].get<std::string>(),
                       row["gpus"].get<std::string>(), row["compiled"].get<bool>() ? "" : " (not in this build)"));
      for (const auto& [op, family] : row["ops"].items())
        line(fmt::format("        {:<{}} {}", op, op_width, family.get<std::string>()));
    }
  }
  line("\nChecks:");
  for (const auto& f : report.findings) {
    const char* tag = f.severity == Severity::Error ? "ERROR" : f.severity == Severity::Warning ? "WARN" : "info";
    line(fmt::format("  {:<6} {}", tag, f.message));
    if (!f.fix.empty()) line(fmt::format("         fix: {}", f.fix));
  }
  const int errors = r["summary"]["errors"].get<int>(), warnings = r["summary"]["warnings"].get<int>();
  line(fmt::format("\n{} error{}, {} warning{}", errors, errors == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s"));
  return out;
}

}  // namespace anvil::tools
