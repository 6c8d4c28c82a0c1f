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
// fields up to blocks); anything else, and a short, long or corrupt file, is
// an Error naming the file and the difference, and caches nothing. Files are
// named by clients and live in a folder others may write to: they are never
// read or written outside it, and never waited on (runtime/confined_dir.h).
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
  // Not in the file: the bounds a file's contents must fit here, checked
  // before anything is allocated for them.
  size_t max_tokens = 0;   // the model's context: no saved prompt is longer
  int32_t vocab_size = 0;  // every token id is in [0, vocab_size)
};

// The fingerprint of `cache`'s blocks for `model`. `probe` is any Context of
// the model: its first kMinPrefillChunk positions are overwritten (one short
// prefill, a few milliseconds on a small model).
KvFingerprint kv_fingerprint(const Model& model, const PrefixCache& cache, Context& probe);

// A prompt prefix's cached blocks copied out of the cache: what a file holds.
// The cache is the scheduler thread's and a file may be slow, so the blocks
// are copied there (memory only) and the file is read or written elsewhere.
struct PrefixBlocks {
  std::vector<int32_t> tokens;  // the prompt prefix the blocks cover: whole blocks
  std::vector<uint8_t> kv;      // each block's Context::save_kv bytes, block_bytes apiece
};

// The blocks of `chain`, the cached prefix of `tokens`.
PrefixBlocks copy_prefix_blocks(const PrefixCache& cache, const PrefixCache::Chain& chain,
                                std::span<const int32_t> tokens);

// Stores `blocks` in `cache`, first to last while they fit its budget; returns
// the tokens they cover that are now cached.
size_t cache_prefix_blocks(const PrefixBlocks& blocks, PrefixCache& cache);

// Writes `blocks` to the file `name` in the folder `dir` (one plain path
// component) atomically, never through a symbolic link or other file of that
// name (runtime/confined_dir.h, internal). Returns the bytes written; Error when
// the file cannot be written.
size_t save_prefix_file(const std::filesystem::path& dir, const std::string& name,
                        const KvFingerprint& fingerprint, const PrefixBlocks& blocks);

struct LoadedPrefix {
  PrefixBlocks blocks;
  size_t bytes = 0;  // the file's size
};

// Reads and checks a file save_prefix_file wrote: a regular file of the
// folder (a symbolic link, FIFO or device is refused without waiting on it),
// of this fingerprint, no longer than the context, whole (its check hash) and
// whose token ids are in the vocabulary. Error naming the file otherwise.
LoadedPrefix load_prefix_file(const std::filesystem::path& dir, const std::string& name,
                              const KvFingerprint& fingerprint);

}  // namespace edgellm
