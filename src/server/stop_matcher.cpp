#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace anvil::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
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
  // Only a tail that is the start of some stop string can still become a match.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, pending_.size()); k > keep; --k) {
      if (pending_.compare(pending_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  size_t cut = pending_.size() - keep;
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
