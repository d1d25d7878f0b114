#include "rig/supervisor.h"

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "rig/process.h"
#include "rig/recipes.h"
#include "rig/state.h"
#include "server/log.h"

extern char** environ;

namespace anvil::rig {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using server::log_error;
using server::log_info;
using server::log_warning;

const char* state_name(BackendState state) {
  switch (state) {
    case BackendState::Stopped: return "stopped";
    case BackendState::Starting: return "starting";
    case BackendState::Ready: return "ready";
    case BackendState::Draining: return "draining";
    case BackendState::Stopping: return "stopping";
    case BackendState::Failed: return "failed";
  }
  return "stopped";
}

struct Supervisor::Backend {
  const ModelConfig* config = nullptr;
  fs::path log;
  BackendState state = BackendState::Stopped;
  pid_t pid = 0;
  int port = 0;
  std::string token;
  Clock::time_point started_at, ready_at, last_used, deadline, drain_since, next_probe;
  bool killed = false;            // SIGKILL already sent in this stop
  bool restart_pending = false;   // crashed while serving: comes back after the backoff
  bool preload = false;           // started at boot: wanted without a waiter
  bool swap_in = false;           // the next start replaces another member of the group
  Clock::time_point restart_at;
  int crash_streak = 0;
  int waiting = 0, in_flight = 0;
  uint64_t starts = 0, crashes = 0, restarts = 0, swaps = 0, start_failures = 0;
  std::string last_error, last_probe;
  Clock::time_point first_waiter;
  bool active() const {
    return state == BackendState::Starting || state == BackendState::Ready || state == BackendState::Draining ||
           state == BackendState::Stopping;
  }
};

namespace {

std::string substitute(std::string text, const std::string& key, const std::string& value) {
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
    text.replace(at, key.size(), value);
  return text;
}

std::string last_log_line(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - 4096));
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  const size_t newline = tail.rfind('\n');
  return newline == std::string::npos ? tail : tail.substr(newline + 1);
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// 1 s after the first crash, doubling to 30 s, so a backend that dies at once does not spin.
Clock::duration backoff(int streak) {
  return std::chrono::seconds(std::min(30, 1 << std::min(streak - 1, 5)));
}

}  // namespace

Supervisor::Supervisor(const RigConfig& config) : config_(config) {
  for (const auto& model : config_.models) {
    auto backend = std::make_unique<Backend>();
    backend->config = &model;
    backend->log = config_.log_dir / (model.name + ".log");
    backend->preload = model.preload;
    backends_.push_back(std::move(backend));
  }
}

Supervisor::~Supervisor() { shutdown(); }

std::vector<std::string> Supervisor::start() {
  fs::create_directories(config_.log_dir);
  fs::create_directories(config_.state_dir);
  auto report = clear_leftovers(config_.state_dir, config_.stop_timeout_s);
  monitor_ = std::thread([this] { monitor(); });
  return report;
}

void Supervisor::shutdown() {
  {
    std::unique_lock lock(mutex_);
    if (stopping_ || !monitor_.joinable()) return;
    stopping_ = true;
  }
  changed_.notify_all();
  monitor_.join();
}

Supervisor::Lease::~Lease() {
  {
    const std::lock_guard lock(owner_.mutex_);
    Backend& backend = *owner_.backends_[index_];
    --backend.in_flight;
    backend.last_used = Clock::now();
  }
  owner_.changed_.notify_all();
}

std::unique_ptr<Supervisor::Lease> Supervisor::acquire(const ModelConfig& model) {
  std::unique_lock lock(mutex_);
  const size_t index = size_t(&model - config_.models.data());
  Backend& backend = *backends_[index];
  if (backend.state == BackendState::Ready) {
    ++backend.in_flight;
    backend.last_used = Clock::now();
    return std::make_unique<Lease>(*this, index, backend.port);
  }
  if (stopping_) throw BackendUnavailable(503, "the rig is shutting down");
  if (backend.waiting >= config_.max_waiting)
    throw BackendUnavailable(503, fmt::format("model {} is {} and {} requests already wait for it (queue.max_waiting)",
                                              model.name, state_name(backend.state), backend.waiting));
  if (backend.waiting == 0) backend.first_waiter = Clock::now();
  ++backend.waiting;
  const uint64_t failures_seen = backend.start_failures;
  const auto joined = Clock::now();
  // Long enough for the member in the way to drain and stop, then for this one to start.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                           model.start_timeout_s + config_.drain_timeout_s + config_.stop_timeout_s + 5));
  changed_.notify_all();
  for (;;) {
    if (backend.state == BackendState::Ready) {
      --backend.waiting;
      ++backend.in_flight;
      backend.last_used = Clock::now();
      changed_.notify_all();
      return std::make_unique<Lease>(*this, index, backend.port);
    }
    // A failed start answers every request that waited for it (fail_start already emptied the
    // queue, so they do not trigger another start on their way out).
    if (backend.start_failures > failures_seen) throw BackendUnavailable(503, backend.last_error);
    if (stopping_ || Clock::now() >= deadline) {
      --backend.waiting;
      changed_.notify_all();
      if (stopping_) throw BackendUnavailable(503, "the rig is shutting down");
      throw BackendUnavailable(504, fmt::format("model {} was not ready after {:.0f} s of waiting (state {}; {})", model.name,
                                                seconds(Clock::now() - joined), state_name(backend.state),
                                                backend.last_probe.empty() ? "no probe yet" : "last probe: " + backend.last_probe));
    }
    changed_.wait_until(lock, deadline);
  }
}

