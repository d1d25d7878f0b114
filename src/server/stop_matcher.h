#pragma once
// Stop strings over streamed text. A tail that could be the start of a stop string is held back
// until the next piece decides it, so a stop string split across tokens is still found and never
// reaches the client, streamed or not.
#include <string>
#include <string_view>
#include <vector>

namespace anvil::server {

class StopMatcher {
 public:
  StopMatcher() = default;
  StopMatcher(std::vector<std::string> stops, bool include_stop);

  // Text that is safe to emit now; after a match, the text up to the stop string (plus it when
  // include_stop) and nothing more.
  std::string push(std::string_view text);
  // The held-back tail, once the stream has ended without a match.
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& stop() const { return stop_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;
  bool matched_ = false;
  std::string stop_;
};

}  // namespace anvil::server
