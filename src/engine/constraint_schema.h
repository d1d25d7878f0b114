#pragma once
// Compiles JSON schemas (and "any JSON object") into byte grammars for the constraint matcher.
//
// Supported: type (one or a list), properties, required, additionalProperties, enum, const,
// items, minItems/maxItems, anyOf, oneOf, allOf with one schema, $ref to "#", "#/$defs/..." or any
// local JSON pointer (recursion included, nesting bounded by kMaxDepth), minLength/maxLength,
// minimum/maximum/exclusiveMinimum/exclusiveMaximum (any bound on integers; integer-valued bounds
// on numbers), format date, time, date-time and uuid. Choices that narrow the output without
// making it invalid:
//  - Objects with properties emit only those properties, in declaration order; required ones
//    always, optional ones may be skipped. Extra keys are never emitted, whatever
//    additionalProperties says. Without properties, additionalProperties picks the values of
//    free-form keys (absent or true: any value; false: the empty object).
//  - oneOf is matched as anyOf; overlapping branches could in principle yield a value that more
//    than one branch accepts.
//  - Other formats (email, uri, ...) are annotations, as JSON Schema 2020-12 specifies by default:
//    they are not enforced.
//  - Keywords JSON Schema does not define are ignored, as the specification says.
// Known validation keywords that are not enforced (pattern, multipleOf, uniqueItems, not,
// prefixItems, ...) throw anvil::Error naming the keyword.
#include <string>

#include "engine/constraint_grammar.h"

namespace anvil::constraint {

Grammar json_object_grammar();
Grammar json_schema_grammar(const std::string& schema_json);

}  // namespace anvil::constraint
