// Chat replies in process, without HTTP: the prefixes a forced reply (JSON answer or tool call)
// starts with, how such a reply is parsed, and stop strings over reasoning models' output. The
// engine here is the real one, driven by a model that writes a scripted token sequence, so a
// reply can be exactly the reasoning and content a test needs.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "engine/engine.h"
#include "formats/tokenizer.h"
#include "server/chat_format.h"
#include "server/generation_job.h"
#include "server/openai_protocol.h"
#include "support/server_harness.h"

namespace anvil::test {
namespace {

using server::ChatFormat;
using server::ForcedReply;
using server::RenderedPrompt;

const Tokenizer& qwen_tokenizer() {
  static const auto tokenizer = Tokenizer::from_json_text(qwen_like_tokenizer().dump(), "qwen-like tokenizer.json");
  return *tokenizer;
}

const Tokenizer& harmony_tokenizer() {
  static const auto tokenizer = Tokenizer::from_file(harmony_tokenizer_json());
  return *tokenizer;
}

ModelConfig config_of(const std::string& model_type, int64_t vocab_size) {
  ModelConfig config;
  config.architecture = "Scripted";
  config.model_type = model_type;
  config.num_layers = 1;
  config.num_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = 8;
  config.hidden_size = 8;
  config.vocab_size = vocab_size;
  config.max_position_embeddings = 4096;
  config.layer_types = {LayerAttention::Full};
  return config;
}

ChatFormat qwen_format() { return ChatFormat(config_of("qwen3", 1024), &qwen_tokenizer()); }
ChatFormat harmony_format() { return ChatFormat(config_of("gpt_oss", harmony_tokenizer().vocab_size()), &harmony_tokenizer()); }

Json user_says(const std::string& text) { return Json::array({{{"role", "user"}, {"content", text}}}); }

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
    "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
])");

// The tokens a constraint forces one by one from the start: while exactly one token is allowed,
// that one is taken. A forced prefix ends where the JSON (with several possible tokens) begins.
std::vector<int32_t> forced_tokens(const server::ConstraintFactory& factory, int64_t vocab) {
  std::vector<int32_t> tokens;
  const auto constraint = factory();
  for (int step = 0; step < 64; ++step) {
    std::vector<uint8_t> allowed(size_t(vocab), 0);
    constraint->allowed_tokens(allowed);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < allowed.size(); ++i)
      if (allowed[i]) ids.push_back(int32_t(i));
    if (ids.size() != 1) break;
    tokens.push_back(ids[0]);
    constraint->accept(ids[0]);
  }
  return tokens;
}

std::string text_of(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) { return tokenizer.decode(ids); }

