#pragma once
// A constraint that first forces one of a few token sequences (a chat format's header for a tool
// call or an answer) and then hands over to the body constraint that sequence picked. This is
// how a forced tool call and a JSON answer are written in a chat format's own syntax while the
// JSON inside is constrained by the schema constraint.
#include <functional>
#include <memory>
#include <vector>

#include "engine/constraint.h"

namespace anvil::server {

struct ForcedPrefix {
  std::vector<int32_t> tokens;  // no prefix may be a proper prefix of another
  std::function<std::unique_ptr<TokenConstraint>()> body;
};

class PrefixConstraint : public TokenConstraint {
 public:
  explicit PrefixConstraint(const std::vector<ForcedPrefix>& options);
  void allowed_tokens(std::vector<uint8_t>& allowed) override;
  void accept(int32_t token) override;
  bool is_complete() const override;

 private:
  void enter_body_if_done();

  std::vector<std::vector<int32_t>> prefixes_;
  // Built up front on the caller's thread, so the engine thread never builds a constraint.
  std::vector<std::unique_ptr<TokenConstraint>> bodies_;
  std::vector<size_t> alive_;  // options whose prefix matches what was generated
  size_t position_ = 0;
  std::unique_ptr<TokenConstraint> body_;
};

}  // namespace anvil::server