std::vector<BackendStatus> Supervisor::status() const {
  const std::lock_guard lock(mutex_);
  std::vector<BackendStatus> out;
  const auto now = Clock::now();
  for (const auto& backend : backends_) {
    BackendStatus status;
    status.name = backend->config->name;
    status.group = backend->config->group;
    status.state = backend->state;
    status.port = backend->active() ? backend->port : 0;
    status.pid = backend->active() ? backend->pid : 0;
    if (backend->state == BackendState::Ready || backend->state == BackendState::Draining)
      status.uptime_s = seconds(now - backend->ready_at);
    status.last_error = backend->last_error;
    status.starts = backend->starts;
    status.crashes = backend->crashes;
    status.restarts = backend->restarts;
    status.swaps = backend->swaps;
    status.start_failures = backend->start_failures;
    status.waiting = backend->waiting;
    status.in_flight = backend->in_flight;
    status.log = backend->log.string();
    out.push_back(std::move(status));
  }
  return out;
}

void Supervisor::write_pid_file(const Backend& backend) const {
  PidRecord record;
  record.name = backend.config->name;
  record.pid = backend.pid;
  record.start_time = process_start_time(backend.pid).value_or(0);
  record.token = backend.token;
  record.port = backend.port;
  write_pid_record(config_.state_dir, record);
}

void Supervisor::remove_pid_file(const Backend& backend) const { remove_pid_record(config_.state_dir, backend.config->name); }

void Supervisor::fail_start(Backend& backend, const std::string& reason) {
  backend.state = BackendState::Failed;
  backend.last_error = reason;
  backend.preload = false;
  backend.swap_in = false;
  backend.waiting = 0;
  ++backend.start_failures;
  if (backend.restart_pending) {
    ++backend.crash_streak;
    backend.restart_at = Clock::now() + backoff(backend.crash_streak);
  }
  log_error("{}", reason);
  changed_.notify_all();
}

void Supervisor::launch(Backend& backend, bool swap_in) {
  const ModelConfig& model = *backend.config;
  const std::string host = "127.0.0.1";
  int port = 0;
  if (model.port) {
    port = *model.port;
    if (!port_free(host, port)) {
      const auto holder = port_holder(port);
      std::string who = "a process this rig cannot see (another user's, or one not yet listening)";
      if (holder && holder->pid > 0) who = fmt::format("pid {} ({})", holder->pid, holder->cmdline);
      return fail_start(backend, fmt::format("model {} cannot start: port {} is held by another process, {}, which "
                                             "this rig did not start; stop it or change models.{}.port in {}",
                                             model.name, port, who, model.name, config_.file.string()));
    }
  } else if ((port = pick_free_port(host)) == 0) {
    return fail_start(backend, fmt::format("model {} cannot start: no free port on {}", model.name, host));
  }

  auto expand = [&](const std::string& text) {
    return substitute(substitute(substitute(text, "${PORT}", std::to_string(port)), "${MODEL}", model.model), "${NAME}",
                      model.name);
  };
  SpawnSpec spec;
  if (model.engine == EngineKind::Anvil) {
    const fs::path binary = config_.anvil_binary.empty() ? fs::read_symlink("/proc/self/exe") : config_.anvil_binary;
    spec.argv = {binary.string(), "serve", model.model, "--host", host, "--port", std::to_string(port), "--served-model-name", model.name};
    spec.argv.insert(spec.argv.end(), model.aliases.begin(), model.aliases.end());
  } else {
    for (const auto& arg : model.command) spec.argv.push_back(expand(arg));
  }
  for (const auto& arg : model.args) spec.argv.push_back(expand(arg));

  std::map<std::string, std::string> env;
  for (char** var = environ; *var; ++var) {
    const std::string text = *var;
    const size_t eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  for (const auto& [name, value] : model.env) env[name] = expand(value);
  if (!model.cuda_visible_devices.empty()) env["CUDA_VISIBLE_DEVICES"] = model.cuda_visible_devices;
  if (const Recipe* recipe = model.recipe.empty() ? nullptr : find_recipe(model.recipe); recipe && !recipe->python_startup.empty()) {
    const fs::path dir = config_.state_dir / "python" / recipe->name;
    fs::create_directories(dir);
    std::ofstream(dir / "sitecustomize.py") << "# Written by anvil rig for recipe " << recipe->name << ".\n"
                                            << recipe->python_startup;
    const auto old = env.find("PYTHONPATH");
    env["PYTHONPATH"] = dir.string() + (old != env.end() && !old->second.empty() ? ":" + old->second : "");
  }
  backend.token = random_token();
  env[kTokenVariable] = backend.token;
  for (const auto& [name, value] : env) spec.env.push_back(name + "=" + value);
  spec.cwd = model.cwd;
  spec.log = backend.log;

  {
    std::ofstream header(backend.log, std::ios::app);
    std::string line;
    for (const auto& arg : spec.argv) line += (line.empty() ? "" : " ") + arg;
    header << "--- anvil rig: starting " << model.name << " on port " << port << ": " << line << "\n";
  }
  try {
    backend.pid = spawn(spec);
  } catch (const std::exception& error) {
    return fail_start(backend, fmt::format("model {} cannot start: {}", model.name, error.what()));
  }
  backend.port = port;
  backend.state = BackendState::Starting;
  backend.killed = false;
  backend.started_at = Clock::now();
  backend.next_probe = backend.started_at + std::chrono::milliseconds(100);
  backend.deadline = backend.started_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(model.start_timeout_s));
  backend.last_probe = "not probed yet";
  ++backend.starts;
  if (swap_in) ++backend.swaps;
  write_pid_file(backend);
  log_info("starting {} (pid {}, port {}, log {})", model.name, backend.pid, port, backend.log.string());
}

