#pragma once
// Response bodies and stream chunks in OpenAI's (and vLLM's) shapes.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "formats/tokenizer.h"
#include "server/api_error.h"
#include "server/generation_job.h"

namespace anvil::server {

// "chatcmpl-" / "cmpl-" plus 32 random hex digits.
std::string make_response_id(const std::string& prefix);
int64_t unix_time();

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

struct LogprobFormat {
  const Tokenizer* tokenizer = nullptr;
  bool tokens_as_ids = false;
  std::string token_text(int32_t id) const;
};

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}.
Json chat_logprobs(const std::vector<GeneratedToken>& tokens, const LogprobFormat& format);
// Completions: {tokens, token_logprobs, top_logprobs, text_offset}; offsets start at text_offset.
Json completion_logprobs(const std::vector<GeneratedToken>& tokens, const LogprobFormat& format, size_t text_offset);

// Chat delta of one update: content, reasoning (as both `reasoning` and `reasoning_content`) and
// tool-call pieces.
Json chat_delta_json(const ChoiceUpdate& update);
Json chat_message_json(const ChoiceResult& result);

}  // namespace anvil::server
