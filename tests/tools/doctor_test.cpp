// anvil doctor against fake hosts: a /proc and /sys tree, an environment, GPUs and a docker CLI
// made up per test, one test per warning; and the real binary on this machine.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "support/test_support.h"
#include "tools/doctor.h"
#include "tools/host_probe.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tools::Severity;

constexpr uint64_t kGiB = uint64_t(1) << 30;

// A host made of files: proc/, sys/ and a Windows users folder under one temp dir.
class FakeHost {
 public:
  FakeHost() {
    fs::create_directories(proc() / "sys/kernel");
    fs::create_directories(proc() / "net");
    fs::create_directories(sys());
    fs::create_directories(windows());
    kernel("6.1.0-18-amd64", "Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) #1 SMP");
    memory(64 * kGiB, 60 * kGiB);
    test::write_file(proc() / "net/tcp",
                     "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n");
    test::write_file(proc() / "net/tcp6",
                     "  sl  local_address                         remote_address                        st tx_queue "
                     "rx_queue tr tm->when retrnsmt   uid  timeout inode\n");
  }
  fs::path proc() const { return dir_.path() / "proc"; }
  fs::path sys() const { return dir_.path() / "sys"; }
  fs::path windows() const { return dir_.path() / "Users"; }
  fs::path root() const { return dir_.path(); }

  void kernel(const std::string& release, const std::string& version) {
    test::write_file(proc() / "sys/kernel/osrelease", release + "\n");
    test::write_file(proc() / "version", version + "\n");
  }
  void memory(uint64_t total, uint64_t available) {
    test::write_file(proc() / "meminfo", "MemTotal:       " + std::to_string(total / 1024) +
                                             " kB\nMemFree:         1000 kB\nMemAvailable:   " +
                                             std::to_string(available / 1024) + " kB\nSwapTotal:             0 kB\n");
  }
  // A LISTEN socket in /proc/net/tcp (address as the kernel prints it, e.g. 00000000 for 0.0.0.0).
  void listen(const std::string& hex_address, int port, uint64_t inode, bool ipv6 = false) {
    static int slot = 0;
    char line[512];
    std::snprintf(line, sizeof line,
                  "%4d: %s:%04X %s:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 %llu 1 "
                  "0000000000000000 100 0 0 10 0\n",
                  slot++, hex_address.c_str(), port, ipv6 ? "00000000000000000000000000000000" : "00000000",
                  (unsigned long long)inode);
    const fs::path file = proc() / (ipv6 ? "net/tcp6" : "net/tcp");
    test::write_file(file, test::read_file(file) + line);
  }
  void process(int pid, const std::vector<std::string>& argv, int ppid = 1, const std::string& cgroup = "0::/user.slice\n") {
    const fs::path dir = proc() / std::to_string(pid);
    fs::create_directories(dir / "fd");
    std::string cmdline;
    for (const auto& arg : argv) cmdline += arg + std::string(1, '\0');
    test::write_file(dir / "cmdline", cmdline);
    test::write_file(dir / "comm", fs::path(argv.front()).filename().string().substr(0, 15) + "\n");
    test::write_file(dir / "stat", std::to_string(pid) + " (" + fs::path(argv.front()).filename().string() + ") S " +
                                       std::to_string(ppid) + " 1 1 0 -1 4194560\n");
    test::write_file(dir / "cgroup", cgroup);
  }
  void owns_socket(int pid, int fd, uint64_t inode) {
    fs::create_symlink("socket:[" + std::to_string(inode) + "]", proc() / std::to_string(pid) / "fd" / std::to_string(fd));
  }

  tools::DoctorInput input() const {
    tools::DoctorInput in;
    in.paths.proc = proc();
    in.paths.sys = sys();
    in.paths.windows_users = windows();
    in.env = {{"PATH", (dir_.path() / "bin").string()}, {"HOME", "/home/user"}};
    in.self_pid = 999999;
    in.gpus.status = "no NVIDIA driver: cannot load libcuda.so.1";
    in.cuda_compiled_in = true;
    in.cuda_targets = {"sm_90a", "sm_120a"};
    in.cuda_build_version = 13000;
    const std::vector<cuda::OpKernel> ops = {{"linear_bf16", "mma.sync"}, {"attention", "paged flash-decoding"}};
    in.kernel_table = {{8, 0, "A100", "sm_80", ops},
                       {9, 0, "H100, H200", "sm_90a", ops},
                       {12, 0, "RTX PRO 6000 Blackwell, RTX 5090", "sm_120a", ops}};
    in.cpu_kernels = "avx2";
    in.cpu_threads = 2;
    return in;
  }

 private:
  test::TempDir dir_;
};

