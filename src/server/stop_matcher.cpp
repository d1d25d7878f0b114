#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace anvil::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  for (const std::string& stop : stops_) hold_ = std::max(hold_, stop.size() - 1);
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(text);
  pending_ += text;
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at == std::string::npos) continue;
    if (at < best || (at == best && stop.size() > best_stop->size())) {
      best = at;
      best_stop = &stop;
    }
  }
  if (best_stop) {
    matched_ = true;
    stop_ = *best_stop;
    std::string out = pending_.substr(0, best + (include_stop_ ? stop_.size() : 0));
    pending_.clear();
    return out;
  }
  if (pending_.size() <= hold_) return {};
  size_t cut = pending_.size() - hold_;
  // Never split a UTF-8 character: clients decode every piece on its own.
  while (cut > 0 && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  return std::exchange(pending_, std::string());
}

}  // namespace anvil::server
