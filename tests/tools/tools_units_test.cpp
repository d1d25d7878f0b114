// The operator's tools piece by piece: SSE parsing, base URLs, vLLM's metric definitions, the
// schema validator preflight judges with, arrivals, and the notebook.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "support/test_support.h"
#include "tools/bench_dataset.h"
#include "tools/bench_stats.h"
#include "tools/json_schema_check.h"
#include "tools/notebook.h"
#include "tools/openai_client.h"

namespace anvil::test {
namespace {

using tools::Json;

TEST(ToolsSse, SplitsEventsAcrossReadsAndLineEndings) {
  tools::SseParser parser;
  std::vector<std::string> got;
  const auto on = [&](std::string&& data) { got.push_back(data); };
  const std::string stream = "data: {\"a\":1}\n\n: ping\n\ndata: two\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
  // Byte by byte: events must not depend on how the reads fall.
  for (const char c : stream) parser.feed(&c, 1, on);
  parser.finish(on);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "two", "x\ny", "[DONE]"}));
}

TEST(ToolsSse, UnterminatedLastEventIsDelivered) {
  tools::SseParser parser;
  std::vector<std::string> got;
  const std::string stream = "data: last";
  parser.feed(stream.data(), stream.size(), [&](std::string&& d) { got.push_back(d); });
  EXPECT_TRUE(got.empty());
  parser.finish([&](std::string&& d) { got.push_back(d); });
  EXPECT_EQ(got, std::vector<std::string>{"last"});
}

TEST(ToolsBaseUrl, AcceptsBothSpellings) {
  const auto a = tools::parse_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8000);
  EXPECT_EQ(a.path("/v1/models"), "/v1/models");
  const auto b = tools::parse_base_url("http://localhost:9000/v1/");
  EXPECT_EQ(b.port, 9000);
  EXPECT_EQ(b.path("/v1/models"), "/v1/models");
  EXPECT_TRUE(b.loopback());
  const auto c = tools::parse_base_url("https://gateway.example/route/v1");
  EXPECT_EQ(c.port, 443);
  EXPECT_EQ(c.path("/v1/models"), "/route/v1/models");
  EXPECT_FALSE(c.loopback());
  EXPECT_THROW(tools::parse_base_url("127.0.0.1:8000"), std::exception);
  EXPECT_THROW(tools::parse_base_url("http://host:99999"), std::exception);
}

TEST(ToolsChatResult, StreamedPiecesEqualTheWholeReply) {
  const Json whole = Json::parse(R"({"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",
    "content":null,"reasoning_content":"think","tool_calls":[{"id":"call_1","type":"function",
    "function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]}}],
    "usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}})");
  tools::StreamReply stream;
  stream.status = 200;
  for (const char* chunk :
       {R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
        R"({"choices":[{"index":0,"delta":{"reasoning_content":"thi"}}]})",
        R"({"choices":[{"index":0,"delta":{"reasoning_content":"nk"}}]})",
        R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]})",
        R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]}}]})",
        R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]},"finish_reason":"tool_calls"}]})",
        R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}})"}) {
    tools::SseEvent event;
    event.data = chunk;
    event.json = Json::parse(chunk);
    stream.events.push_back(event);
  }
  const tools::ChatResult a = tools::chat_result_from_reply(whole), b = tools::chat_result_from_stream(stream);
  for (const tools::ChatResult* r : {&a, &b}) {
    EXPECT_TRUE(r->problems.empty());
    EXPECT_EQ(r->reasoning, "think");
    EXPECT_EQ(r->reasoning_field, "reasoning_content");
    EXPECT_EQ(r->content, "");
    ASSERT_EQ(r->tool_calls.size(), 1u);
    EXPECT_EQ(r->tool_calls[0].name, "get_weather");
    EXPECT_EQ(r->tool_calls[0].id, "call_1");
    EXPECT_EQ(Json::parse(r->tool_calls[0].arguments), Json::parse(R"({"city":"Oslo"})"));
    EXPECT_EQ(r->finish_reason, "tool_calls");
    EXPECT_EQ(r->completion_tokens, 7);
  }
}

