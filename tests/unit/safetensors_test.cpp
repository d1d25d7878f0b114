#include "formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "core/error.h"
#include "support/test_support.h"

namespace anvil {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The message of the anvil::Error that `body` throws; fails the test if it throws nothing else.
std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), Not(HasSubstr("\n"))) << "errors must be one line";
    return e.what();
  }
  ADD_FAILURE() << "expected anvil::Error";
  return "";
}

// A safetensors file from a literal header and data section, for malformed inputs.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t size = header.size();
  std::memcpy(bytes.data(), &size, 8);
  return bytes + header + data;
}

std::vector<int64_t> shape_of(const TensorView& view) { return view.shape; }

TEST(SafetensorsFile, ReadsGptOssFixture) {
  const auto path = test::fixtures_dir() / "gpt-oss-tiny" / "model.safetensors";
  SafetensorsFile file(path);
  EXPECT_EQ(file.path(), path);

  const TensorView& blocks = file.tensor("model.layers.0.mlp.experts.gate_up_proj_blocks");
  EXPECT_EQ(blocks.dtype, DType::U8);
  EXPECT_EQ(shape_of(blocks), (std::vector<int64_t>{16, 256, 4, 16}));
  const TensorView& scales = file.tensor("model.layers.0.mlp.experts.gate_up_proj_scales");
  EXPECT_EQ(scales.dtype, DType::U8);
  EXPECT_EQ(shape_of(scales), (std::vector<int64_t>{16, 256, 4}));
  const TensorView& down = file.tensor("model.layers.2.mlp.experts.down_proj_blocks");
  EXPECT_EQ(shape_of(down), (std::vector<int64_t>{16, 128, 4, 16}));
  const TensorView& q = file.tensor("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::BF16);
  EXPECT_EQ(shape_of(q), (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(shape_of(file.tensor("model.layers.1.self_attn.sinks")), (std::vector<int64_t>{4}));
  EXPECT_TRUE(file.contains("lm_head.weight"));
  EXPECT_FALSE(file.contains("__metadata__"));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.names().size(), 60u);

  // The first tensor starts right after the header: check the data pointer against the raw bytes.
  const std::string bytes = test::read_file(path);
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  const TensorView& lm_head = file.tensor("lm_head.weight");
  EXPECT_EQ(std::memcmp(lm_head.data, bytes.data() + 8 + header_size, lm_head.nbytes()), 0);
}

TEST(SafetensorsFile, ReadsQwen3Fixtures) {
  SafetensorsFile dense(test::fixtures_dir() / "qwen3-tiny" / "model.safetensors");
  EXPECT_FALSE(dense.contains("lm_head.weight"));  // tied embeddings
  EXPECT_EQ(shape_of(dense.tensor("model.embed_tokens.weight")), (std::vector<int64_t>{1024, 128}));
  EXPECT_EQ(shape_of(dense.tensor("model.layers.0.self_attn.q_norm.weight")), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape_of(dense.tensor("model.layers.2.mlp.down_proj.weight")), (std::vector<int64_t>{128, 320}));

  SafetensorsFile moe(test::fixtures_dir() / "qwen3moe-tiny" / "model.safetensors");
  const TensorView& gate = moe.tensor("model.layers.1.mlp.experts.15.gate_proj.weight");
  EXPECT_EQ(gate.dtype, DType::BF16);
  EXPECT_EQ(shape_of(gate), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shape_of(moe.tensor("model.layers.0.mlp.gate.weight")), (std::vector<int64_t>{16, 128}));
}

TEST(SafetensorsFile, UnknownTensorNamesFileAndTensor) {
  const auto path = test::fixtures_dir() / "qwen3-tiny" / "model.safetensors";
  SafetensorsFile file(path);
  const std::string message = error_of([&] { file.tensor("no.such.tensor"); });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("no.such.tensor"));
}

TEST(SafetensorsWrite, RoundTrip) {
  test::TempDir dir;
  const auto path = dir.path() / "out.safetensors";
  const std::vector<float> floats = {1.0f, -2.5f, 3.25f, 0.0f, 1e-7f, 65504.0f};
  const std::vector<uint16_t> halves = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f), f32_to_bf16(3.0f)};
  const std::vector<uint8_t> bytes = {0, 1, 2, 254, 255};
  const int64_t scalar = -1234567890123;
  write_safetensors(path,
                    {{"weights", {DType::F32, {2, 3}, floats.data()}},
                     {"bf16", {DType::BF16, {3}, halves.data()}},
                     {"codes", {DType::U8, {5}, bytes.data()}},
                     {"step", {DType::I64, {}, &scalar}},
                     {"empty", {DType::F32, {0, 4}, nullptr}}},
                    {{"format", "pt"}, {"note", "written by anvil"}});

  // The header is space-padded to a multiple of 8, as the reference writer does.
  const std::string raw = test::read_file(path);
  uint64_t header_size;
  std::memcpy(&header_size, raw.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_size + floats.size() * 4 + halves.size() * 2 + bytes.size() + 8);
  EXPECT_EQ(raw.substr(8, 1), "{");

  SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"bf16", "codes", "empty", "step", "weights"}));
  EXPECT_EQ(file.metadata().at("note"), "written by anvil");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const TensorView& weights = file.tensor("weights");
  EXPECT_EQ(weights.dtype, DType::F32);
  EXPECT_EQ(shape_of(weights), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(weights.data, floats.data(), floats.size() * 4), 0);
  // Data follows in the order given, starting right after the header.
  EXPECT_EQ(static_cast<const char*>(weights.data) - static_cast<const char*>(file.tensor("bf16").data),
            -std::ptrdiff_t(6 * 4));
  EXPECT_EQ(std::memcmp(file.tensor("bf16").data, halves.data(), halves.size() * 2), 0);
  EXPECT_EQ(std::memcmp(file.tensor("codes").data, bytes.data(), bytes.size()), 0);
  const TensorView& step = file.tensor("step");
  EXPECT_TRUE(step.shape.empty());
  EXPECT_EQ(step.nbytes(), 8u);
  int64_t step_value;  // follows five u8 bytes, so not 8-byte aligned
  std::memcpy(&step_value, step.data, sizeof step_value);
  EXPECT_EQ(step_value, scalar);
  EXPECT_EQ(file.tensor("empty").nbytes(), 0u);

  // Overwriting a file that is still mapped must leave the old mapping readable.
  const std::vector<float> other = {9.0f};
  write_safetensors(path, {{"weights", {DType::F32, {1}, other.data()}}});
  EXPECT_EQ(std::memcmp(weights.data, floats.data(), floats.size() * 4), 0);
  SafetensorsFile rewritten(path);
  EXPECT_EQ(rewritten.names(), (std::vector<std::string>{"weights"}));
  EXPECT_TRUE(rewritten.metadata().empty());
}