TEST(ChatFormatForcedReply, ChatMlSkipsReasoningBeforeAForcedReply) {
  const ChatFormat format = qwen_format();
  const Tokenizer& tok = qwen_tokenizer();
  const Json json_object = {{"type", "json_object"}};

  // Thinking on (Qwen3's default): an empty think block comes first, then the JSON.
  auto request = server::parse_chat_request({{"messages", user_says("hi")}, {"response_format", json_object}});
  RenderedPrompt prompt = format.render(request);
  EXPECT_EQ(prompt.forced, ForcedReply::JsonAnswer);
  EXPECT_FALSE(prompt.starts_in_reasoning);
  EXPECT_EQ(text_of(tok, prompt.forced_prefix), "<think>\n\n</think>\n\n");
  std::vector<int32_t> forced = forced_tokens(format.constraint(request, prompt), tok.vocab_size());
  ASSERT_GE(forced.size(), prompt.forced_prefix.size());
  EXPECT_EQ(std::vector<int32_t>(forced.begin(), forced.begin() + long(prompt.forced_prefix.size())), prompt.forced_prefix);

  // Thinking off: the prompt already holds the empty block; the JSON starts at once.
  request = server::parse_chat_request({{"messages", user_says("hi")}, {"response_format", json_object},
                                        {"chat_template_kwargs", {{"enable_thinking", false}}}});
  prompt = format.render(request);
  EXPECT_TRUE(text_of(tok, prompt.ids).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(prompt.forced_prefix.empty());
  const std::string forced_text = text_of(tok, forced_tokens(format.constraint(request, prompt), tok.vocab_size()));
  EXPECT_TRUE(forced_text.empty() || forced_text.starts_with("{")) << forced_text;

  // A forced tool call: the empty think block, then the call's opening tag.
  for (const Json& choice : {Json("required"), Json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
    request = server::parse_chat_request({{"messages", user_says("time?")}, {"tools", kTools}, {"tool_choice", choice}});
    prompt = format.render(request);
    EXPECT_EQ(prompt.forced, ForcedReply::ToolCall);
    EXPECT_EQ(text_of(tok, prompt.forced_prefix), "<think>\n\n</think>\n\n<tool_call>\n");
    forced = forced_tokens(format.constraint(request, prompt), tok.vocab_size());
    ASSERT_GE(forced.size(), prompt.forced_prefix.size());
    EXPECT_EQ(std::vector<int32_t>(forced.begin(), forced.begin() + long(prompt.forced_prefix.size())), prompt.forced_prefix);
  }

  // Nothing forced: no constraint, no prefix.
  request = server::parse_chat_request({{"messages", user_says("hi")}, {"tools", kTools}});
  prompt = format.render(request);
  EXPECT_EQ(prompt.forced, ForcedReply::None);
  EXPECT_FALSE(format.constraint(request, prompt));
}

TEST(ChatFormatForcedReply, ThinkTagInAUserMessageDoesNotOpenReasoning) {
  const ChatFormat format = qwen_format();
  const Tokenizer& tok = qwen_tokenizer();
  // <think> is not a special token: the user's text encodes to its id. Only the generation prompt
  // decides whether the reply starts inside a think block.
  auto request = server::parse_chat_request({{"messages", user_says("What does a <think> tag do?\n<think>")}});
  RenderedPrompt prompt = format.render(request);
  ASSERT_NE(std::find(prompt.ids.begin(), prompt.ids.end(), *tok.token_id("<think>")), prompt.ids.end());
  EXPECT_FALSE(prompt.starts_in_reasoning);
  auto parser = format.make_parser(prompt);
  for (const int32_t id : tok.encode("It marks reasoning.", false)) parser->push(id);
  parser->finish();
  EXPECT_EQ(parser->result().content, "It marks reasoning.");
  EXPECT_EQ(parser->result().reasoning, "");

  request = server::parse_chat_request({{"messages", user_says("<think>")}, {"response_format", {{"type", "json_object"}}}});
  prompt = format.render(request);
  EXPECT_EQ(text_of(tok, prompt.forced_prefix), "<think>\n\n</think>\n\n");
}

TEST(ChatFormatForcedReply, HarmonyAnswersOnTheFinalChannelAndCallsOnCommentary) {
  const ChatFormat format = harmony_format();
  const Tokenizer& tok = harmony_tokenizer();
  auto request = server::parse_chat_request(
      {{"messages", user_says("hi")},
       {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", {{"type", "object"}}}}}}}});
  RenderedPrompt prompt = format.render(request);
  EXPECT_EQ(prompt.forced, ForcedReply::JsonAnswer);
  EXPECT_TRUE(text_of(tok, prompt.ids).ends_with("<|start|>assistant"));
  // No analysis message: the header goes straight to the final channel.
  EXPECT_EQ(text_of(tok, forced_tokens(format.constraint(request, prompt), tok.vocab_size())),
            "<|channel|>final<|message|>");

  request = server::parse_chat_request({{"messages", user_says("time?")}, {"tools", kTools},
                                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  prompt = format.render(request);
  EXPECT_EQ(prompt.forced, ForcedReply::ToolCall);
  const std::string header = text_of(tok, forced_tokens(format.constraint(request, prompt), tok.vocab_size()));
  EXPECT_TRUE(header.starts_with("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>")) << header;
}

// Feeds a parser the given ids, then finishes it; the deltas must add up to the result.
ParsedOutput parse_all(ChatOutputParser& parser, const std::vector<int32_t>& ids) {
  ParsedOutput streamed;
  auto add = [&](const ChatDelta& delta) {
    streamed.reasoning += delta.reasoning;
    streamed.content += delta.content;
    for (const ToolCallDelta& call : delta.tool_calls) {
      if (call.index >= streamed.tool_calls.size()) streamed.tool_calls.resize(call.index + 1);
      if (!call.name.empty()) streamed.tool_calls[call.index].name = call.name;
      streamed.tool_calls[call.index].arguments_json += call.arguments;
    }
  };
  for (const int32_t id : ids) add(parser.push(id));
  add(parser.finish());
  const ParsedOutput whole = parser.result();
  EXPECT_EQ(streamed.reasoning, whole.reasoning);
  EXPECT_EQ(streamed.content, whole.content);
  EXPECT_EQ(streamed.tool_calls.size(), whole.tool_calls.size());
  return whole;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(ChatFormatForcedReply, TagTextInsideForcedJsonIsData) {
  const ChatFormat qwen = qwen_format();
  const Tokenizer& qt = qwen_tokenizer();
  // JSON strings that spell the format's own tags; <think> and <tool_call> even encode to their
  // tag ids. The reply is still all content, and none of it reasoning.
  const std::string answer = R"({"tag": "</think> then <think>x", "call": "<tool_call>{}</tool_call>"})";
  auto request = server::parse_chat_request({{"messages", user_says("hi")}, {"response_format", {{"type", "json_object"}}}});
  RenderedPrompt prompt = qwen.render(request);
  auto parser = qwen.make_parser(prompt);
  ParsedOutput out = parse_all(*parser, concat(prompt.forced_prefix, qt.encode(answer, false)));
  EXPECT_EQ(out.content, answer);
  EXPECT_EQ(out.reasoning, "");
  EXPECT_TRUE(out.tool_calls.empty());

  request = server::parse_chat_request({{"messages", user_says("time?")}, {"tools", kTools}, {"tool_choice", "required"}});
  prompt = qwen.render(request);
  parser = qwen.make_parser(prompt);
  out = parse_all(*parser,
                  concat(prompt.forced_prefix, qt.encode(R"({"name": "get_time", "arguments": {"zone": "</tool_call><think>"}})", false)));
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_time");
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"zone":"</tool_call><think>"})");
  EXPECT_EQ(out.content, "");
  EXPECT_EQ(out.reasoning, "");

  // Harmony: text that spells formatting tokens is text (constrained output holds no special ids).
  const ChatFormat harmony = harmony_format();
  const Tokenizer& ht = harmony_tokenizer();
  const std::string spelled = R"({"a": "<|end|><|start|>assistant<|channel|>analysis<|message|>b"})";
  request = server::parse_chat_request({{"messages", user_says("hi")}, {"response_format", {{"type", "json_object"}}}});
  prompt = harmony.render(request);
  parser = harmony.make_parser(prompt);
  const std::vector<int32_t> header = forced_tokens(harmony.constraint(request, prompt), ht.vocab_size());
  out = parse_all(*parser, concat(header, ht.encode(spelled, false)));
  EXPECT_EQ(out.content, spelled);
  EXPECT_EQ(out.reasoning, "");
}

// A model that writes a script: after the prompt, token k of the script at generated position
// k, then `end` forever. Its KV cache is never read.
class ScriptedModel : public Model {
 public:
  ScriptedModel(ModelConfig config, int64_t prompt_length, std::vector<int32_t> script, int32_t end)
      : Model(std::move(config), make_dummy_weights(0)), prompt_length_(prompt_length), script_(std::move(script)), end_(end) {}
  size_t weight_bytes_per_token() const override { return 0; }
  void forward(const StepBatch& batch, std::vector<KvGroupStorage>&, float* logits) override {
    const int64_t vocab = config_.vocab_size;
    int64_t row = 0;
    for (const SequenceStep& seq : batch.sequences) {
      if (!seq.need_logits) continue;
      const int64_t generated = seq.start_pos + seq.num_tokens - prompt_length_;
      const int32_t next = generated >= 0 && generated < int64_t(script_.size()) ? script_[size_t(generated)] : end_;
      std::fill(logits + row * vocab, logits + (row + 1) * vocab, 0.0f);
      logits[row * vocab + next] = 10.0f;
      ++row;
    }
  }

 private:
  int64_t prompt_length_;
  std::vector<int32_t> script_;
  int32_t end_;
};

struct ScriptedReply {
  server::ChoiceResult result;
  std::string streamed_text, streamed_reasoning;
};

// Runs one chat request whose reply is `script` through the engine and a GenerationJob, with
// the request's stop strings, as the chat endpoint does.
ScriptedReply run_scripted(const ChatFormat& format, const Tokenizer& tokenizer, const Json& body,
                           const std::vector<int32_t>& script, int32_t end) {
  const server::ChatRequest request = server::parse_chat_request(body);
  const RenderedPrompt prompt = format.render(request);
  EngineConfig config;
  config.kv_blocks_per_group = {64};
  Engine engine(std::make_unique<ScriptedModel>(config_of("scripted", tokenizer.vocab_size()), int64_t(prompt.ids.size()),
                                                script, end),
                config);
  server::ServerMetrics metrics;
  server::OutputOptions output;
  output.tokenizer = &tokenizer;
  output.make_parser = [&format, prompt] { return format.make_parser(prompt); };
  output.stop = request.options.stop;
  server::GenerationJob job(engine, metrics, output);
  RequestParams params;
  params.prompt_ids = prompt.ids;
  params.sampling.temperature = 0.0f;
  params.max_tokens = int64_t(script.size()) + 4;
  params.eos_token_ids = {end};
  params.stop_token_ids = format.stop_token_ids();
  job.start({server::ChoiceSetup{0, params}}, {int64_t(prompt.ids.size())});
  ScriptedReply reply;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!job.done() && std::chrono::steady_clock::now() < deadline) {
    for (const server::ChoiceUpdate& update : job.wait(std::chrono::milliseconds(100))) {
      reply.streamed_text += update.text;
      reply.streamed_reasoning += update.reasoning;
    }
  }
  EXPECT_TRUE(job.done());
  reply.result = job.result(0);
  return reply;
}

// vLLM means stop strings for the answer: its reasoning-parser path skipped them inside reasoning
// (vllm#14550), and their firing inside reasoning in the V1 engine is an open bug there
// (vllm#38499, vllm#52393). A stop string the model only thinks must not end the reply.
TEST(StopStrings, ApplyToContentNotReasoning) {
  const ChatFormat qwen = qwen_format();
  const Tokenizer& qt = qwen_tokenizer();
  const int32_t im_end = *qt.token_id("<|im_end|>");
  const std::vector<int32_t> thought =
      qt.encode("<think>\nI could say STOP here, or STO\n</think>\n\nP is not it. The answer: STOP, then more", false);
  const Json body = {{"messages", user_says("hi")}, {"stop", {"STOP"}}};
  ScriptedReply reply = run_scripted(qwen, qt, body, thought, im_end);
  EXPECT_EQ(reply.result.reasoning, "I could say STOP here, or STO");
  EXPECT_EQ(reply.result.text, "P is not it. The answer: ");
  EXPECT_EQ(reply.result.finish_reason, "stop");
  EXPECT_EQ(reply.result.stop_reason, "STOP");
  EXPECT_EQ(reply.streamed_reasoning, reply.result.reasoning);
  EXPECT_EQ(reply.streamed_text, reply.result.text);
  // The reply ended at the stop string: the rest of the script was never generated.
  EXPECT_LT(reply.result.tokens.size(), thought.size());

  // Only reasoning holds it: the reply runs to its end.
  const std::vector<int32_t> clean = qt.encode("<think>\nSTOP STOP\n</think>\n\nfine", false);
  reply = run_scripted(qwen, qt, body, clean, im_end);
  EXPECT_EQ(reply.result.reasoning, "STOP STOP");
  EXPECT_EQ(reply.result.text, "fine");
  EXPECT_EQ(reply.result.finish_reason, "stop");
  EXPECT_TRUE(reply.result.stop_reason.is_null());

  // Harmony: analysis is reasoning, final is content.
  const ChatFormat harmony = harmony_format();
  const Tokenizer& ht = harmony_tokenizer();
  auto special = [&](const char* token) { return *ht.token_id(token); };
  std::vector<int32_t> script = {special("<|channel|>")};
  script = concat(script, ht.encode("analysis", false));
  script.push_back(special("<|message|>"));
  script = concat(script, ht.encode("Maybe STOP? No.", false));
  script.push_back(special("<|end|>"));
  script.push_back(special("<|start|>"));
  script = concat(script, ht.encode("assistant", false));
  script.push_back(special("<|channel|>"));
  script = concat(script, ht.encode("final", false));
  script.push_back(special("<|message|>"));
  script = concat(script, ht.encode("Done. STOP here", false));
  script.push_back(special("<|return|>"));
  reply = run_scripted(harmony, ht, body, script, special("<|return|>"));
  EXPECT_EQ(reply.result.reasoning, "Maybe STOP? No.");
  EXPECT_EQ(reply.result.text, "Done. ");
  EXPECT_EQ(reply.result.stop_reason, "STOP");
}

}  // namespace
}  // namespace anvil::test
