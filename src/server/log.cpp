#include "server/log.h"

#include <cstdio>
#include <ctime>
#include <mutex>

namespace anvil::server {

void log_line(std::string_view level, std::string_view message) {
  static std::mutex mutex;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%m-%d %H:%M:%S", &local);
  const std::lock_guard lock(mutex);
  std::fprintf(stderr, "%.*s %s %.*s\n", int(level.size()), level.data(), stamp, int(message.size()), message.data());
  std::fflush(stderr);
}

}  // namespace anvil::server