TEST(SafetensorsWrite, RejectsDuplicateNames) {
  test::TempDir dir;
  const float value = 1.0f;
  const auto path = dir.path() / "dup.safetensors";
  const std::string message = error_of([&] {
    write_safetensors(path, {{"x", {DType::F32, {1}, &value}}, {"x", {DType::F32, {1}, &value}}});
  });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("'x'"));
}

class SafetensorsBadFile : public ::testing::Test {
 protected:
  // Writes the bytes and returns the message of the error that opening them raises.
  std::string open_error(const std::string& bytes) {
    test::write_file(path_, bytes);
    const std::string message = error_of([&] { SafetensorsFile file(path_); });
    EXPECT_THAT(message, HasSubstr(path_.string()));
    return message;
  }

  test::TempDir dir_;
  std::filesystem::path path_ = dir_.path() / "bad.safetensors";
};

TEST_F(SafetensorsBadFile, MissingFile) {
  const std::string message = error_of([&] { SafetensorsFile file(path_); });
  EXPECT_THAT(message, HasSubstr("cannot open " + path_.string()));
  EXPECT_THAT(message, HasSubstr("No such file"));
}

TEST_F(SafetensorsBadFile, TruncatedFile) {
  EXPECT_THAT(open_error(std::string("\x10\0\0", 3)), HasSubstr("too short"));
  EXPECT_THAT(open_error(""), HasSubstr("0 bytes"));
}

