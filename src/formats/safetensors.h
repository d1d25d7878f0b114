#pragma once
// Safetensors checkpoints: one file or shards listed by model.safetensors.index.json. Files are
// memory-mapped; tensors are views into the mapping and live as long as the reader.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace anvil {

// One memory-mapped .safetensors file. The header is validated on open: JSON well-formed, known
// dtypes, shapes that match byte ranges, ranges inside the file and not overlapping the header.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& tensor(const std::string& name) const;  // throws naming file and tensor
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The header of one .safetensors file, read and validated as SafetensorsFile does (ranges
// included, against the file's size) without mapping or reading the tensor data: the views
// carry dtype and shape, and a null data pointer.
struct SafetensorsHeader {
  uint64_t file_size = 0;
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (never guessed from file names).
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& model_dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorView& tensor(const std::string& name) const;  // throws naming the directory and tensor
  // The file a tensor lives in, for error messages.
  const std::filesystem::path& file_of(const std::string& name) const;
  std::vector<std::string> names() const;
  // Sum of all tensor bytes (weights only, not headers).
  size_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Writes float32/bf16/u8... tensors to a .safetensors file (the `logits` verb, demo models, tests).
struct NamedTensor {
  std::string name;
  TensorView view;
};
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace anvil