void Supervisor::begin_stop(Backend& backend, const std::string& reason) {
  log_info("stopping {} (pid {}): {}", backend.config->name, backend.pid, reason);
  if (backend.pid > 0) kill(-backend.pid, SIGTERM);
  backend.state = BackendState::Stopping;
  backend.killed = false;
  backend.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.stop_timeout_s));
}

void Supervisor::monitor() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    step(lock);
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  // Shutdown: every group gets SIGTERM, then SIGKILL past stop_timeout.
  for (const auto& backend : backends_)
    if (backend->active() && backend->state != BackendState::Stopping) begin_stop(*backend, "the rig is shutting down");
  for (;;) {
    step(lock);
    const bool any = std::any_of(backends_.begin(), backends_.end(), [](const auto& b) { return b->active(); });
    if (!any) break;
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

// One pass over every backend: reap, probe, time out, drain, swap, restart, unload.
void Supervisor::step(std::unique_lock<std::mutex>& lock) {
  const auto now = Clock::now();
  for (const auto& owned : backends_) {
    Backend& backend = *owned;
    const ModelConfig& model = *backend.config;
    if (backend.pid <= 0) continue;
    // Peek first (WNOWAIT): while the leader is an unreaped zombie its pid, and so its group id,
    // cannot be reused, so the group kill below reaches only what it forked.
    siginfo_t info{};
    if (waitid(P_PID, id_t(backend.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != backend.pid) continue;
    kill(-backend.pid, SIGKILL);
    int status = 0;
    waitpid(backend.pid, &status, 0);
    const std::string how = describe_exit(status);
    const pid_t pid = backend.pid;
    backend.pid = 0;
    remove_pid_file(backend);
    if (backend.state == BackendState::Stopping) {
      backend.state = BackendState::Stopped;
      log_info("{} stopped ({})", model.name, how);
    } else if (backend.state == BackendState::Starting) {
      const std::string last = last_log_line(backend.log);
      fail_start(backend, fmt::format("model {} {} before becoming ready (pid {}; log {}{}{})", model.name, how, pid,
                                      backend.log.string(), last.empty() ? "" : ": ", last));
    } else {
      ++backend.crashes;
      ++backend.crash_streak;
      backend.state = BackendState::Stopped;
      backend.restart_pending = !stopping_;
      backend.restart_at = now + backoff(backend.crash_streak);
      backend.last_error = fmt::format("model {} {} while serving (pid {}); restarting in {:.0f} s (crash {})",
                                       model.name, how, pid, seconds(backend.restart_at - now), backend.crashes);
      log_warning("{}", backend.last_error);
    }
    changed_.notify_all();
  }

  // Health probes run without the lock: a slow backend must not stall admission of the others.
  std::vector<std::pair<Backend*, int>> probes;
  for (const auto& owned : backends_)
    if (owned->state == BackendState::Starting && now >= owned->next_probe) probes.emplace_back(owned.get(), owned->port);
  if (!probes.empty()) {
    std::vector<std::pair<int, std::string>> results;
    std::vector<std::string> paths;
    for (const auto& [backend, port] : probes) paths.push_back(backend->config->health_path);
    lock.unlock();
    for (size_t i = 0; i < probes.size(); ++i) {
      httplib::Client client("127.0.0.1", probes[i].second);
      client.set_connection_timeout(1, 0);
      client.set_read_timeout(5, 0);
      auto result = client.Get(paths[i]);
      if (result)
        results.emplace_back(result->status, fmt::format("HTTP {}", result->status));
      else
        results.emplace_back(0, httplib::to_string(result.error()));
    }
    lock.lock();
    for (size_t i = 0; i < probes.size(); ++i) {
      Backend& backend = *probes[i].first;
      if (backend.state != BackendState::Starting || backend.port != probes[i].second) continue;
      backend.last_probe = results[i].second;
      backend.next_probe = Clock::now() + std::chrono::milliseconds(200);
      if (results[i].first == 200) {
        backend.state = BackendState::Ready;
        backend.ready_at = backend.last_used = Clock::now();
        if (backend.restart_pending) ++backend.restarts;
        backend.restart_pending = false;
        log_info("{} ready in {:.1f} s on port {}", backend.config->name, seconds(backend.ready_at - backend.started_at),
                 backend.port);
        changed_.notify_all();
      }
    }
  }

  for (const auto& owned : backends_) {
    Backend& backend = *owned;
    const ModelConfig& model = *backend.config;
    if (backend.state == BackendState::Starting && now >= backend.deadline) {
      const std::string reason =
          fmt::format("model {} did not become ready within {:.0f} s (start_timeout): GET http://127.0.0.1:{}{} "
                      "last gave: {}; log {}",
                      model.name, model.start_timeout_s, backend.port, model.health_path, backend.last_probe,
                      backend.log.string());
      begin_stop(backend, "start timed out");
      fail_start(backend, reason);
      backend.state = BackendState::Stopping;  // still has to be reaped; waiters already have the reason
    } else if (backend.state == BackendState::Stopping && !backend.killed && now >= backend.deadline) {
      log_warning("{} (pid {}) ignored SIGTERM for {:.0f} s; sending SIGKILL to its process group", model.name,
                  backend.pid, config_.stop_timeout_s);
      kill(-backend.pid, SIGKILL);
      for (pid_t straggler : processes_with_env(kTokenVariable, backend.token)) kill(straggler, SIGKILL);
      backend.killed = true;
    } else if (backend.state == BackendState::Draining &&
               (backend.in_flight == 0 || seconds(now - backend.drain_since) >= config_.drain_timeout_s)) {
      begin_stop(backend, backend.in_flight == 0 ? "swapped out" : fmt::format("swapped out with {} request(s) still running after drain_timeout", backend.in_flight));
    } else if (backend.state == BackendState::Ready && model.ttl_s > 0 && backend.in_flight == 0 && backend.waiting == 0 &&
               seconds(now - backend.last_used) >= model.ttl_s) {
      begin_stop(backend, fmt::format("idle for {:.0f} s (ttl)", model.ttl_s));
    }
    if (backend.state == BackendState::Ready && seconds(now - backend.ready_at) > 60) backend.crash_streak = 0;
  }
  if (stopping_) return;

  // Per group: at most one member active. Another member that is wanted (a waiter, a preload or a
  // pending restart) first drains the active one, then starts once it is gone.
  for (const auto& owned : backends_) {
    Backend& candidate = *owned;
    const bool wanted = candidate.waiting > 0 || candidate.preload || (candidate.restart_pending && now >= candidate.restart_at);
    if (candidate.active() || !wanted) continue;
    Backend* active = nullptr;
    for (const auto& other : backends_)
      if (other.get() != &candidate && other->config->group == candidate.config->group && other->active()) active = other.get();
    if (!active) {
      // The member waited on longest goes first when several want the group.
      bool older = false;
      for (const auto& other : backends_)
        older |= other.get() != &candidate && other->config->group == candidate.config->group && !other->active() &&
                 other->waiting > 0 && candidate.waiting > 0 && other->first_waiter < candidate.first_waiter;
      if (older) continue;
      const bool swap_in = candidate.swap_in;
      candidate.swap_in = false;
      candidate.preload = false;
      launch(candidate, swap_in);
    } else if (active->state == BackendState::Ready && active->waiting == 0 && candidate.waiting > 0) {
      // (A member that just became ready serves its own waiters before it can be swapped out.)
      active->state = BackendState::Draining;
      active->drain_since = now;
      candidate.swap_in = true;
      log_info("swap in group {}: draining {} ({} in flight) for {}", candidate.config->group, active->config->name,
               active->in_flight, candidate.config->name);
    }
  }
}

}  // namespace anvil::rig
