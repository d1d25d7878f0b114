#pragma once
// Server log lines on stderr. One mutex keeps lines from interleaving when many handler threads
// log at once; the format follows vLLM's (`LEVEL MM-DD HH:MM:SS message`) so log scrapers that
// know vLLM read ours.
#include <fmt/format.h>

#include <string_view>

namespace anvil::server {

void log_line(std::string_view level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log_line("INFO", fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_warning(fmt::format_string<Args...> format, Args&&... args) {
  log_line("WARNING", fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log_line("ERROR", fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace anvil::server