tools::GpuDevice gpu(int index, const std::string& name, int major, int minor, uint64_t total, uint64_t free) {
  tools::GpuDevice g;
  g.index = index;
  g.name = name;
  g.major = major;
  g.minor = minor;
  g.total_memory = total;
  g.free_memory = free;
  g.free_known = true;
  g.multiprocessors = 132;
  return g;
}

void with_gpus(tools::DoctorInput& in, std::vector<tools::GpuDevice> gpus) {
  in.gpus.driver_loaded = true;
  in.gpus.status = "ok";
  in.gpus.cuda_driver_version = 13000;
  in.gpus.gpus = std::move(gpus);
}

const tools::Finding* find(const tools::DoctorReport& report, const std::string& id) {
  for (const auto& f : report.findings)
    if (f.id == id) return &f;
  return nullptr;
}

std::string dump(const tools::DoctorReport& report) {
  std::string text;
  for (const auto& f : report.findings)
    text += std::string(tools::severity_name(f.severity)) + " " + f.id + ": " + f.message + " | " + f.fix + "\n";
  return text;
}

// Expects a finding of that id and severity whose message (and fix) hold every needle.
void expect_finding(const tools::DoctorReport& report, const std::string& id, Severity severity,
                    const std::vector<std::string>& needles) {
  const tools::Finding* f = find(report, id);
  ASSERT_NE(f, nullptr) << "no '" << id << "' in:\n" << dump(report);
  EXPECT_EQ(f->severity, severity) << dump(report);
  for (const auto& needle : needles)
    EXPECT_NE((f->message + " | " + f->fix).find(needle), std::string::npos)
        << "missing '" << needle << "' in: " << f->message << " | " << f->fix;
}

int warnings(const tools::DoctorReport& report) {
  return int(std::count_if(report.findings.begin(), report.findings.end(),
                           [](const tools::Finding& f) { return f.severity != Severity::Info; }));
}

TEST(Doctor, CleanHostWithoutGpuIsOk) {
  FakeHost host;
  const auto report = tools::run_doctor(host.input(), {});
  EXPECT_EQ(report.exit_code(), 0) << dump(report);
  EXPECT_EQ(warnings(report), 0) << dump(report);
  expect_finding(report, "no_gpu", Severity::Info, {"no NVIDIA driver", "CPU"});
  expect_finding(report, "port_free", Severity::Info, {"8000"});
  EXPECT_EQ(report.json.at("status"), "ok");
  EXPECT_EQ(report.json.at("host").at("memory").at("total_bytes").get<uint64_t>(), 64 * kGiB);
  EXPECT_TRUE(report.json.at("gpus").empty());
  EXPECT_EQ(report.json.at("kernel_table").size(), 3u);
  const std::string text = tools::format_doctor_text(report);
  EXPECT_NE(text.find("GPUs: none"), std::string::npos) << text;
  EXPECT_NE(text.find("0 errors, 0 warnings"), std::string::npos) << text;
}

// Every family in the kernel table starts in one column, however long the longest op name (the
// table's 22-character "attention_decode_block" once pushed its family out of line).
TEST(Doctor, KernelTableFamiliesLineUp) {
  FakeHost host;
  auto input = host.input();
  const std::vector<cuda::OpKernel> ops = {{"launch", "stream order"}, {"attention_decode_block", "8-warp blocks"}};
  input.kernel_table = {{8, 0, "A100", "sm_80", ops}};
  const std::string text = tools::format_doctor_text(tools::run_doctor(input, {}));
  const size_t launch = text.find("launch "), wide = text.find("attention_decode_block ");
  ASSERT_NE(launch, std::string::npos) << text;
  ASSERT_NE(wide, std::string::npos) << text;
  const size_t launch_family = text.find("stream order", launch), wide_family = text.find("8-warp blocks", wide);
  EXPECT_EQ(launch_family - text.rfind('\n', launch_family), wide_family - text.rfind('\n', wide_family)) << text;
}

