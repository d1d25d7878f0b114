#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace anvil {
namespace {

using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data and tensors are handed out as views of it");

// nlohmann's messages quote the offending input; a newline there would break the one-line rule.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string json_type_of(const json& value) {
  if (value.is_number_unsigned() || value.is_number_integer()) return "integer";
  return value.type_name();
}

// Reads a non-negative JSON integer; the header stores sizes and offsets that must fit in u64.
bool read_u64(const json& value, uint64_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = uint64_t(value.get<int64_t>());
    return true;
  }
  return false;
}

struct Parsed {
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};

uint64_t header_length(const std::string& file, const uint8_t* first8, uint64_t file_size) {
  uint64_t header_size;
  std::memcpy(&header_size, first8, sizeof header_size);
  if (header_size > file_size - 8) {
    fail("{}: header length {} is larger than the file ({} bytes)", file, header_size, file_size);
  }
  return header_size;
}

// `header_begin` holds the header's JSON (`header_size` bytes); the data section follows it in
// the file and is `data_size` bytes long. `data` is where that section is mapped, or null when
// only the header was read (the views then carry no data).
Parsed parse_header(const std::string& file, const char* header_begin, uint64_t header_size, const uint8_t* data,
                    uint64_t data_size) {
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_size);
  } catch (const json::parse_error& e) {
    fail("{}: safetensors header is not valid JSON: {}", file, one_line(e.what()));
  }
  if (!header.is_object()) {
    fail("{}: safetensors header must be a JSON object, got {}", file, header.type_name());
  }

  Parsed parsed;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) fail("{}: __metadata__ must be an object, got {}", file, entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail("{}: __metadata__ value '{}' must be a string, got {}", file, key, json_type_of(value));
        }
        parsed.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object())
      fail("{}: tensor '{}': entry must be an object, got {}", file, name, entry.type_name());

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      fail("{}: tensor '{}': missing string 'dtype'", file, name);
    const std::string dtype_text = dtype_it->get<std::string>();
    const std::optional<DType> dtype = dtype_from_safetensors_name(dtype_text);
    if (!dtype) fail("{}: tensor '{}' has unknown dtype '{}'", file, name, dtype_text);

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array())
      fail("{}: tensor '{}': missing array 'shape'", file, name);
    TensorView view;
    view.dtype = *dtype;
    // Overflow is checked because a hostile header could otherwise wrap the size to match its range.
    uint64_t nbytes = dtype_size(*dtype);
    bool overflow = false;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_integer()) {
        fail("{}: tensor '{}': shape entries must be integers, got {}", file, name, json_type_of(dim));
      }
      if (!dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
        fail("{}: tensor '{}' has negative dimension {} in shape {}", file, name, dim.get<int64_t>(),
             shape_it->dump());
      }
      const uint64_t extent = dim.get<uint64_t>();
      if (extent > uint64_t(std::numeric_limits<int64_t>::max())) overflow = true;
      view.shape.push_back(int64_t(extent));
      overflow = overflow || __builtin_mul_overflow(nbytes, extent, &nbytes);
    }
    if (overflow) fail("{}: tensor '{}': shape {} is too large", file, name, shape_it->dump());

    const auto offsets_it = entry.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !read_u64((*offsets_it)[0], begin) || !read_u64((*offsets_it)[1], end)) {
      fail("{}: tensor '{}': data_offsets must be two non-negative integers [begin, end]", file, name);
    }
    if (begin > end)
      fail("{}: tensor '{}': data_offsets [{}, {}] have begin after end", file, name, begin, end);
    if (end > data_size) {
      fail(
          "{}: tensor '{}': data_offsets [{}, {}] extend beyond the end of the file (data section is {} "
          "bytes)",
          file, name, begin, end, data_size);
    }
    if (nbytes != end - begin) {
      fail("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] span {} bytes", file,
           name, shape_string(view.shape), dtype_text, nbytes, begin, end, end - begin);
    }
    view.data = data ? data + begin : nullptr;
    parsed.tensors.emplace(name, std::move(view));
  }
  return parsed;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", file, std::strerror(errno));
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail("cannot stat {}: {}", file, std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("cannot open {}: not a regular file", file);
  }
  const uint64_t file_size = uint64_t(info.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail("{}: file is {} bytes, too short for a safetensors header (needs at least 8)", file, file_size);
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) fail("cannot map {}: {}", file, std::strerror(map_error));
  mapping_ = mapping;
  mapping_size_ = file_size;
  // Loading reads every weight once, front to back; asking for it up front overlaps the disk reads
  // with header parsing and the caller's conversion work. Advice only, so a failure is harmless.
  ::madvise(mapping_, mapping_size_, MADV_WILLNEED);
  try {
    const auto* bytes = static_cast<const uint8_t*>(mapping_);
    const uint64_t header_size = header_length(file, bytes, file_size);
    Parsed parsed = parse_header(file, reinterpret_cast<const char*>(bytes + 8), header_size, bytes + 8 + header_size,
                                 file_size - 8 - header_size);
    tensors_ = std::move(parsed.tensors);
    metadata_ = std::move(parsed.metadata);
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    ::munmap(mapping_, mapping_size_);
    mapping_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapping_size_);
}