TEST(ToolsSchema, ValidatesTheKeywordsServersEnforce) {
  const Json schema = Json::parse(R"({"type":"object","properties":{
      "lang":{"type":"string","enum":["python","go"]},
      "year":{"type":"integer","minimum":1950,"maximum":2030},
      "typed":{"type":"boolean"},
      "tags":{"type":"array","items":{"type":"string","maxLength":3},"maxItems":2}},
    "required":["lang","year"],"additionalProperties":false})");
  EXPECT_EQ(tools::schema_violation(Json::parse(R"({"lang":"go","year":2009,"typed":true,"tags":["a"]})"), schema), "");
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"go"})"), schema).find("required key \"year\""), std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"c","year":1972})"), schema).find("$.lang"), std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"go","year":3000})"), schema).find("maximum"), std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"go","year":2000,"x":1})"), schema).find("\"x\" is not allowed"),
            std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"go","year":2000,"tags":["abcd"]})"), schema).find("$.tags[0]"),
            std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse(R"({"lang":"go","year":20.5})"), schema).find("type"), std::string::npos);
  EXPECT_NE(tools::schema_violation(Json::parse("[1]"), schema), "");
}

TEST(ToolsStats, PercentileIsNumpysLinearInterpolation) {
  EXPECT_DOUBLE_EQ(tools::percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(tools::percentile({10}, 99), 10);
  EXPECT_DOUBLE_EQ(tools::percentile({1, 2, 3, 4, 5}, 99), 4.96);  // numpy.percentile([1..5], 99)
  EXPECT_DOUBLE_EQ(tools::percentile({}, 50), 0);
}

// Two requests worked out by hand with vLLM's definitions (serve.py calculate_metrics).
TEST(ToolsStats, MetricsFollowVllmsDefinitions) {
  tools::RequestRecord a, b, failed;
  a.success = true, a.prompt_len = 10, a.output_tokens = 5, a.start = 0.0, a.ttft = 0.100, a.latency = 0.500;
  a.itl = {0.1, 0.1, 0.1, 0.1};
  b.success = true, b.prompt_len = 20, b.output_tokens = 3, b.start = 0.2, b.ttft = 0.300, b.latency = 0.500;
  b.itl = {0.1, 0.1};
  failed.success = false, failed.error = "HTTP 500";
  tools::MetricOptions options;
  options.goodput.ttft_ms = 200;
  const Json m = tools::compute_metrics({a, b, failed}, 1.0, options);
  EXPECT_EQ(m["completed"], 2);
  EXPECT_EQ(m["failed"], 1);
  EXPECT_EQ(m["total_input_tokens"], 30);
  EXPECT_EQ(m["total_output_tokens"], 8);
  EXPECT_DOUBLE_EQ(m["request_throughput"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(m["output_throughput"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(m["total_token_throughput"].get<double>(), 38.0);
  EXPECT_DOUBLE_EQ(m["request_goodput"].get<double>(), 1.0);  // only a has TTFT <= 200 ms
  EXPECT_NEAR(m["mean_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(m["median_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(m["std_ttft_ms"].get<double>(), 100, 1e-9);
  // TPOT: a (0.5-0.1)/4 = 100 ms, b (0.5-0.3)/2 = 100 ms.
  EXPECT_NEAR(m["mean_tpot_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(m["p99_itl_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(m["mean_e2el_ms"].get<double>(), 500, 1e-9);
  // Both are active during second 0 (a: 0-0.5 s, b: 0.2-0.7 s) and overlap at once.
  EXPECT_EQ(m["max_concurrent_requests"], 2);
  EXPECT_EQ(m["peak_concurrent_requests"], 2);
  EXPECT_DOUBLE_EQ(m["max_output_tokens_per_s"].get<double>(), 8);
  EXPECT_TRUE(tools::compute_metrics({a}, 1.0, {})["request_goodput"].is_null());
}

TEST(ToolsStats, GoodputSpecs) {
  const auto slo = tools::parse_goodput({"ttft:500", "tpot:50,e2el:2000"});
  EXPECT_EQ(slo.ttft_ms, 500);
  EXPECT_EQ(slo.tpot_ms, 50);
  EXPECT_EQ(slo.e2el_ms, 2000);
  EXPECT_THROW(tools::parse_goodput({"itl:5"}), std::exception);
  EXPECT_THROW(tools::parse_goodput({"ttft=5"}), std::exception);
}

TEST(ToolsDataset, ArrivalsAverageTheRequestedRate) {
  const auto poisson = tools::arrival_times(2000, 50.0, 1.0, 7);
  EXPECT_NEAR(poisson.back(), 2000 / 50.0, 1e-9);  // vLLM rescales so the last lands at n/rate
  EXPECT_TRUE(std::is_sorted(poisson.begin(), poisson.end()));
  // Burstier arrivals (smaller gamma shape) have more spread-out gaps.
  auto cv = [](const std::vector<double>& t) {
    std::vector<double> gaps;
    for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / double(gaps.size());
    double var = 0;
    for (const double g : gaps) var += (g - mean) * (g - mean);
    return std::sqrt(var / double(gaps.size())) / mean;
  };
  EXPECT_NEAR(cv(poisson), 1.0, 0.1);
  EXPECT_NEAR(cv(tools::arrival_times(2000, 50.0, 0.25, 7)), 2.0, 0.3);
  const auto inf = tools::arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 7);
  EXPECT_EQ(inf, std::vector<double>(5, 0.0));
}

TEST(ToolsDataset, RandomPromptsHaveTheRequestedLengths) {
  auto tokens = tools::vocab_token_source(1000);
  tools::DatasetOptions options;
  options.num_prompts = 200;
  options.input_len = 100;
  options.output_len = 20;
  options.range_ratio = 0.5;
  options.prefix_len = 8;
  const auto prompts = tools::make_dataset(options, tokens.get());
  ASSERT_EQ(prompts.size(), 200u);
  int64_t low = 1 << 30, high = 0;
  for (const auto& p : prompts) {
    EXPECT_EQ(int64_t(p.ids.size()), p.prompt_len);
    low = std::min(low, p.prompt_len - 8), high = std::max(high, p.prompt_len - 8);
    EXPECT_GE(p.output_len, 10);
    EXPECT_LE(p.output_len, 30);
    EXPECT_TRUE(std::equal(prompts[0].ids.begin(), prompts[0].ids.begin() + 8, p.ids.begin()));  // shared prefix
  }
  EXPECT_GE(low, 50);
  EXPECT_LE(high, 150);
  EXPECT_LT(low, 70);  // the range is used, not just its middle
  EXPECT_GT(high, 130);
  // Same seed, same prompts.
  EXPECT_EQ(tools::make_dataset(options, tokens.get())[17].ids, prompts[17].ids);
  options.range_ratio = 1.0;
  EXPECT_THROW(tools::make_dataset(options, tokens.get()), std::exception);
}

TEST(ToolsDataset, LocalTokenizerGivesTextAndCounts) {
  auto tokens = tools::local_token_source(harmony_tokenizer_json().string());
  const auto pool = tokens->pool();
  EXPECT_GT(pool.size(), 100000u);
  tools::DatasetOptions options;
  options.num_prompts = 3;
  options.input_len = 32;
  options.as_text = true;
  const auto prompts = tools::make_dataset(options, tokens.get());
  for (const auto& p : prompts) {
    EXPECT_TRUE(p.ids.empty());
    EXPECT_FALSE(p.text.empty());
  }
  EXPECT_EQ(tokens->count("hello world"), 2);
}

TEST(ToolsNotebook, StoresRunsAndRendersTheTable) {
  TempDir dir;
  const auto path = dir.path() / "sub" / "notebook.sqlite";
  {
    tools::Notebook notebook(path);
    tools::NotebookRun preflight;
    preflight.kind = "preflight";
    preflight.model = "gpt-oss-20b";
    preflight.quant = "mxfp4";
    preflight.engine = "anvil 0.1.0";
    preflight.gpu = "NVIDIA H200";
    preflight.passed = false;
    preflight.notes = "first try";
    preflight.figures = Json::parse(R"({"checks":[{"name":"smoke","passed":true},{"name":"needle","passed":false}],"passed":false})");
    preflight.flags = {{"needle_ctx", 8192}};
    EXPECT_EQ(notebook.add(preflight), 1);
    tools::NotebookRun bench;
    bench.kind = "bench";
    bench.model = "gpt-oss-20b";
    bench.quant = "mxfp4";
    bench.engine = "anvil 0.1.0";
    bench.gpu = "NVIDIA H200";
    bench.notes = "a | pipe";
    bench.flags = {{"input_len", 1024}, {"output_len", 128}, {"max_concurrency", 16}, {"request_rate", "inf"},
                   {"server_flags", "--max-model-len 32768"}};
    bench.figures = {{"output_throughput", 2450.4}, {"request_throughput", 19.1}, {"median_ttft_ms", 41.2},
                     {"median_tpot_ms", 6.1}, {"p99_itl_ms", 12.0}, {"failed", 0}};
    EXPECT_EQ(notebook.add(bench), 2);
    tools::NotebookRun other = preflight;
    other.model = "Qwen3-32B";
    other.quant = "bf16";
    other.passed = true;
    other.notes = "";
    notebook.add(other);
  }
  tools::Notebook reopened(path);
  const auto runs = reopened.runs();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].figures["output_throughput"], 2450.4);
  EXPECT_FALSE(runs[0].created_at.empty());
  EXPECT_EQ(runs[0].passed, false);

  const std::string md = tools::render_notebook(runs, "md");
  EXPECT_NE(md.find("| model | quant | engine | GPU | serves? | key flags | figures | notes |"), std::string::npos) << md;
  EXPECT_NE(md.find("| gpt-oss-20b | mxfp4 | anvil 0.1.0 | NVIDIA H200 | no (needle) |"), std::string::npos) << md;
  EXPECT_NE(md.find("--max-model-len 32768, in 1024, out 128, c 16, rate inf"), std::string::npos) << md;
  EXPECT_NE(md.find("2450 tok/s out, 19.1 req/s, TTFT p50 41.2 ms, TPOT p50 6.10 ms"), std::string::npos) << md;
  EXPECT_NE(md.find("first try; a \\| pipe"), std::string::npos) << md;
  EXPECT_NE(md.find("| Qwen3-32B | bf16 | anvil 0.1.0 | NVIDIA H200 | yes |"), std::string::npos) << md;
  const std::string html = tools::render_notebook(runs, "html");
  EXPECT_NE(html.find("<th>serves?</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>no (needle)</td>"), std::string::npos);
  const std::string all = tools::render_notebook(runs, "md", true);
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 5);  // header, rule, three runs
  EXPECT_THROW(tools::render_notebook(runs, "csv"), std::exception);
}

TEST(ToolsNotebook, DefaultPathFollowsXdg) {
  const char* old = std::getenv("XDG_DATA_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_DATA_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(tools::default_notebook_path(), "/tmp/xdg-test/anvil/notebook.sqlite");
  unsetenv("XDG_DATA_HOME");
  EXPECT_EQ(tools::default_notebook_path().filename(), "notebook.sqlite");
  EXPECT_NE(tools::default_notebook_path().string().find(".local/share/anvil"), std::string::npos);
  if (old) setenv("XDG_DATA_HOME", saved.c_str(), 1);
}

TEST(ToolsServerInfo, QuantizationFromNames) {
  EXPECT_EQ(tools::quantization_from_name("Qwen/Qwen3-32B-AWQ"), "awq");
  EXPECT_EQ(tools::quantization_from_name("gpt-oss-20b-MXFP4"), "mxfp4");
  EXPECT_EQ(tools::quantization_from_name("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M"), "q4_k_m");
  EXPECT_EQ(tools::quantization_from_name("meta-llama/Llama-3.1-8B-Instruct-FP8"), "fp8");
  EXPECT_EQ(tools::quantization_from_name("demo"), "");
}

}  // namespace
}  // namespace anvil::test
