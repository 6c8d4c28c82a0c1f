#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "io/mapped_file.h"

namespace edgellm {

size_t dtype_size(DType d) {
  return d == DType::f32 ? 4 : 2;
}
const char* dtype_name(DType d) {
  return d == DType::bf16 ? "BF16" : d == DType::f16 ? "F16" : "F32";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TensorView::release_pages() const {
  release_mapped_pages(data, nbytes);
}

Checkpoint::Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Checkpoint Checkpoint::from_views(std::map<std::string, TensorView> tensors) {
  Checkpoint ckpt;
  ckpt.tensors_ = std::move(tensors);
  return ckpt;
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint ckpt;
  const auto single = dir / "model.safetensors";
  const auto index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single)) {
    ckpt.add_file(single);
  } else if (std::filesystem::exists(index)) {
    const nlohmann::json j = read_json_file(index);
    check(j.contains("weight_map") && j["weight_map"].is_object(),
          index.string() + ": field 'weight_map' is missing");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      check(file.is_string(), index.string() + ": weight_map['" + name + "'] must be a file name");
      const std::string f = file.get<std::string>();
      check(f.find('/') == std::string::npos,
            index.string() + ": shard '" + f + "' must sit beside the index");
      shards.insert(f);
    }
    for (const auto& f : shards) ckpt.add_file(dir / f);
  } else {
    throw Error(
        dir.string() +
        ": no model.safetensors or model.safetensors.index.json (is the checkpoint complete?)");
  }
  return ckpt;
}

void Checkpoint::add_file(const std::filesystem::path& path) {
  auto file = std::make_unique<MappedFile>(path);
  const std::string& name = file->path();
  const size_t size = file->size();
  check(size >= 8,
        name + ": truncated (" + std::to_string(size) + " bytes, no safetensors header)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);
  check(header_len <= size - 8, name + ": header length " + std::to_string(header_len) +
                                    " exceeds the file size " + std::to_string(size) +
                                    " (truncated?)");
  const nlohmann::json header =
      parse_json(std::string_view(reinterpret_cast<const char*>(file->data()) + 8, header_len),
                 name + ": corrupt header");
  check(header.is_object(), name + ": header must be a JSON object");
  const size_t data_start = 8 + header_len;
  const size_t data_size = size - data_start;
  for (const auto& [key, info] : header.items()) {
    if (key == "__metadata__") continue;
    const std::string where = name + ": tensor '" + key + "'";
    check(info.is_object() && info.contains("dtype") && info.contains("shape") &&
              info.contains("data_offsets"),
          where + " lacks dtype/shape/data_offsets");
    TensorView t;
    t.name = key;
    t.file = name;
    const std::string dtype = info["dtype"].is_string() ? info["dtype"].get<std::string>() : "?";
    if (dtype == "BF16")
      t.dtype = DType::bf16;
    else if (dtype == "F16")
      t.dtype = DType::f16;
    else if (dtype == "F32")
      t.dtype = DType::f32;
    else
      throw Error(where + " has dtype " + dtype + " (supported: BF16, F16, F32)");
    check(info["shape"].is_array(), where + ": shape must be a list");
    int64_t numel = 1;
    for (const auto& d : info["shape"]) {
      check(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() < (1ll << 40),
            where + ": bad dimension " + json_excerpt(d));
      t.shape.push_back(d.get<int64_t>());
      check(numel <= (1ll << 40) / std::max<int64_t>(1, t.shape.back()),
            where + ": shape too large");
      numel *= t.shape.back();
    }
    const auto& off = info["data_offsets"];
    check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
              off[1].is_number_unsigned(),
          where + ": data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    check(begin <= end && end <= data_size,
          where + ": data [" + std::to_string(begin) + ", " + std::to_string(end) +
              ") lies outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    t.nbytes = end - begin;
    check(t.nbytes == static_cast<uint64_t>(numel) * dtype_size(t.dtype),
          where + ": holds " + std::to_string(t.nbytes) + " bytes but its shape and dtype need " +
              std::to_string(numel * static_cast<int64_t>(dtype_size(t.dtype))));
    t.data = file->data() + data_start + begin;
    check(!tensors_.count(key), where + " appears twice in the checkpoint");
    tensors_.emplace(key, std::move(t));
  }
  files_.push_back(std::move(file));
}

}  // namespace edgellm
