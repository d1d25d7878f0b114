#pragma once
// Errors that reach a user: one line that names the file, field or value at fault.
// Library code throws anvil::Error; the CLI prints what() and exits non-zero.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace anvil {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace anvil
