#include "edgellm/prefix_cache_file.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "edgellm/error.h"
#include "runtime/confined_dir.h"

namespace edgellm {

namespace {

static_assert(std::endian::native == std::endian::little, "the file layout is little-endian");

constexpr std::array<char, 8> kMagic = {'E', 'D', 'G', 'L', 'K', 'V', 'P', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kDtypeChars = 8;
// magic, five u32 (version .. head_dim), the dtype, three u64 (block_bytes, model_hash, blocks).
constexpr size_t kHeaderBytes = kMagic.size() + 5 * 4 + kDtypeChars + 3 * 8;

// A streaming 64-bit hash (xxHash64's round and avalanche on one lane): any
// change confined to one 8-byte word always changes it, and it runs at about a
// byte a cycle, so checking a restored file costs milliseconds.
class Hasher {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    while (n > 0 && fill_ > 0) {
      push(*p++);
      --n;
    }
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      round(w);
    }
    while (n-- > 0) push(*p++);
  }
  uint64_t digest() const {
    uint64_t w = 0;
    std::memcpy(&w, buf_.data(), fill_);
    uint64_t h = std::rotl((h_ ^ total_) ^ (w * kP2), 31) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL,
                            kP3 = 0x165667B19E3779F9ULL;
  void round(uint64_t w) { h_ = std::rotl(h_ ^ (w * kP2), 31) * kP1; }
  void push(uint8_t b) {
    buf_[fill_++] = b;
    if (fill_ == 8) {
      uint64_t w;
      std::memcpy(&w, buf_.data(), 8);
      round(w);
      fill_ = 0;
    }
  }
  uint64_t h_ = 0x27D4EB2F165667C5ULL, total_ = 0;
  std::array<uint8_t, 8> buf_{};
  size_t fill_ = 0;
};

template <typename T>
void hash_value(Hasher& h, T v) {
  h.update(&v, sizeof v);
}

std::string errno_text() {
  return std::strerror(errno);
}

// Writes, and hashes, what goes into a file; remembers a failure.
struct Writer {
  explicit Writer(FILE* file) : f(file) {}
  FILE* f;
  Hasher hash;
  size_t bytes = 0;
  bool ok = true;