TEST(Doctor, GpusWithTheirKernelsAndDriver) {
  FakeHost host;
  fs::create_directories(host.sys() / "module/nvidia");
  test::write_file(host.sys() / "module/nvidia/version", "580.65.06\n");
  auto in = host.input();
  with_gpus(in, {gpu(0, "NVIDIA H200", 9, 0, 141 * kGiB, 140 * kGiB)});
  const auto report = tools::run_doctor(in, {});
  EXPECT_EQ(report.exit_code(), 0) << dump(report);
  const json& g = report.json.at("gpus").at(0);
  EXPECT_EQ(g.at("compute_capability"), "9.0");
  EXPECT_EQ(g.at("kernels").at("target"), "sm_90a");
  EXPECT_EQ(g.at("kernels").at("ops").at("attention"), "paged flash-decoding");
  EXPECT_EQ(g.at("memory_total_bytes").get<uint64_t>(), 141 * kGiB);
  EXPECT_EQ(report.json.at("driver").at("version"), "580.65.06");
  EXPECT_EQ(report.json.at("driver").at("cuda_version"), "13.0");
  const std::string text = tools::format_doctor_text(report);
  EXPECT_NE(text.find("GPU 0: NVIDIA H200, compute capability 9.0, 141.0 GiB (140.0 GiB free), 132 SMs -> sm_90a"),
            std::string::npos)
      << text;
  // Where cuBLASLt stands is reported, and only when the build has CUDA.
  EXPECT_TRUE(report.json.at("cuda").at("cublaslt").is_null());
  in.cublaslt = "libcublasLt.so.13 (version 130100)";
  const auto with_lt = tools::run_doctor(in, {});
  EXPECT_EQ(with_lt.json.at("cuda").at("cublaslt"), "libcublasLt.so.13 (version 130100)");
  EXPECT_NE(tools::format_doctor_text(with_lt).find("cuBLASLt: libcublasLt.so.13 (version 130100)"), std::string::npos);
  EXPECT_EQ(text.find("cuBLASLt"), std::string::npos) << text;
  // The driver version also comes from /proc when /sys lacks it.
  FakeHost other;
  fs::create_directories(other.proc() / "driver/nvidia");
  test::write_file(other.proc() / "driver/nvidia/version",
                   "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build\nGCC version: 12\n");
  EXPECT_EQ(tools::nvidia_kernel_driver_version(other.input().paths).value_or(""), "575.57.08");
}

TEST(Doctor, GpuProblems) {
  FakeHost host;
  auto in = host.input();
  with_gpus(in, {gpu(0, "Tesla T4", 7, 5, 16 * kGiB, 15 * kGiB), gpu(1, "NVIDIA A100", 8, 0, 80 * kGiB, 40 * kGiB)});
  in.gpus.cuda_driver_version = 12080;
  const auto report = tools::run_doctor(in, {});
  EXPECT_EQ(report.exit_code(), 1);
  expect_finding(report, "gpu_unsupported", Severity::Warning, {"GPU 0", "7.5", "8.0, 9.0, 12.0", "--device cpu"});
  expect_finding(report, "gpu_target_missing", Severity::Warning, {"GPU 1", "sm_80", "-DANVIL_CUDA_TARGETS"});
  expect_finding(report, "gpu_memory_in_use", Severity::Warning, {"GPU 1", "40.0 GiB of 80.0 GiB", "nvidia-smi"});
  expect_finding(report, "driver_too_old", Severity::Warning, {"CUDA 12.8", "CUDA 13.0", "R580"});

  auto cpu_build = host.input();
  with_gpus(cpu_build, {gpu(0, "NVIDIA H200", 9, 0, 141 * kGiB, 140 * kGiB)});
  cpu_build.cuda_compiled_in = false;
  cpu_build.cuda_targets.clear();
  cpu_build.cuda_build_version = 0;
  cpu_build.kernel_table.clear();
  expect_finding(tools::run_doctor(cpu_build, {}), "no_cuda_build", Severity::Warning, {"without CUDA", "nvcc"});

  auto broken = host.input();
  broken.gpus.status = "the NVIDIA driver failed to start: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
  broken.gpus.driver_problem = true;
  expect_finding(tools::run_doctor(broken, {}), "gpu_driver", Severity::Warning, {"DRIVER_MISMATCH", "nvidia-smi"});
}