TEST_F(SafetensorsBadFile, HeaderLengthBeyondFile) {
  std::string bytes = raw_file("{}", "");
  const uint64_t huge = 1000;
  std::memcpy(bytes.data(), &huge, 8);
  const std::string message = open_error(bytes);
  EXPECT_THAT(message, HasSubstr("header length 1000"));
  EXPECT_THAT(message, HasSubstr("larger than the file"));
}

TEST_F(SafetensorsBadFile, CorruptHeaderJson) {
  EXPECT_THAT(open_error(raw_file("{\"a\": {\"dtype\": \n", "")), HasSubstr("not valid JSON"));
  EXPECT_THAT(open_error(raw_file("[1, 2]", "")), HasSubstr("must be a JSON object"));
}

TEST_F(SafetensorsBadFile, UnknownDtype) {
  const std::string message =
      open_error(raw_file(R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", "x"));
  EXPECT_THAT(message, HasSubstr("'w'"));
  EXPECT_THAT(message, HasSubstr("unknown dtype 'F4'"));
}

TEST_F(SafetensorsBadFile, ShapeOffsetMismatch) {
  const std::string message = open_error(raw_file(
      R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})", std::string(16, 'x')));
  EXPECT_THAT(message, HasSubstr("'w'"));
  EXPECT_THAT(message, HasSubstr("[2, 3]"));
  EXPECT_THAT(message, HasSubstr("12 bytes"));
  EXPECT_THAT(message, HasSubstr("10 bytes"));
}

TEST_F(SafetensorsBadFile, OffsetsOutOfFile) {
  const std::string message = open_error(
      raw_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", std::string(20, 'x')));
  EXPECT_THAT(message, HasSubstr("'a'"));
  EXPECT_THAT(message, HasSubstr("beyond the end of the file"));
}

TEST_F(SafetensorsBadFile, BeginAfterEnd) {
  const std::string message = open_error(
      raw_file(R"({"b": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})", std::string(8, 'x')));
  EXPECT_THAT(message, HasSubstr("'b'"));
  EXPECT_THAT(message, HasSubstr("begin after end"));
}

TEST_F(SafetensorsBadFile, NegativeDimension) {
  const std::string message = open_error(
      raw_file(R"({"c": {"dtype": "U8", "shape": [-2, 2], "data_offsets": [0, 4]}})", std::string(4, 'x')));
  EXPECT_THAT(message, HasSubstr("'c'"));
  EXPECT_THAT(message, HasSubstr("negative dimension"));
}

TEST_F(SafetensorsBadFile, OverflowingShape) {
  const std::string message = open_error(
      raw_file(R"({"d": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 0]}})", ""));
  EXPECT_THAT(message, HasSubstr("'d'"));
  EXPECT_THAT(message, HasSubstr("too large"));
}

TEST_F(SafetensorsBadFile, MalformedEntries) {
  EXPECT_THAT(open_error(raw_file(R"({"e": {"shape": [1], "data_offsets": [0, 1]}})", "x")),
              HasSubstr("tensor 'e': missing string 'dtype'"));
  EXPECT_THAT(open_error(raw_file(R"({"e": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", "x")),
              HasSubstr("tensor 'e': data_offsets"));
  EXPECT_THAT(open_error(raw_file(R"({"e": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", "x")),
              HasSubstr("tensor 'e': data_offsets"));
  EXPECT_THAT(open_error(raw_file(R"({"__metadata__": {"k": 1}})", "")), HasSubstr("__metadata__ value 'k'"));
}

// Writes two shards and the index that maps tensors to them.
class CheckpointSharded : public ::testing::Test {
 protected:
  void write_shards(const std::string& index_text) {
    write_safetensors(dir_.path() / "model-00001-of-00002.safetensors",
                      {{"a", {DType::F32, {2}, a_.data()}}, {"b", {DType::U8, {3}, b_.data()}}});
    write_safetensors(dir_.path() / "model-00002-of-00002.safetensors",
                      {{"c", {DType::F32, {1}, c_.data()}}});
    test::write_file(dir_.path() / "model.safetensors.index.json", index_text);
  }

  static constexpr const char* kIndex = R"({
    "metadata": {"total_size": 16},
    "weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"
    }
  })";

  test::TempDir dir_;
  std::vector<float> a_ = {1.0f, 2.0f};
  std::vector<uint8_t> b_ = {7, 8, 9};
  std::vector<float> c_ = {3.0f};
};