  void put(const void* data, size_t n) {
    hash.update(data, n);
    ok = ok && std::fwrite(data, 1, n, f) == n;
    bytes += n;
  }
  template <typename T>
  void put(T v) {
    put(&v, sizeof v);
  }
};

std::array<char, kDtypeChars> dtype_field(const std::string& dtype) {
  std::array<char, kDtypeChars> out{};
  std::copy_n(dtype.begin(), std::min(dtype.size(), out.size()), out.begin());
  return out;
}

void write_header(Writer& w, const KvFingerprint& fp, uint64_t blocks) {
  w.put(kMagic.data(), kMagic.size());
  w.put(kVersion);
  w.put(fp.block_tokens);
  w.put(fp.layers);
  w.put(fp.kv_heads);
  w.put(fp.head_dim);
  w.put(dtype_field(fp.kv_dtype).data(), kDtypeChars);
  w.put(fp.block_bytes);
  w.put(fp.model_hash);
  w.put(blocks);
}

// Reads exactly `n` bytes, or fails naming the file.
void read_exact(FILE* f, void* out, size_t n, const std::string& name) {
  if (std::fread(out, 1, n, f) != n)
    throw Error(name + ": read failed (" + (std::ferror(f) ? errno_text() : "end of file") + ")");
}

template <typename T>
T take(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}

// The differences of a header's fingerprint from this cache's, "" when none.
std::string differences(const KvFingerprint& file, const KvFingerprint& ours) {
  std::string out;
  auto field = [&](const char* name, const std::string& a, const std::string& b) {
    if (a != b) out += std::string(out.empty() ? "" : ", ") + name + " " + a + " (here " + b + ")";
  };
  auto num = [&](const char* name, uint64_t a, uint64_t b) {
    field(name, std::to_string(a), std::to_string(b));
  };
  num("layers", file.layers, ours.layers);
  num("kv heads", file.kv_heads, ours.kv_heads);
  num("head dim", file.head_dim, ours.head_dim);
  field("KV dtype", file.kv_dtype, ours.kv_dtype);
  num("block tokens", file.block_tokens, ours.block_tokens);
  num("block bytes", file.block_bytes, ours.block_bytes);
  return out;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

KvFingerprint kv_fingerprint(const Model& model, const PrefixCache& cache, Context& probe) {
  const ModelConfig& c = model.config();
  KvFingerprint fp;
  fp.block_tokens = static_cast<uint32_t>(cache.block_tokens());
  fp.layers = static_cast<uint32_t>(c.num_layers);
  fp.kv_heads = static_cast<uint32_t>(c.num_kv_heads);
  fp.head_dim = static_cast<uint32_t>(c.head_dim);
  fp.kv_dtype = model.kv_cache_dtype();
  fp.block_bytes = cache.block_bytes();
  // Any fixed ids will do: what matters is that every layer's weights, the
  // arithmetic and the kernels all shape the KV they leave.
  const int n = std::min(kMinPrefillChunk, model.max_context());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (7919 * i + 13) % c.vocab_size;
  probe.prefill(ids, 0);
  std::vector<uint8_t> kv(probe.kv_bytes(n));
  probe.save_kv(0, n, kv);
  Hasher h;
  h.update(kv.data(), kv.size());
  for (uint64_t v : {uint64_t{fp.block_tokens}, uint64_t{fp.layers}, uint64_t{fp.kv_heads},
                     uint64_t{fp.head_dim}, fp.block_bytes, static_cast<uint64_t>(c.vocab_size),
                     static_cast<uint64_t>(model.tokenizer().vocab_size())})
    hash_value(h, v);
  h.update(fp.kv_dtype.data(), fp.kv_dtype.size());
  fp.model_hash = h.digest();
  fp.max_tokens = static_cast<size_t>(model.max_context());
  fp.vocab_size = c.vocab_size;
  return fp;
}

PrefixBlocks copy_prefix_blocks(const PrefixCache& cache, const PrefixCache::Chain& chain,
                                std::span<const int32_t> tokens) {
  check(chain.tokens() <= tokens.size(), "copy_prefix_blocks: a chain of another prompt");
  PrefixBlocks out;
  out.tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(chain.tokens()));
  out.kv.reserve(chain.size() * cache.block_bytes());
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::span<const uint8_t> kv = cache.block_kv(chain, i);
    out.kv.insert(out.kv.end(), kv.begin(), kv.end());
  }
  return out;
}

size_t cache_prefix_blocks(const PrefixBlocks& blocks, PrefixCache& cache) {
  const size_t block_tokens = cache.block_tokens(), block_bytes = cache.block_bytes();
  const size_t n = blocks.tokens.size() / block_tokens;
  check(n * block_tokens == blocks.tokens.size() && n * block_bytes == blocks.kv.size(),
        "cache_prefix_blocks: blocks of another cache's size");
  const std::span<const int32_t> tokens(blocks.tokens);
  const std::span<const uint8_t> kv(blocks.kv);
  PrefixCache::Chain chain;
  size_t cached = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!cache.append(chain, tokens.subspan(i * block_tokens, block_tokens),
                      kv.subspan(i * block_bytes, block_bytes)))
      break;
    cached += block_tokens;
  }
  return cached;
}

size_t save_prefix_file(const std::filesystem::path& dir, const std::string& name,
                        const KvFingerprint& fingerprint, const PrefixBlocks& blocks) {
  const uint64_t n = blocks.tokens.size() / std::max<uint32_t>(fingerprint.block_tokens, 1);
  check(n * fingerprint.block_tokens == blocks.tokens.size() &&
            n * fingerprint.block_bytes == blocks.kv.size(),
        "save_prefix_file: blocks of another cache than the fingerprint's");
  const ConfinedDir folder(dir);
  size_t bytes = 0;
  folder.replace(name, [&](FILE* f) {
    Writer w(f);
    write_header(w, fingerprint, n);
    w.put(blocks.tokens.data(), blocks.tokens.size() * sizeof(int32_t));
    w.put(blocks.kv.data(), blocks.kv.size());
    const uint64_t sum = w.hash.digest();
    w.put(sum);
    bytes = w.bytes;
    return w.ok;
  });
  return bytes;
}