TEST(Doctor, RamSmallerThanCheckpoint) {
  FakeHost host;
  host.memory(2 * kGiB, 1 * kGiB);
  test::TempDir model;
  test::write_file(model.path() / "config.json", "{}");
  // A sparse 3 GiB file stands in for the checkpoint: only its size is read.
  test::write_file(model.path() / "model.safetensors", "");
  fs::resize_file(model.path() / "model.safetensors", 3 * kGiB);
  tools::DoctorOptions options;
  options.model_dir = model.path();
  const auto report = tools::run_doctor(host.input(), options);
  EXPECT_EQ(report.exit_code(), 1) << dump(report);
  expect_finding(report, "ram_smaller_than_checkpoint", Severity::Warning,
                 {"2.0 GiB", "3.2 GB", model.path().string(), "shard by shard", "add RAM"});
  EXPECT_EQ(report.json.at("model").at("checkpoint_bytes").get<uint64_t>(), 3 * kGiB);

  // A config-only directory: the plan's weight bytes stand in (gpt-oss-120b, about 65 GB).
  options.model_dir = fs::path(ANVIL_SOURCE_DIR) / "configs/gpt-oss-120b";
  host.memory(32 * kGiB, 30 * kGiB);
  expect_finding(tools::run_doctor(host.input(), options), "ram_smaller_than_checkpoint", Severity::Warning,
                 {"65.2 GB (estimated from config.json)"});

  // A cgroup limit below MemTotal is what counts.
  host.memory(64 * kGiB, 60 * kGiB);
  fs::create_directories(host.sys() / "fs/cgroup");
  test::write_file(host.sys() / "fs/cgroup/memory.max", std::to_string(16 * kGiB) + "\n");
  expect_finding(tools::run_doctor(host.input(), options), "ram_smaller_than_checkpoint", Severity::Warning,
                 {"cgroup", "16.0 GiB", "container's memory limit"});
  test::write_file(host.sys() / "fs/cgroup/memory.max", "max\n");
  options.model_dir = fs::path(ANVIL_SOURCE_DIR) / "configs/gpt-oss-20b";
  EXPECT_EQ(find(tools::run_doctor(host.input(), options), "ram_smaller_than_checkpoint"), nullptr);

  // A model the GPU cannot hold.
  auto in = host.input();
  with_gpus(in, {gpu(0, "NVIDIA GeForce RTX 5090", 12, 0, 32 * kGiB, 31 * kGiB)});
  options.model_dir = fs::path(ANVIL_SOURCE_DIR) / "configs/gpt-oss-120b";
  expect_finding(tools::run_doctor(in, options), "model_exceeds_gpu", Severity::Warning, {"32.0 GiB", "anvil plan"});

  options.model_dir = model.path() / "missing";
  const auto missing = tools::run_doctor(host.input(), options);
  EXPECT_EQ(missing.exit_code(), 2);
  expect_finding(missing, "model_unreadable", Severity::Error, {"missing", "no such directory"});
}

TEST(Doctor, Wsl2MemoryCapAndSafeValue) {
  FakeHost host;
  host.kernel("5.15.153.1-microsoft-standard-WSL2",
              "Linux version 5.15.153.1-microsoft-standard-WSL2 (root@941d701f84f1) (gcc (GCC) 11.2.0) #1 SMP");
  // The default cap, half of a 64 GB PC: MemTotal a little under 32 GiB.
  host.memory(32 * kGiB - 600 * (1 << 20), 30 * kGiB);
  const auto report = tools::run_doctor(host.input(), {});
  EXPECT_EQ(report.exit_code(), 1);
  expect_finding(report, "wsl_memory", Severity::Warning,
                 {"WSL2", "capped at 31.4 GiB", "about 64 GB", "memory=48GB", ".wslconfig", "wsl --shutdown"});
  EXPECT_EQ(report.json.at("host").at("wsl").at("version"), 2);

  // A checkpoint bigger than the cap: the fix names the safe cap when that would hold it.
  tools::DoctorOptions options;
  options.model_dir = fs::path(ANVIL_SOURCE_DIR) / "configs/gpt-oss-20b";
  host.memory(8 * kGiB - 300 * (1 << 20), 7 * kGiB);  // a 16 GB PC
  expect_finding(tools::run_doctor(host.input(), options), "ram_smaller_than_checkpoint", Severity::Warning,
                 {"WSL2 cap", "13.8 GB"});
  options.model_dir = fs::path(ANVIL_SOURCE_DIR) / "configs/gpt-oss-120b";
  host.memory(47 * kGiB, 45 * kGiB);  // a 96 GB PC: the safe cap, 72 GB, holds the 65 GB checkpoint
  expect_finding(tools::run_doctor(host.input(), options), "ram_smaller_than_checkpoint", Severity::Warning,
                 {"65.2 GB", "memory=72GB"});

  // An explicit memory= in .wslconfig: reported, not a warning.
  fs::create_directories(host.windows() / "alice");
  test::write_file(host.windows() / "alice/.wslconfig", "[wsl2]\nprocessors=8\nmemory=48GB  # for models\n");
  host.memory(48 * kGiB - 700 * (1 << 20), 45 * kGiB);
  const auto configured = tools::run_doctor(host.input(), {});
  expect_finding(configured, "wsl_memory", Severity::Info, {"memory=48GB", "alice"});
  EXPECT_EQ(configured.exit_code(), 0) << dump(configured);

  // A checkpoint on the Windows drive is read through 9P.
  const auto wsl = tools::detect_wsl(host.input().paths, tools::read_kernel(host.input().paths));
  ASSERT_EQ(wsl.configs.size(), 1u);
  EXPECT_EQ(wsl.configs[0].memory_bytes.value_or(0), 48 * kGiB);
  EXPECT_EQ(tools::parse_wsl_memory("512MB").value_or(0), 512u << 20);
  EXPECT_EQ(tools::parse_wsl_memory("\"1TB\"").value_or(0), 1024 * kGiB);
  EXPECT_FALSE(tools::parse_wsl_memory("lots").has_value());

  FakeHost wsl1;
  wsl1.kernel("4.4.0-19041-Microsoft", "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com)");
  expect_finding(tools::run_doctor(wsl1.input(), {}), "wsl1", Severity::Warning, {"WSL1", "--set-version"});
}

