#include "server/api_error.h"

namespace anvil::server {

std::string error_type_for_status(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestEntityTooLargeError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

Json error_body(int status, const std::string& message, const std::string& param) {
  Json error = {{"message", message}, {"type", error_type_for_status(status)}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) error["param"] = param;
  return {{"error", std::move(error)}};
}

std::string dump_json(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace anvil::server
