#include "models/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>

#include "core/error.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"

namespace anvil {

namespace {

std::string accepted_names(std::initializer_list<DType> accepted) {
  std::string names;
  for (DType dtype : accepted) names += (names.empty() ? "" : "/") + std::string(dtype_name(dtype));
  return names;
}

class CheckpointWeights : public WeightSource {
 public:
  explicit CheckpointWeights(const std::filesystem::path& dir) : checkpoint_(dir), dir_(dir) {}

  TensorView get(const std::string& name, const std::vector<int64_t>& shape, DType,
                 std::initializer_list<DType> accepted) override {
    if (!checkpoint_.contains(name)) fail("{}: tensor '{}' is missing from the checkpoint", dir_.string(), name);
    const TensorView& view = checkpoint_.tensor(name);
    const std::string file = checkpoint_.file_of(name).string();
    if (view.shape != shape)
      fail("{}: tensor '{}' has shape {} but config.json implies {}", file, name, shape_string(view.shape),
           shape_string(shape));
    if (std::find(accepted.begin(), accepted.end(), view.dtype) == accepted.end())
      fail("{}: tensor '{}' has dtype {}; expected {}", file, name, dtype_name(view.dtype), accepted_names(accepted));
    bytes_loaded_ += view.nbytes();
    return view;
  }

  bool has(const std::string& name) const override { return checkpoint_.contains(name); }

 private:
  Checkpoint checkpoint_;
  std::filesystem::path dir_;
};

// Random values scaled so activations stay of order one through many layers: weights ~ U(-a, a)
// with a = sqrt(3 / fan_in), norms near 1, biases and sinks small. Each tensor's values depend only
// on the seed and its name, so a dummy model is the same on every run and every machine.
class DummyWeights : public WeightSource {
 public:
  explicit DummyWeights(uint64_t seed) : seed_(seed) {}

  TensorView get(const std::string& name, const std::vector<int64_t>& shape, DType preferred,
                 std::initializer_list<DType>) override {
    TensorView view;
    view.dtype = preferred;
    view.shape = shape;
    auto& storage = buffers_.emplace_back(view.nbytes());
    view.data = storage.data();
    fill(name, view, storage.data());
    bytes_loaded_ += view.nbytes();
    return view;
  }

  bool has(const std::string&) const override { return true; }

  std::optional<DummyRecipe> dummy_recipe(const std::string& name, const std::vector<int64_t>& shape,
                                          DType dtype) const override {
    DummyRecipe recipe;
    recipe.name_hash = std::hash<std::string>{}(name) ^ seed_;
    const int64_t fan_in = shape.empty() ? 1 : shape.back();
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = ends_with(name, "bias") || ends_with(name, "sinks");
    const bool is_scales = ends_with(name, "_scales");
    if (dtype == DType::U8 && is_scales) {
      // MXFP4 values average about 2.6 in magnitude; pick the power of two that brings the row to
      // roughly the same spread as a dense layer of the same fan-in.
      const int64_t mxfp4_fan_in = fan_in * 32;
      const int scale_exponent = -int(std::ceil(std::log2(std::sqrt(double(mxfp4_fan_in)) * 2.6)));
      recipe.kind = DummyRecipe::Kind::Constant;
      recipe.constant = uint8_t(127 + scale_exponent);
    } else if (dtype == DType::U8) {
      recipe.kind = DummyRecipe::Kind::RandomBytes;  // packed FP4 codes: uniformly random bytes
    } else if (is_norm) {
      recipe.kind = DummyRecipe::Kind::Norm;
    } else {
      recipe.kind = DummyRecipe::Kind::Uniform;
      recipe.bound = is_bias ? 0.1f : std::sqrt(3.0f / float(fan_in));
    }
    return recipe;
  }

 private:
  static bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
  }

