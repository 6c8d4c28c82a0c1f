// Memory-mapped safetensors checkpoints (single file or sharded with
// model.safetensors.index.json). Every offset, size, dtype and shape is
// validated against the file before any tensor data is touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace edgellm {

enum class DType { bf16, f16, f32 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping; valid while the checkpoint lives
  size_t nbytes = 0;
  std::string file;  // for error messages

  int64_t numel() const;

  // Drops this tensor's pages from the process (the file stays mapped; a later
  // read faults them back in from the page cache). Setup calls it once a tensor
  // is packed, so peak memory is the packed copy, not packed + mapped.
  void release_pages() const;
};

class MappedFile;

class Checkpoint {
 public:
  // Opens <dir>/model.safetensors or the shards listed in the index.
  static Checkpoint open(const std::filesystem::path& dir);
  // Tensors that live elsewhere (a bare GGUF's, under HF names): the caller
  // keeps the memory they point into alive as long as the checkpoint.
  static Checkpoint from_views(std::map<std::string, TensorView> tensors);
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const TensorView* find(const std::string& name) const;  // nullptr when absent
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  Checkpoint();
  void add_file(const std::filesystem::path& file);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace edgellm