TEST(Doctor, WindowsDriveCheckpointUnderWsl) {
  FakeHost host;
  host.kernel("5.15.153.1-microsoft-standard-WSL2", "Linux version 5.15.153.1-microsoft-standard-WSL2");
  tools::DoctorOptions options;
  options.model_dir = "/mnt/c/models/gpt-oss-20b";
  // The path alone decides (it does not exist on this machine, which is an error of its own).
  const auto report = tools::run_doctor(host.input(), options);
  expect_finding(report, "wsl_windows_drive", Severity::Warning, {"/mnt/c/models/gpt-oss-20b", "9P", "~/models"});
  expect_finding(report, "model_unreadable", Severity::Error, {"/mnt/c/models"});
  options.model_dir = "/mnt/data/models";  // a Linux mount, not a drive letter
  EXPECT_EQ(find(tools::run_doctor(host.input(), options), "wsl_windows_drive"), nullptr);
}

TEST(Doctor, PortHeldAndByWhom) {
  FakeHost host;
  host.listen("00000000", 8000, 4242);  // 0.0.0.0:8000
  host.process(1234, {"/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"});
  host.owns_socket(1234, 7, 4242);
  const auto report = tools::run_doctor(host.input(), {});
  EXPECT_EQ(report.exit_code(), 2) << dump(report);
  expect_finding(report, "port_in_use", Severity::Error,
                 {"port 8000", "pid 1234", "vllm.entrypoints.openai.api_server", "kill 1234", "--port 8001"});
  const json& port = report.json.at("port");
  EXPECT_FALSE(port.at("free").get<bool>());
  EXPECT_EQ(port.at("holders").at(0).at("address"), "0.0.0.0");
  EXPECT_EQ(port.at("holders").at(0).at("pid"), 1234);
  // The same process is a running server, listening on 8000.
  expect_finding(report, "server_running", Severity::Warning, {"vLLM", "pid 1234", "listening on 8000"});

  // Another port is free; the suggested free port skips held ones.
  tools::DoctorOptions other;
  other.port = 9000;
  const auto free = tools::run_doctor(host.input(), other);
  EXPECT_EQ(find(free, "port_in_use"), nullptr);
  EXPECT_EQ(free.exit_code(), 1);  // the vLLM server is still there

  // IPv6 and an owner this user cannot see.
  FakeHost v6;
  v6.listen("00000000000000000000000000000000", 8000, 777, true);  // [::]:8000
  v6.listen("00000000", 8001, 778);
  const auto hidden = tools::run_doctor(v6.input(), {});
  expect_finding(hidden, "port_in_use", Severity::Error, {"cannot see", "ss -ltnp", "--port 8002"});
  EXPECT_EQ(hidden.json.at("port").at("holders").at(0).at("address"), "::");

  const auto sockets = tools::listening_sockets(host.input().paths);
  ASSERT_EQ(sockets.size(), 1u);
  EXPECT_EQ(sockets[0].port, 8000);
  EXPECT_EQ(sockets[0].inode, 4242u);
}

TEST(Doctor, ListeningAddressesDecode) {
  FakeHost host;
  host.listen("0100007F", 8080, 1);                                  // 127.0.0.1
  host.listen("00000000000000000000000001000000", 8081, 2, true);    // ::1
  const auto sockets = tools::listening_sockets(host.input().paths);
  ASSERT_EQ(sockets.size(), 2u);
  EXPECT_EQ(sockets[0].address, "127.0.0.1");
  EXPECT_EQ(sockets[0].port, 8080);
  EXPECT_EQ(sockets[1].address, "::1");
}

