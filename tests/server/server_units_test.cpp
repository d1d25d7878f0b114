// The server's pieces that need no process: stop strings over split text, the forced-prefix
// constraint, bounded JSON parsing, bearer checks, engine parameters from request options.
#include <gtest/gtest.h>

#include "server/auth.h"
#include "server/endpoint_common.h"
#include "server/json_input.h"
#include "server/prefix_constraint.h"
#include "server/stop_matcher.h"

namespace anvil::server {
namespace {

std::string feed(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) out += matcher.push(piece);
  return out + matcher.flush();
}

TEST(StopMatcher, FindsStopStringsSplitAcrossPieces) {
  StopMatcher matcher({"STOP"}, false);
  EXPECT_EQ(feed(matcher, {"abc S", "T", "OP and more"}), "abc ");
  EXPECT_TRUE(matcher.matched());
  EXPECT_EQ(matcher.stop(), "STOP");
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStartAStop) {
  StopMatcher matcher({"xyz"}, false);
  EXPECT_EQ(matcher.push("hello x"), "hello ");
  EXPECT_EQ(matcher.push("y"), "");
  EXPECT_EQ(matcher.push("a"), "xya");
  EXPECT_EQ(matcher.push("zz"), "zz");
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_FALSE(matcher.matched());
}

TEST(StopMatcher, EarliestStopWinsAndIncludeStopKeepsIt) {
  StopMatcher first({"world", "lo w"}, true);
  EXPECT_EQ(feed(first, {"hello world"}), "hello w");
  EXPECT_EQ(first.stop(), "lo w");
  StopMatcher none({}, false);
  EXPECT_EQ(feed(none, {"a", "b"}), "ab");
}

TEST(StopMatcher, NeverSplitsAUtf8Character) {
  // The stop starts with the first byte of "é" but is not "é": the held tail backs up to the
  // start of that character rather than cutting it.
  StopMatcher matcher({"\xc3\xa9X", "\xa9\xc3Y"}, false);
  EXPECT_EQ(matcher.push("a\xc3\xa9"), "a");
  EXPECT_EQ(matcher.flush(), "\xc3\xa9");
}

class ListConstraint : public TokenConstraint {
 public:
  explicit ListConstraint(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  void allowed_tokens(std::vector<uint8_t>& allowed) override {
    if (at_ < tokens_.size()) allowed[size_t(tokens_[at_])] = 1;
  }
  void accept(int32_t) override { ++at_; }
  bool is_complete() const override { return at_ == tokens_.size(); }

 private:
  std::vector<int32_t> tokens_;
  size_t at_ = 0;
};

TEST(PrefixConstraint, ForcesOneOfThePrefixesThenItsBody) {
  PrefixConstraint constraint({{{1, 2, 3}, [] { return std::make_unique<ListConstraint>(std::vector<int32_t>{7}); }},
                               {{1, 4}, [] { return std::make_unique<ListConstraint>(std::vector<int32_t>{8, 9}); }}});
  auto allowed = [&] {
    std::vector<uint8_t> mask(10, 0);
    constraint.allowed_tokens(mask);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < mask.size(); ++i)
      if (mask[i]) ids.push_back(int32_t(i));
    return ids;
  };
  EXPECT_EQ(allowed(), std::vector<int32_t>({1}));
  constraint.accept(1);
  EXPECT_EQ(allowed(), std::vector<int32_t>({2, 4}));
  constraint.accept(4);
  EXPECT_FALSE(constraint.is_complete());
  EXPECT_EQ(allowed(), std::vector<int32_t>({8}));
  constraint.accept(8);
  constraint.accept(9);
  EXPECT_TRUE(constraint.is_complete());
}

TEST(JsonInput, DepthIsLimitedBeforeParsing) {
  EXPECT_NO_THROW(parse_request_body("{\"a\": [[[1]]], \"b\": \"[[[[[[[[\"}"));
  EXPECT_THROW(parse_request_body("{\"a\": " + std::string(1000000, '[') + "}"), ApiError);
  try {
    parse_request_body("{\"a\": \"\xff\"}");
    FAIL();
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), 400);
  }
}

TEST(JsonInput, IntegersAreCheckedForTypeAndRange) {
  const Json body = Json::parse(R"({"a": 5.0, "b": 5.5, "c": "5", "d": 1e300, "e": -3})");
  FieldReader fields(body, "");
  EXPECT_EQ(fields.integer("a", 0, 10), 5);
  EXPECT_THROW(fields.integer("b", 0, 10), ApiError);
  EXPECT_THROW(fields.integer("c", 0, 10), ApiError);
  EXPECT_THROW(fields.integer("d", 0, 10), ApiError);
  EXPECT_THROW(fields.integer("e", 0, 10), ApiError);
  EXPECT_EQ(fields.integer("missing", 0, 10), std::nullopt);
  EXPECT_EQ(fields.unread_keys(), std::vector<std::string>{});
}

TEST(Auth, BearerKeyMustMatchExactly) {
  EXPECT_TRUE(authorized("Bearer sk-1", "sk-1"));
  EXPECT_FALSE(authorized("Bearer sk-12", "sk-1"));
  EXPECT_FALSE(authorized("Bearer sk-", "sk-1"));
  EXPECT_FALSE(authorized("sk-1", "sk-1"));
  EXPECT_FALSE(authorized("", "sk-1"));
  EXPECT_TRUE(route_needs_key("/v1/models"));
  EXPECT_FALSE(route_needs_key("/health"));
  EXPECT_FALSE(route_needs_key("/v1x"));
}

// A CI run failed when a sampled chat reply drew <|im_end|> 2 tokens into an ignore_eos request
// for 6: the chat format's end-of-turn ids stopped it although the client asked for every token.
TEST(RequestParams, IgnoreEosAlsoPassesTheChatFormatsEndOfTurnIds) {
  ServedModel model;
  model.eos_ids = {3};
  const std::vector<int32_t> prompt = {5, 6}, format_stops = {256, 257};
  GenerationOptions options;
  options.stop_token_ids = {9};
  const RequestParams stopping = make_params(options, model, prompt, 6, 0, format_stops, {});
  EXPECT_FALSE(stopping.ignore_eos);
  EXPECT_EQ(stopping.stop_token_ids, (std::vector<int32_t>{256, 257, 9}));
  options.ignore_eos = true;
  const RequestParams ignoring = make_params(options, model, prompt, 6, 0, format_stops, {});
  EXPECT_TRUE(ignoring.ignore_eos);
  EXPECT_EQ(ignoring.eos_token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(ignoring.stop_token_ids, (std::vector<int32_t>{9}));  // the client's own still stop
}

}  // namespace
}  // namespace anvil::server
