#pragma once
// Constrained decoding: a constraint says which tokens may come next, and follows the tokens that
// were chosen. The engine masks every other token's logit before sampling, so the output always
// belongs to the constraint's language (JSON, a JSON schema, a forced tool call).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace anvil {

class Tokenizer;

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed has one entry per vocabulary id; set it to 1 for every token that may come next
  // (entries arrive zeroed). End-of-sequence ids are the engine's: it allows them exactly when
  // is_complete().
  virtual void allowed_tokens(std::vector<uint8_t>& allowed) = 0;
  // Advances past a token that allowed_tokens permitted.
  virtual void accept(int32_t token) = 0;
  // True when the text so far is a complete sentence of the language.
  virtual bool is_complete() const = 0;
};

// Any JSON value whose top level is an object (OpenAI's response_format json_object).
std::unique_ptr<TokenConstraint> make_json_object_constraint(const Tokenizer& tokenizer);
// JSON that validates against the schema (types, properties, required, enum, const, arrays with
// items/minItems/maxItems, nested objects, additionalProperties false, anyOf, $ref to $defs).
// A schema feature it cannot enforce is an anvil::Error naming it, never silently ignored.
std::unique_ptr<TokenConstraint> make_json_schema_constraint(const std::string& schema_json, const Tokenizer& tokenizer);

}  // namespace anvil