TEST_F(CheckpointSharded, ReadsShardsFromIndex) {
  write_shards(kIndex);
  // Files not in the index are never opened, even when they look like shards.
  test::write_file(dir_.path() / "model-00003-of-00002.safetensors", "garbage");
  Checkpoint checkpoint(dir_.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(checkpoint.contains("c"));
  EXPECT_FALSE(checkpoint.contains("d"));
  EXPECT_EQ(checkpoint.file_of("a"), dir_.path() / "model-00001-of-00002.safetensors");
  EXPECT_EQ(checkpoint.file_of("c"), dir_.path() / "model-00002-of-00002.safetensors");
  EXPECT_EQ(static_cast<const float*>(checkpoint.tensor("c").data)[0], 3.0f);
  EXPECT_EQ(static_cast<const uint8_t*>(checkpoint.tensor("b").data)[2], 9);
  EXPECT_EQ(checkpoint.total_bytes(), 2 * 4 + 3 + 4u);

  const std::string message = error_of([&] { checkpoint.tensor("d"); });
  EXPECT_THAT(message, HasSubstr(dir_.path().string()));
  EXPECT_THAT(message, HasSubstr("'d'"));
}

TEST_F(CheckpointSharded, MissingShard) {
  write_shards(kIndex);
  std::filesystem::remove(dir_.path() / "model-00002-of-00002.safetensors");
  const std::string message = error_of([&] { Checkpoint checkpoint(dir_.path()); });
  EXPECT_THAT(message, HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(message, HasSubstr((dir_.path() / "model.safetensors.index.json").string()));
  EXPECT_THAT(message, HasSubstr("missing"));
}

TEST_F(CheckpointSharded, DuplicateTensorAcrossShards) {
  write_shards(kIndex);
  write_safetensors(dir_.path() / "model-00002-of-00002.safetensors",
                    {{"a", {DType::F32, {2}, a_.data()}}, {"c", {DType::F32, {1}, c_.data()}}});
  const std::string message = error_of([&] { Checkpoint checkpoint(dir_.path()); });
  EXPECT_THAT(message, HasSubstr("'a'"));
  EXPECT_THAT(message, HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT(message, HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointSharded, IndexNamesTensorTheShardLacks) {
  write_shards(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                  "z": "model-00002-of-00002.safetensors"}})");
  const std::string message = error_of([&] { Checkpoint checkpoint(dir_.path()); });
  EXPECT_THAT(message, HasSubstr("'z'"));
  EXPECT_THAT(message, HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointSharded, CorruptIndex) {
  write_shards("{\"weight_map\": ");
  const std::string message = error_of([&] { Checkpoint checkpoint(dir_.path()); });
  EXPECT_THAT(message, HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(message, HasSubstr("not valid JSON"));
  write_shards(R"({"metadata": {}})");
  EXPECT_THAT(error_of([&] { Checkpoint checkpoint(dir_.path()); }), HasSubstr("weight_map"));
}

TEST(Checkpoint, SingleFileFixture) {
  const auto dir = test::fixtures_dir() / "gpt-oss-tiny";
  Checkpoint checkpoint(dir);
  EXPECT_EQ(checkpoint.names().size(), 60u);
  EXPECT_EQ(checkpoint.file_of("model.norm.weight"), dir / "model.safetensors");
  EXPECT_EQ(shape_of(checkpoint.tensor("model.layers.0.mlp.experts.gate_up_proj_blocks")),
            (std::vector<int64_t>{16, 256, 4, 16}));
  // The fixture packs its tensors end to end, so their sizes add up to the data section.
  const std::string bytes = test::read_file(dir / "model.safetensors");
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(checkpoint.total_bytes(), bytes.size() - 8 - header_size);
}

TEST(Checkpoint, EmptyDirectory) {
  test::TempDir dir;
  const std::string message = error_of([&] { Checkpoint checkpoint(dir.path()); });
  EXPECT_EQ(message, "no model.safetensors or model.safetensors.index.json in " + dir.path().string());
  EXPECT_THAT(error_of([&] { Checkpoint checkpoint(dir.path() / "absent"); }),
              HasSubstr((dir.path() / "absent").string()));
}

}  // namespace
}  // namespace anvil
