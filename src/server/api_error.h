#pragma once
// Errors a handler answers with: an HTTP status plus OpenAI's error object. Everything a client
// can get wrong becomes one of these before any work reaches the engine.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace anvil::server {

using Json = nlohmann::json;

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {})
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

template <typename... Args>
[[noreturn]] void bad_request(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), std::move(param));
}

// vLLM's exception-like type names, with `code` the integer status as vLLM sends it.
std::string error_type_for_status(int status);
Json error_body(int status, const std::string& message, const std::string& param = {});

// Dumps without throwing on invalid UTF-8 (error messages may quote a client's bytes).
std::string dump_json(const Json& value);

}  // namespace anvil::server