LoadedPrefix load_prefix_file(const std::filesystem::path& dir, const std::string& name,
                              const KvFingerprint& fingerprint) {
  const ConfinedDir folder(dir);
  const std::string path = folder.path_of(name);
  uint64_t size = 0;
  const File f = folder.open_regular(name, size);
  if (size < kHeaderBytes + sizeof(uint64_t))
    throw Error(path + ": not a prefix-cache file (" + std::to_string(size) +
                " bytes, shorter than the header)");

  std::array<uint8_t, kHeaderBytes> header;
  read_exact(f.get(), header.data(), header.size(), path);
  const uint8_t* p = header.data();
  if (!std::equal(kMagic.begin(), kMagic.end(), reinterpret_cast<const char*>(p)))
    throw Error(path + ": not a prefix-cache file (no EDGLKVPC magic)");
  p += kMagic.size();
  const auto version = take<uint32_t>(p);
  if (version != kVersion)
    throw Error(path + ": prefix-cache file version " + std::to_string(version) +
                "; this build reads version " + std::to_string(kVersion));
  KvFingerprint file;
  file.block_tokens = take<uint32_t>(p);
  file.layers = take<uint32_t>(p);
  file.kv_heads = take<uint32_t>(p);
  file.head_dim = take<uint32_t>(p);
  const auto dtype = take<std::array<char, kDtypeChars>>(p);
  file.kv_dtype.assign(dtype.data(), strnlen(dtype.data(), dtype.size()));
  file.block_bytes = take<uint64_t>(p);
  file.model_hash = take<uint64_t>(p);
  const auto blocks = take<uint64_t>(p);
  if (const std::string diff = differences(file, fingerprint); !diff.empty())
    throw Error(path + ": saved from another model or KV layout: " + diff);
  if (file.model_hash != fingerprint.model_hash)
    throw Error(path + ": saved by another model or arithmetic (model hash " +
                hex(file.model_hash) + ", here " + hex(fingerprint.model_hash) + ")");
  // Before anything is allocated for them: a saved prompt fits the context.
  const uint64_t max_blocks = fingerprint.max_tokens / file.block_tokens;
  if (blocks > max_blocks)
    throw Error(path + ": its header promises " + std::to_string(blocks) + " blocks of " +
                std::to_string(file.block_tokens) + " tokens, more than the context of " +
                std::to_string(fingerprint.max_tokens) + " tokens holds (" +
                std::to_string(max_blocks) + ")");

  const uint64_t per_block = uint64_t{file.block_tokens} * sizeof(int32_t) + file.block_bytes;
  const uint64_t body = size - kHeaderBytes - sizeof(uint64_t);
  if (blocks * per_block != body)
    throw Error(path + ": truncated or padded (" + std::to_string(size) +
                " bytes; its header promises " + std::to_string(blocks) + " blocks of " +
                std::to_string(per_block) + " bytes after a " + std::to_string(kHeaderBytes) +
                "-byte header, and an 8-byte check)");

  // The whole file against its check, so that a corrupt one caches nothing.
  LoadedPrefix out;
  out.bytes = static_cast<size_t>(size);
  PrefixBlocks& b = out.blocks;
  b.tokens.resize(static_cast<size_t>(blocks * file.block_tokens));
  b.kv.resize(static_cast<size_t>(blocks * file.block_bytes));
  read_exact(f.get(), b.tokens.data(), b.tokens.size() * sizeof(int32_t), path);
  read_exact(f.get(), b.kv.data(), b.kv.size(), path);
  uint64_t sum = 0;
  read_exact(f.get(), &sum, sizeof sum, path);
  Hasher h;
  h.update(header.data(), header.size());
  h.update(b.tokens.data(), b.tokens.size() * sizeof(int32_t));
  h.update(b.kv.data(), b.kv.size());
  if (sum != h.digest()) throw Error(path + ": corrupt (its check does not match its contents)");
  // A whole file may still have been written by hand: its ids index the vocabulary.
  for (size_t i = 0; i < b.tokens.size(); ++i)
    if (b.tokens[i] < 0 || b.tokens[i] >= fingerprint.vocab_size)
      throw Error(path + ": token id " + std::to_string(b.tokens[i]) + " at position " +
                  std::to_string(i) + " is outside the vocabulary of " +
                  std::to_string(fingerprint.vocab_size) + " tokens");
  return out;
}

}  // namespace edgellm
