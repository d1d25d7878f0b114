#pragma once
// Where a model's tensors come from: a checkpoint on disk, or deterministic random values of the
// same shapes (--load-format dummy, for benchmarks at real sizes without weight files). Model files
// ask for each tensor with the shape their config implies; a checkpoint whose tensor disagrees is
// a one-line error naming the file, tensor and both shapes.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/linear.h"
#include "core/tensor.h"

namespace anvil {

class Checkpoint;

// How a dummy tensor's values are made (see DummyWeights in weights.cpp). A device backend that
// gets one from WeightSource::dummy_recipe generates the tensor itself, value for value the same.
struct DummyRecipe {
  enum class Kind { Uniform, Norm, RandomBytes, Constant } kind = Kind::Uniform;
  uint64_t name_hash = 0;
  float bound = 0.0f;
  uint8_t constant = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // `preferred` is the dtype generated for dummy weights; a checkpoint may hold any of `accepted`.
  virtual TensorView get(const std::string& name, const std::vector<int64_t>& shape, DType preferred,
                         std::initializer_list<DType> accepted) = 0;
  virtual bool has(const std::string& name) const = 0;
  // For dummy sources: how `name` would be generated, without generating it (the caller makes
  // it, e.g. on a GPU, and counts its bytes with count_external). Empty for checkpoints.
  virtual std::optional<DummyRecipe> dummy_recipe(const std::string& name, const std::vector<int64_t>& shape,
                                                  DType dtype) const {
    return std::nullopt;
  }
  void count_external(size_t bytes) { bytes_loaded_ += bytes; }
  // Bytes of all tensors handed out so far.
  size_t bytes_loaded() const { return bytes_loaded_; }

 protected:
  size_t bytes_loaded_ = 0;
};

std::unique_ptr<WeightSource> open_checkpoint_weights(const std::filesystem::path& model_dir);
std::unique_ptr<WeightSource> make_dummy_weights(uint64_t seed);

// Hands out dummy weights and remembers every tensor, so that building a model through it lists
// exactly the tensors a checkpoint of that config holds (used to write demo checkpoints).
class RecordingDummyWeights : public WeightSource {
 public:
  explicit RecordingDummyWeights(uint64_t seed);
  TensorView get(const std::string& name, const std::vector<int64_t>& shape, DType preferred,
                 std::initializer_list<DType> accepted) override;
  bool has(const std::string& name) const override;
  const std::vector<std::pair<std::string, TensorView>>& tensors() const { return tensors_; }

 private:
  std::unique_ptr<WeightSource> dummy_;
  std::vector<std::pair<std::string, TensorView>> tensors_;
};

// Float tensors (F32/BF16/F16) used whole: norms, biases, sinks. Converted once to float32.
std::vector<float> load_f32(WeightSource& source, const std::string& name, const std::vector<int64_t>& shape);

// A dense linear layer `prefix.weight` [out, in] (+ `prefix.bias` when has_bias) in the stored
// float format, used in place (no copy). The bias, when present, is converted into `bias_storage`.
LinearWeight load_dense_linear(WeightSource& source, const std::string& prefix, int64_t out, int64_t in,
                               bool has_bias, std::vector<float>& bias_storage);

}  // namespace anvil
