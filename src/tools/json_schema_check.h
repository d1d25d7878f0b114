#pragma once
// A JSON Schema validator for the keywords structured-output servers enforce (type, properties,
// required, additionalProperties, enum, const, items, min/maxItems, min/maxLength, minimum,
// maximum, exclusive bounds, anyOf/oneOf/allOf). preflight uses it to judge a server's replies.
#include <nlohmann/json.hpp>
#include <string>

namespace anvil::tools {

// "" when value validates against schema, else the first problem with its path ("$.year: 3000 is
// above the maximum 2030").
std::string schema_violation(const nlohmann::json& value, const nlohmann::json& schema);

}  // namespace anvil::tools