TEST(Doctor, StaleServers) {
  FakeHost host;
  host.process(100, {"/usr/local/bin/llama-server", "-m", "model.gguf", "--port", "8080"});
  host.process(200, {"/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B"}, 1,
               "0::/system.slice/docker-3f2a9c81d4e5b6a7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1.scope\n");
  host.process(201, {"sglang::scheduler"}, 200);  // a worker of the server above: not listed again
  host.process(300, {"/opt/anvil/build/anvil", "serve", "/models/gpt-oss-20b", "--port", "8001"});
  host.process(400, {"/usr/bin/python3", "/usr/local/bin/vllm", "serve", "openai/gpt-oss-120b"});
  host.process(401, {"VLLM::EngineCore"}, 400);
  host.process(500, {"grep", "vllm"});                         // mentions vllm, is no server
  host.process(600, {"/usr/bin/vim", "sglang/launch.py"});
  host.process(700, {"/opt/anvil/build/anvil", "doctor"});     // an anvil that is not serving
  host.process(800, {"/opt/anvil/build/anvil", "serve", "x"});  // this process itself
  host.listen("00000000", 8080, 55);
  host.owns_socket(100, 3, 55);
  auto in = host.input();
  in.self_pid = 800;
  const auto report = tools::run_doctor(in, {});
  const json& servers = report.json.at("servers");
  ASSERT_EQ(servers.size(), 4u) << servers.dump(2);
  EXPECT_EQ(servers[0].at("engine"), "llama.cpp");
  EXPECT_EQ(servers[0].at("ports"), json::array({8080}));
  EXPECT_EQ(servers[1].at("engine"), "SGLang");
  EXPECT_EQ(servers[1].at("container"), "3f2a9c81d4e5");
  EXPECT_EQ(servers[2].at("engine"), "anvil");
  EXPECT_EQ(servers[3].at("engine"), "vLLM");
  EXPECT_EQ(report.exit_code(), 1);
  int running = 0;
  for (const auto& f : report.findings) running += f.id == "server_running";
  EXPECT_EQ(running, 4);
  expect_finding(report, "server_running", Severity::Warning, {"llama.cpp", "pid 100", "listening on 8080", "kill 100"});
  bool container_fix = false;
  for (const auto& f : report.findings) container_fix |= f.fix.find("docker stop 3f2a9c81d4e5") != std::string::npos;
  EXPECT_TRUE(container_fix) << dump(report);
}

// A docker CLI that answers like the real one, written as a shell script on the fake PATH.
void fake_docker(const FakeHost& host, const std::string& body) {
  fs::create_directories(host.root() / "bin");
  const fs::path script = host.root() / "bin/docker";
  test::write_file(script, "#!/bin/sh\n" + body);
  fs::permissions(script, fs::perms::owner_all);
}

TEST(Doctor, LeftoverContainersHoldingGpus) {
  FakeHost host;
  fake_docker(host, R"(case "$1" in
  ps) printf 'aaaa1111bbbb2222cccc\tvllm-old\tvllm/vllm-openai:latest\tUp 3 days\n'
      printf 'dddd3333eeee4444ffff\tredis\tredis:7\tUp 3 days\n' ;;
  inspect) printf 'aaaa1111bbbb2222cccc\t[{"Driver":"","Count":-1,"DeviceIDs":null,"Capabilities":[["gpu"]],"Options":{}}]\trunc\n'
      printf 'dddd3333eeee4444ffff\tnull\trunc\n' ;;
esac
)");
  const auto report = tools::run_doctor(host.input(), {});
  EXPECT_EQ(report.exit_code(), 1) << dump(report);
  expect_finding(report, "container_gpu", Severity::Warning, {"vllm-old", "vllm/vllm-openai:latest", "docker stop vllm-old"});
  int gpu_containers = 0;
  for (const auto& f : report.findings) gpu_containers += f.id == "container_gpu";
  EXPECT_EQ(gpu_containers, 1);
  const json& docker = report.json.at("docker");
  EXPECT_TRUE(docker.at("reachable").get<bool>());
  ASSERT_EQ(docker.at("containers").size(), 2u);
  EXPECT_FALSE(docker.at("containers")[1].at("gpus").get<bool>());

  // The nvidia runtime counts as GPUs too.
  fake_docker(host, R"(case "$1" in
  ps) printf 'abc\tollama\tollama/ollama\tUp 1 hour\n' ;;
  inspect) printf 'abc\tnull\tnvidia\n' ;;
esac
)");
  expect_finding(tools::run_doctor(host.input(), {}), "container_gpu", Severity::Warning, {"ollama"});

  // No daemon: said, not warned about.
  fake_docker(host, "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n");
  const auto no_daemon = tools::run_doctor(host.input(), {});
  EXPECT_EQ(no_daemon.exit_code(), 0) << dump(no_daemon);
  expect_finding(no_daemon, "docker_unreachable", Severity::Info, {"Cannot connect to the Docker daemon"});

  // A docker that hangs is cut off.
  fake_docker(host, "while :; do :; done\n");
  auto in = host.input();
  in.run = [](const std::vector<std::string>& argv, const tools::Environment& env, double) {
    return tools::run_command(argv, env, 0.5);
  };
  expect_finding(tools::run_doctor(in, {}), "docker_unreachable", Severity::Info, {"timed out"});

  // No docker on PATH: nothing about docker at all.
  FakeHost bare;
  const auto none = tools::run_doctor(bare.input(), {});
  EXPECT_FALSE(none.json.at("docker").at("present").get<bool>());
  EXPECT_EQ(find(none, "docker_unreachable"), nullptr);
}