  void fill(const std::string& name, const TensorView& view, uint8_t* bytes) const {
    const DummyRecipe recipe = *dummy_recipe(name, view.shape, view.dtype);
    const int64_t n = view.numel();
    constexpr int64_t kChunk = 1 << 16;
    default_thread_pool().parallel_for((n + kChunk - 1) / kChunk, [&](int64_t begin, int64_t end) {
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        uint64_t state = recipe.name_hash * 0x100000001b3ull + uint64_t(chunk);
        const int64_t first = chunk * kChunk, last = std::min(n, first + kChunk);
        if (recipe.kind == DummyRecipe::Kind::RandomBytes) {
          // Eight bytes per draw keeps 20B-parameter dummy models quick to build.
          for (int64_t i = first; i < last; i += 8) {
            const uint64_t random = splitmix64(state);
            std::memcpy(bytes + i, &random, size_t(std::min<int64_t>(8, last - i)));
          }
          continue;
        }
        if (recipe.kind == DummyRecipe::Kind::Constant) {
          std::memset(bytes + first, recipe.constant, size_t(last - first));
          continue;
        }
        for (int64_t i = first; i < last; ++i) {
          const uint64_t random = splitmix64(state);
          const float unit = float(random >> 40) / float(1 << 24) * 2.0f - 1.0f;  // U(-1, 1)
          const float value = recipe.kind == DummyRecipe::Kind::Norm ? 1.0f + 0.1f * unit : recipe.bound * unit;
          switch (view.dtype) {
            case DType::F32: reinterpret_cast<float*>(bytes)[i] = value; break;
            case DType::BF16: reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16(value); break;
            case DType::F16: reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_f16(value); break;
            default: fail("dummy weights cannot generate dtype {} for '{}'", dtype_name(view.dtype), name);
          }
        }
      }
    });
  }

  uint64_t seed_;
  std::deque<std::vector<uint8_t>> buffers_;
};

}  // namespace

std::unique_ptr<WeightSource> open_checkpoint_weights(const std::filesystem::path& model_dir) {
  return std::make_unique<CheckpointWeights>(model_dir);
}

std::unique_ptr<WeightSource> make_dummy_weights(uint64_t seed) { return std::make_unique<DummyWeights>(seed); }

RecordingDummyWeights::RecordingDummyWeights(uint64_t seed) : dummy_(make_dummy_weights(seed)) {}

TensorView RecordingDummyWeights::get(const std::string& name, const std::vector<int64_t>& shape, DType preferred,
                                      std::initializer_list<DType> accepted) {
  const TensorView view = dummy_->get(name, shape, preferred, accepted);
  tensors_.emplace_back(name, view);
  bytes_loaded_ += view.nbytes();
  return view;
}

bool RecordingDummyWeights::has(const std::string& name) const {
  for (const auto& [recorded, view] : tensors_)
    if (recorded == name) return true;
  return false;
}

std::vector<float> load_f32(WeightSource& source, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorView view = source.get(name, shape, DType::BF16, {DType::F32, DType::BF16, DType::F16});
  std::vector<float> values(size_t(view.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (view.dtype) {
      case DType::F32: values[i] = static_cast<const float*>(view.data)[i]; break;
      case DType::BF16: values[i] = bf16_to_f32(static_cast<const uint16_t*>(view.data)[i]); break;
      default: values[i] = f16_to_f32(static_cast<const uint16_t*>(view.data)[i]); break;
    }
  }
  return values;
}

LinearWeight load_dense_linear(WeightSource& source, const std::string& prefix, int64_t out, int64_t in,
                               bool has_bias, std::vector<float>& bias_storage) {
  const TensorView view = source.get(prefix + ".weight", {out, in}, DType::BF16, {DType::F32, DType::BF16, DType::F16});
  LinearWeight weight;
  weight.format = view.dtype == DType::F32 ? WeightFormat::F32
                  : view.dtype == DType::BF16 ? WeightFormat::BF16
                                              : WeightFormat::F16;
  weight.out_features = out;
  weight.in_features = in;
  weight.data = view.data;
  if (has_bias) {
    bias_storage = load_f32(source, prefix + ".bias", {out});
    weight.bias = bias_storage.data();
  }
  return weight;
}

}  // namespace anvil
