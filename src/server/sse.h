#pragma once
// Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk, `data: [DONE]\n\n` last.
#include <string>

#include "server/api_error.h"

namespace anvil::server {

inline std::string sse_data(const Json& chunk) { return "data: " + dump_json(chunk) + "\n\n"; }
inline const std::string kSseDone = "data: [DONE]\n\n";
// A comment line: clients skip it; writing it is how a silent stream notices a gone client.
inline const std::string kSsePing = ": ping\n\n";

}  // namespace anvil::server
