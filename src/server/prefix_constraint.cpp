#include "server/prefix_constraint.h"

namespace anvil::server {

PrefixConstraint::PrefixConstraint(const std::vector<ForcedPrefix>& options) {
  for (size_t i = 0; i < options.size(); ++i) {
    prefixes_.push_back(options[i].tokens);
    bodies_.push_back(options[i].body ? options[i].body() : nullptr);
    alive_.push_back(i);
  }
  enter_body_if_done();
}

void PrefixConstraint::enter_body_if_done() {
  for (const size_t i : alive_) {
    if (prefixes_[i].size() == position_) {
      body_ = std::move(bodies_[i]);
      bodies_.clear();
      alive_.clear();
      return;
    }
  }
}

void PrefixConstraint::allowed_tokens(std::vector<uint8_t>& allowed) {
  if (body_) {
    body_->allowed_tokens(allowed);
    return;
  }
  for (const size_t i : alive_) {
    const int32_t token = prefixes_[i][position_];
    if (token >= 0 && size_t(token) < allowed.size()) allowed[size_t(token)] = 1;
  }
}

void PrefixConstraint::accept(int32_t token) {
  if (body_) {
    body_->accept(token);
    return;
  }
  std::vector<size_t> still;
  for (const size_t i : alive_)
    if (prefixes_[i][position_] == token) still.push_back(i);
  alive_ = std::move(still);
  ++position_;
  enter_body_if_done();
}

bool PrefixConstraint::is_complete() const { return body_ && body_->is_complete(); }

}  // namespace anvil::server
