#pragma once
// The route handlers. Each throws ApiError for anything the client got wrong; the HTTP layer
// turns that into OpenAI's error body.
#include <httplib.h>

#include "server/endpoint_common.h"
#include "server/json_input.h"

namespace anvil::server {

void handle_chat_completions(EndpointContext& context, const std::string& body, httplib::Response& response);
void handle_completions(EndpointContext& context, const std::string& body, httplib::Response& response);
void handle_tokenize(EndpointContext& context, const std::string& body, httplib::Response& response);
void handle_detokenize(EndpointContext& context, const std::string& body, httplib::Response& response);
// GET /v1/models, and GET /v1/models/{id} when `only` is set.
Json models_json(const ServerConfig& config, const ServedModel& model, const std::string* only);

}  // namespace anvil::server
