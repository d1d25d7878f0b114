#include "rig/state.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "rig/process.h"

namespace anvil::rig {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

fs::path backends_dir(const fs::path& state_dir) { return state_dir / "backends"; }

// Written to a temporary name and renamed, so a reader (or a rig killed mid-write) never sees half a file.
void write_json(const fs::path& path, const Json& value) {
  fs::create_directories(path.parent_path());
  const fs::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << value.dump(2) << "\n";
    if (!out) fail("{}: cannot write", temporary.string());
  }
  fs::rename(temporary, path);
}

std::optional<Json> read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  Json value = Json::parse(text.str(), nullptr, false);
  if (value.is_discarded() || !value.is_object()) return std::nullopt;
  return value;
}

bool same_process(pid_t pid, uint64_t start_time) {
  const auto now = process_start_time(pid);
  return pid > 0 && now && *now == start_time;
}

std::string pid_list(const std::set<pid_t>& pids) {
  std::string out;
  for (pid_t pid : pids) out += (out.empty() ? "" : " ") + std::to_string(pid);
  return out;
}

}  // namespace

void write_pid_record(const fs::path& state_dir, const PidRecord& record) {
  write_json(backends_dir(state_dir) / (record.name + ".json"),
             {{"name", record.name},
              {"pid", record.pid},
              {"start_time", record.start_time},
              {"token", record.token},
              {"port", record.port},
              {"rig_pid", getpid()}});
}

void remove_pid_record(const fs::path& state_dir, const std::string& name) {
  std::error_code ignored;
  fs::remove(backends_dir(state_dir) / (name + ".json"), ignored);
}

std::vector<std::string> clear_leftovers(const fs::path& state_dir, double grace_s) {
  std::vector<std::string> report;
  std::error_code error;
  if (!fs::is_directory(backends_dir(state_dir), error)) return report;
  std::set<pid_t> targets;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(backends_dir(state_dir), error)) {
    if (entry.path().extension() != ".json") continue;
    files.push_back(entry.path());
    const auto record = read_json(entry.path());
    if (!record) {
      report.push_back(fmt::format("removed unreadable pid file {}", entry.path().string()));
      continue;
    }
    const std::string name = record->value("name", std::string("?"));
    const pid_t pid = record->value("pid", 0);
    const uint64_t start_time = record->value("start_time", uint64_t(0));
    const std::string token = record->value("token", std::string());
    std::set<pid_t> ours;
    if (same_process(pid, start_time)) ours.insert(pid);
    else if (pid > 0 && process_start_time(pid))
      report.push_back(fmt::format("{}: pid {} from an earlier rig is now another process; left it alone", name, pid));
    if (!token.empty())
      for (pid_t found : processes_with_env(kTokenVariable, token))
        if (found != getpid()) ours.insert(found);
    if (!ours.empty()) {
      report.push_back(fmt::format("{}: stopping {} process(es) an earlier rig started (pids {}, port {})", name,
                                   ours.size(), pid_list(ours), record->value("port", 0)));
      targets.insert(ours.begin(), ours.end());
    }
  }
  // Remember each target's start time so a pid recycled while we wait is never signalled.
  std::vector<std::pair<pid_t, uint64_t>> live;
  for (pid_t pid : targets)
    if (auto start = process_start_time(pid)) live.emplace_back(pid, *start);
  for (const auto& [pid, start] : live) kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  auto remaining = [&] {
    return std::count_if(live.begin(), live.end(), [](const auto& p) { return same_process(p.first, p.second); });
  };
  while (remaining() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (remaining() > 0) {
    std::set<pid_t> stubborn;
    for (const auto& [pid, start] : live)
      if (same_process(pid, start)) {
        kill(pid, SIGKILL);
        stubborn.insert(pid);
      }
    report.push_back(fmt::format("SIGKILL to pids {} after {:.0f} s of SIGTERM", pid_list(stubborn), grace_s));
    for (int i = 0; i < 100 && remaining() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& file : files) fs::remove(file, error);
  return report;
}

void claim_state_dir(const fs::path& state_dir, const RigRecord& record) {
  bool alive = false;
  if (const auto other = read_rig_record(state_dir, &alive); other && alive && other->pid != getpid())
    fail("{}: another rig (pid {}, listening on {}:{}) uses this state dir; stop it or set state_dir", state_dir.string(),
         other->pid, other->host, other->port);
  write_json(state_dir / "rig.json", {{"pid", record.pid},
                                      {"start_time", record.start_time},
                                      {"host", record.host},
                                      {"port", record.port},
                                      {"log_dir", record.log_dir},
                                      {"config", record.config}});
}

void release_state_dir(const fs::path& state_dir) {
  // The record stays (ps and logs still find the log dir); only the pid is cleared.
  bool alive = false;
  if (auto record = read_rig_record(state_dir, &alive); record && record->pid == getpid()) {
    auto json = read_json(state_dir / "rig.json");
    (*json)["pid"] = 0;
    write_json(state_dir / "rig.json", *json);
  }
}

std::optional<RigRecord> read_rig_record(const fs::path& state_dir, bool* alive) {
  const auto json = read_json(state_dir / "rig.json");
  if (alive) *alive = false;
  if (!json) return std::nullopt;
  RigRecord record;
  record.pid = json->value("pid", 0);
  record.start_time = json->value("start_time", uint64_t(0));
  record.host = json->value("host", std::string("127.0.0.1"));
  record.port = json->value("port", 0);
  record.log_dir = json->value("log_dir", std::string());
  record.config = json->value("config", std::string());
  if (alive) *alive = same_process(record.pid, record.start_time);
  return record;
}

}  // namespace anvil::rig
