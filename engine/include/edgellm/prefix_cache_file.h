// A prompt's prefix-cache blocks in a file, so that the KV of a long prompt (a
// system prompt) outlives the process: `edgellm serve --slot-save-path DIR`
// writes them with POST /slots/{id}?action=save and reads them back into a new
// server's cache with action=restore. A restored block is the bytes the prefill
// computed, so a request that hits it answers bit for bit as with a live cache.
//
// Layout, every number little-endian (the host's: x86 and Arm Linux both are):
//   header  "EDGLKVPC"  u32 version  u32 block_tokens  u32 layers  u32 kv_heads
//           u32 head_dim  char kv_dtype[8] (zero-padded)  u64 block_bytes
//           u64 model_hash  u64 blocks
//   tokens  i32 x blocks * block_tokens: the prompt the blocks prefix
//   kv      block_bytes x blocks: each block's Context::save_kv bytes
//   check   u64: a hash of every byte before it
// A file is only read back by a cache of the same fingerprint (the header
// fields up to blocks); anything else, and a short or corrupt file, is an
// Error naming the file and the difference, and caches nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "edgellm/prefix_cache.h"
#include "edgellm/session.h"

namespace edgellm {

// What a block's bytes mean: their layout, and which model and arithmetic
// computed them.
struct KvFingerprint {
  uint32_t block_tokens = 0, layers = 0, kv_heads = 0, head_dim = 0;
  std::string kv_dtype;  // Model::kv_cache_dtype()
  uint64_t block_bytes = 0;
  // A hash of the KV a fixed probe prompt computes (with the layout and the
  // vocabulary's size): it differs between checkpoints of one architecture (a
  // base model and its fine-tune), precisions and ISA tiers whenever their KV
  // bytes do, which is exactly when a block could not be reused.
  uint64_t model_hash = 0;
};

// The fingerprint of `cache`'s blocks for `model`. `probe` is any Context of
// the model: its first kMinPrefillChunk positions are overwritten (one short
// prefill, a few milliseconds on a small model).
KvFingerprint kv_fingerprint(const Model& model, const PrefixCache& cache, Context& probe);

// Writes the blocks of `chain`, the cached prefix of `tokens`, to `path`
// atomically (a hidden temporary file beside it, flushed, then renamed over
// it). Returns the bytes written; Error when the file cannot be written.
size_t save_prefix_file(const std::filesystem::path& path, const KvFingerprint& fingerprint,
                        const PrefixCache& cache, const PrefixCache::Chain& chain,
                        std::span<const int32_t> tokens);

struct RestoredPrefix {
  std::vector<int32_t> tokens;  // the prompt prefix the file's blocks cover
  size_t cached_tokens = 0;     // of those, now in the cache (fewer when the budget is full)
  size_t bytes = 0;             // the file's size
};

// Checks a file save_prefix_file wrote (fingerprint, size, check hash) and
// stores its blocks in `cache`. Error for a missing, short or corrupt file, or
// one another fingerprint wrote; nothing is cached then.
RestoredPrefix restore_prefix_file(const std::filesystem::path& path,
                                   const KvFingerprint& fingerprint, PrefixCache& cache);

}  // namespace edgellm