const TensorView& SafetensorsFile::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor named '{}'", path_.string(), name);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& entry : tensors_) result.push_back(entry.first);
  return result;
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("cannot open {}: No such file or directory", file);
  if (!std::filesystem::is_regular_file(path, ec)) fail("cannot open {}: not a regular file", file);
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot stat {}: {}", file, ec.message());
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for a safetensors header (needs at least 8)", file, file_size);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}: {}", file, std::strerror(errno));
  uint8_t first8[8];
  in.read(reinterpret_cast<char*>(first8), sizeof first8);
  if (!in) fail("cannot read {}", file);
  const uint64_t header_size = header_length(file, first8, file_size);
  // The format caps headers at 100 MB; a larger length is a corrupt or hostile file, and reading
  // it whole would be a memory hazard.
  if (header_size > (uint64_t(100) << 20)) fail("{}: header length {} exceeds the 100 MB limit", file, header_size);
  std::string text(header_size, '\0');
  in.read(text.data(), std::streamsize(header_size));
  if (!in) fail("cannot read the header of {}", file);
  Parsed parsed = parse_header(file, text.data(), header_size, nullptr, file_size - 8 - header_size);
  SafetensorsHeader header;
  header.file_size = file_size;
  header.tensors = std::move(parsed.tensors);
  header.metadata = std::move(parsed.metadata);
  return header;
}

Checkpoint::Checkpoint(const std::filesystem::path& model_dir) : dir_(model_dir) {
  const std::string dir = model_dir.string();
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    if (std::filesystem::exists(model_dir, ec)) fail("checkpoint {} is not a directory", dir);
    fail("cannot open checkpoint directory {}: No such file or directory", dir);
  }
  const auto index_path = model_dir / "model.safetensors.index.json";
  const auto single_path = model_dir / "model.safetensors";

  if (std::filesystem::exists(index_path, ec)) {
    const std::string index_name = index_path.string();
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("cannot open {}: {}", index_name, std::strerror(errno));
    json index;
    try {
      index = json::parse(in);
    } catch (const json::parse_error& e) {
      fail("{}: not valid JSON: {}", index_name, one_line(e.what()));
    }
    if (!index.is_object()) fail("{}: expected a JSON object", index_name);
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) fail("{}: missing object 'weight_map'", index_name);

    // Shard -> tensors the index places there; each shard is opened once however many tensors it holds.
    std::map<std::string, std::vector<std::string>> listed;
    for (const auto& [tensor_name, shard] : map_it->items()) {
      if (!shard.is_string()) {
        fail("{}: weight_map entry '{}' must be a file name, got {}", index_name, tensor_name,
             shard.type_name());
      }
      listed[shard.get<std::string>()].push_back(tensor_name);
    }
    if (listed.empty()) fail("{}: weight_map is empty", index_name);

    for (const auto& [shard, tensor_names] : listed) {
      const auto shard_path = model_dir / shard;
      if (!std::filesystem::is_regular_file(shard_path, ec)) {
        fail("{}: shard '{}' (listed for tensor '{}') is missing: {}", index_name, shard,
             tensor_names.front(), shard_path.string());
      }
      files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      const SafetensorsFile& opened = *files_.back();
      for (const std::string& tensor_name : tensor_names) {
        if (!opened.contains(tensor_name)) {
          fail("{}: tensor '{}' is listed in shard '{}' but {} does not contain it", index_name, tensor_name,
               shard, shard_path.string());
        }
      }
    }
  } else if (std::filesystem::exists(single_path, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path));
  } else {
    fail("no model.safetensors or model.safetensors.index.json in {}", dir);
  }

  for (const auto& file : files_) {
    for (const std::string& name : file->names()) {
      const auto [it, inserted] = where_.emplace(name, file.get());
      if (!inserted) {
        fail("{}: tensor '{}' appears in both {} and {}", dir, name, it->second->path().string(),
             file->path().string());
      }
    }
  }
}

const TensorView& Checkpoint::tensor(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail("{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second->tensor(name);
}

const std::filesystem::path& Checkpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail("{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second->path();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  result.reserve(where_.size());
  for (const auto& entry : where_) result.push_back(entry.first);
  return result;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, file] : where_) total += file->tensor(name).nbytes();
  return total;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  // Insertion order keeps the header in the same order as the data, which makes dumps readable.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const NamedTensor& tensor : tensors) {
    if (tensor.name == "__metadata__") fail("{}: '__metadata__' cannot be a tensor name", file);
    if (!seen.insert(tensor.name).second) fail("{}: tensor '{}' is written twice", file, tensor.name);
    for (int64_t dim : tensor.view.shape) {
      if (dim < 0)
        fail("{}: tensor '{}' has negative dimension in shape {}", file, tensor.name,
             shape_string(tensor.view.shape));
    }
    const uint64_t nbytes = tensor.view.nbytes();
    if (nbytes != 0 && tensor.view.data == nullptr) fail("{}: tensor '{}' has no data", file, tensor.name);
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.view.dtype))},
                           {"shape", tensor.view.shape},
                           {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    fail("{}: cannot encode header: {}", file, one_line(e.what()));
  }
  // The reference implementation pads with spaces so the data starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  // Written beside the target and renamed over it: truncating a file that some reader still has
  // mapped would turn that reader's accesses into SIGBUS.
  std::filesystem::path temp_path = path;
  temp_path += ".tmp";
  {
    std::ofstream out(temp_path, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {}: {}", temp_path.string(), std::strerror(errno));
    uint8_t length[8];
    const uint64_t header_size = header_text.size();
    std::memcpy(length, &header_size, sizeof length);
    out.write(reinterpret_cast<const char*>(length), sizeof length);
    out.write(header_text.data(), std::streamsize(header_text.size()));
    for (const NamedTensor& tensor : tensors) {
      out.write(static_cast<const char*>(tensor.view.data), std::streamsize(tensor.view.nbytes()));
    }
    out.flush();
    if (!out) {
      const int error = errno;
      out.close();
      std::error_code ignored;
      std::filesystem::remove(temp_path, ignored);
      fail("cannot write {}: {}", temp_path.string(), std::strerror(error));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temp_path, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp_path, ignored);
    fail("cannot write {}: {}", file, ec.message());
  }
}

}  // namespace anvil
