#pragma once
// Bearer-token check for --api-key, as vLLM applies it: only /v1 routes need the key, so health
// probes and metrics scrapers keep working without it.
#include <string>
#include <string_view>

namespace anvil::server {

bool route_needs_key(std::string_view path);
// `authorization` is the raw Authorization header. Compares in constant time so the key cannot
// be guessed byte by byte from response timing.
bool authorized(std::string_view authorization, std::string_view api_key);

}  // namespace anvil::server