TEST(Doctor, EnvironmentThatBreaksOtherEngines) {
  FakeHost host;
  auto in = host.input();
  with_gpus(in, {gpu(0, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 12, 0, 96 * kGiB, 95 * kGiB)});

  auto multi = in;
  multi.env["FLASHINFER_CUDA_ARCH_LIST"] = "12.0f;12.1a";
  const auto multi_report = tools::run_doctor(multi, {});
  EXPECT_EQ(multi_report.exit_code(), 1);
  expect_finding(multi_report, "flashinfer_arch_list", Severity::Warning,
                 {"2 values", "too many values to unpack", "FLASHINFER_CUDA_ARCH_LIST=12.0f"});

  auto no_suffix = in;
  no_suffix.env["FLASHINFER_CUDA_ARCH_LIST"] = "12.0";
  expect_finding(tools::run_doctor(no_suffix, {}), "flashinfer_arch_suffix", Severity::Warning,
                 {"12.0 without the a/f suffix", "cvt.e2m1x2", "FLASHINFER_CUDA_ARCH_LIST=12.0f"});
  auto good = in;
  good.env["FLASHINFER_CUDA_ARCH_LIST"] = "12.0f";
  good.env["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0;12.0";
  good.env["VLLM_ATTENTION_BACKEND"] = "TRITON_ATTN";
  const auto good_report = tools::run_doctor(good, {});
  EXPECT_EQ(good_report.exit_code(), 0) << dump(good_report);

  auto missing_arch = in;
  missing_arch.env["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a";
  expect_finding(tools::run_doctor(missing_arch, {}), "flashinfer_arch_missing", Severity::Warning, {"12.0", "12.0f"});

  auto torch = in;
  torch.env["TORCH_CUDA_ARCH_LIST"] = "8.0 8.6 9.0";
  expect_finding(tools::run_doctor(torch, {}), "torch_arch_list", Severity::Warning,
                 {"'8.0 8.6 9.0'", "compute capability 12.0", "no kernel image", "add 12.0"});
  torch.env["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX";  // PTX runs on newer GPUs through the JIT
  EXPECT_EQ(find(tools::run_doctor(torch, {}), "torch_arch_list"), nullptr);
  torch.env["TORCH_CUDA_ARCH_LIST"] = "Hopper;123456789012345.0";  // names and garbage are not judged
  EXPECT_EQ(find(tools::run_doctor(torch, {}), "torch_arch_list"), nullptr);
  torch.env["FLASHINFER_CUDA_ARCH_LIST"] = "sm_99999999999999";
  EXPECT_EQ(find(tools::run_doctor(torch, {}), "flashinfer_arch_suffix"), nullptr);

  auto attention = in;
  attention.env["VLLM_ATTENTION_BACKEND"] = "FLASH_ATTN";
  expect_finding(tools::run_doctor(attention, {}), "vllm_attention_backend", Severity::Warning,
                 {"FLASH_ATTN", "SM120", "sink setting not supported", "TRITON_ATTN"});
  attention.env["VLLM_ATTENTION_BACKEND"] = "FLASHINFER";
  expect_finding(tools::run_doctor(attention, {}), "vllm_attention_backend", Severity::Warning, {"0.6.16"});

  auto moe = in;
  moe.env["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"] = "1";
  expect_finding(tools::run_doctor(moe, {}), "vllm_moe_backend", Severity::Warning,
                 {"SM100-only", "kernel requires 10.x architecture", "Marlin"});
  moe.env["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"] = "0";
  EXPECT_EQ(find(tools::run_doctor(moe, {}), "vllm_moe_backend"), nullptr);

  // On Hopper the SM120-only rules stay quiet.
  auto hopper = host.input();
  with_gpus(hopper, {gpu(0, "NVIDIA H200", 9, 0, 141 * kGiB, 140 * kGiB)});
  hopper.env["VLLM_ATTENTION_BACKEND"] = "FLASH_ATTN";
  hopper.env["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"] = "1";
  EXPECT_EQ(tools::run_doctor(hopper, {}).exit_code(), 0);

  // Without a GPU the rules that need none still apply.
  auto no_gpu = host.input();
  no_gpu.env["FLASHINFER_CUDA_ARCH_LIST"] = "12.0 12.1";
  const auto no_gpu_report = tools::run_doctor(no_gpu, {});
  expect_finding(no_gpu_report, "flashinfer_arch_list", Severity::Warning, {"2 values"});
  expect_finding(no_gpu_report, "flashinfer_arch_suffix", Severity::Warning, {"12.0 without", "12.0f"});

  auto hidden = host.input();
  hidden.env["CUDA_VISIBLE_DEVICES"] = "";
  expect_finding(tools::run_doctor(hidden, {}), "cuda_visible_devices", Severity::Warning, {"hides every GPU"});
}

TEST(Doctor, JsonIsTheWholeReport) {
  FakeHost host;
  host.listen("00000000", 8000, 1);
  const auto report = tools::run_doctor(host.input(), {});
  const json& j = report.json;
  for (const char* key : {"host", "cpu", "cuda", "driver", "gpus", "kernel_table", "port", "servers", "docker",
                          "findings", "summary", "status", "exit_code"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.at("exit_code"), 2);
  EXPECT_EQ(j.at("status"), "errors");
  EXPECT_EQ(j.at("summary").at("errors"), 1);
  const json& f = j.at("findings").at(0);
  for (const char* key : {"id", "severity", "message", "fix"}) EXPECT_TRUE(f.contains(key)) << key;
}

// The real binary, on this machine, run with a controlled environment and a port nothing holds.
// Warnings that legitimately exist on the host (a server another test started, a container) are
// allowed; the exit code must agree with the findings, and without a GPU doctor must say so.
struct BinaryResult {
  int exit_code = -1;
  std::string out, err;
};
BinaryResult run_binary(const std::string& args) {
  test::TempDir dir;
  const std::string command = "env -i PATH=/usr/bin:/bin HOME=/tmp '" + std::string(ANVIL_BINARY) + "' " + args + " >'" +
                              (dir.path() / "out").string() + "' 2>'" + (dir.path() / "err").string() + "' </dev/null";
  const int status = std::system(command.c_str());
  BinaryResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = test::read_file(dir.path() / "out");
  result.err = test::read_file(dir.path() / "err");
  return result;
}

int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

TEST(DoctorBinary, ThisMachine) {
  const int port = unused_port();
  const auto result = run_binary("doctor --json --port " + std::to_string(port));
  const json report = json::parse(result.out);  // stdout is exactly one JSON object
  EXPECT_EQ(result.err, "");
  const std::set<std::string> host_dependent = {"server_running", "container_gpu", "gpu_memory_in_use",
                                                "wsl_memory", "port_in_use"};
  int worst = 0;
  for (const auto& f : report.at("findings")) {
    const std::string severity = f.at("severity");
    if (severity == "info") continue;
    worst = std::max(worst, severity == "error" ? 2 : 1);
    EXPECT_TRUE(host_dependent.count(f.at("id").get<std::string>())) << f.dump();
  }
  EXPECT_EQ(result.exit_code, worst) << result.out;
  EXPECT_EQ(report.at("exit_code"), worst);
  if (report.at("gpus").empty()) {
    bool says_no_gpu = false;
    for (const auto& f : report.at("findings")) says_no_gpu |= f.at("id") == "no_gpu";
    EXPECT_TRUE(says_no_gpu) << result.out;
    // With nothing legitimately wrong on this host, no GPU is no problem.
    if (worst == 0) {
      EXPECT_EQ(result.exit_code, 0);
    }
  }

  // The text run sees the host a moment later (servers of other tests may have come or gone), so
  // its exit code is checked against its own findings.
  const auto text = run_binary("doctor --port " + std::to_string(port));
  const int text_worst = text.out.find("  ERROR ") != std::string::npos  ? 2
                         : text.out.find("  WARN ") != std::string::npos ? 1
                                                                         : 0;
  EXPECT_EQ(text.exit_code, text_worst) << text.out;
  if (report.at("gpus").empty()) {
    EXPECT_NE(text.out.find("GPUs: none"), std::string::npos) << text.out;
  }
  EXPECT_NE(text.out.find("Checks:"), std::string::npos) << text.out;
}

TEST(DoctorBinary, FakeTreeThroughFlags) {
  FakeHost host;
  host.listen("0100007F", 8000, 31337);
  host.process(4321, {"/usr/bin/llama-server", "--port", "8000"});
  host.owns_socket(4321, 9, 31337);
  const std::string roots = " --proc-root '" + host.proc().string() + "' --sys-root '" + host.sys().string() +
                            "' --windows-users-dir '" + host.windows().string() + "'";
  const auto result = run_binary("doctor" + roots);
  EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
  EXPECT_NE(result.out.find("port 8000 is already held by pid 4321 (/usr/bin/llama-server --port 8000)"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("llama.cpp server running: pid 4321"), std::string::npos) << result.out;
  const auto json_result = run_binary("doctor --json --port 8001" + roots);
  EXPECT_EQ(json_result.exit_code, 1);
  EXPECT_EQ(json::parse(json_result.out).at("status"), "warnings");
  EXPECT_NE(run_binary("doctor --port 0").exit_code, 0) << "an out-of-range port is refused";
}

}  // namespace
}  // namespace anvil
