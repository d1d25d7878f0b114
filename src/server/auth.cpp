#include "server/auth.h"

namespace anvil::server {

bool route_needs_key(std::string_view path) { return path == "/v1" || path.starts_with("/v1/"); }

bool authorized(std::string_view authorization, std::string_view api_key) {
  constexpr std::string_view kScheme = "Bearer ";
  if (!authorization.starts_with(kScheme)) return false;
  const std::string_view given = authorization.substr(kScheme.size());
  unsigned char difference = given.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < api_key.size(); ++i)
    difference |= static_cast<unsigned char>(api_key[i] ^ (i < given.size() ? given[i] : 0));
  return difference == 0;
}

}  // namespace anvil::server
