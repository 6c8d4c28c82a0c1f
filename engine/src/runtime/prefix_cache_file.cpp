#include "edgellm/prefix_cache_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>

#include "edgellm/error.h"

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

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

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
  return fp;
}

size_t save_prefix_file(const std::filesystem::path& path, const KvFingerprint& fingerprint,
                        const PrefixCache& cache, const PrefixCache::Chain& chain,
                        std::span<const int32_t> tokens) {
  check(chain.tokens() <= tokens.size() && cache.block_tokens() == fingerprint.block_tokens &&
            cache.block_bytes() == fingerprint.block_bytes,
        "save_prefix_file: a chain of another prompt, or a fingerprint of another cache");
  const std::string name = path.string();
  // Hidden (a leading '.') so that no file a client may name is ever the temporary.
  std::string hidden = ".";
  hidden += path.filename().string();
  hidden += ".tmp";
  hidden += std::to_string(getpid());
  const std::filesystem::path tmp = path.parent_path() / hidden;
  File f(std::fopen(tmp.c_str(), "wb"));
  if (!f) throw Error(name + ": cannot write (" + errno_text() + ")");
  Writer w(f.get());
  write_header(w, fingerprint, chain.size());
  w.put(tokens.data(), chain.tokens() * sizeof(int32_t));
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::span<const uint8_t> kv = cache.block_kv(chain, i);
    w.put(kv.data(), kv.size());
  }
  const uint64_t sum = w.hash.digest();
  w.put(sum);
  bool ok = w.ok && std::fflush(f.get()) == 0 && fsync(fileno(f.get())) == 0;
  const std::string why = errno_text();
  ok = std::fclose(f.release()) == 0 && ok;
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(name + ": cannot write (" + (ok ? ec.message() : why) + ")");
  }
  return w.bytes;
}

RestoredPrefix restore_prefix_file(const std::filesystem::path& path,
                                   const KvFingerprint& fingerprint, PrefixCache& cache) {
  const std::string name = path.string();
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(name + ": cannot open (" + errno_text() + ")");
  struct stat st {};
  if (fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(name + ": not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes + sizeof(uint64_t))
    throw Error(name + ": not a prefix-cache file (" + std::to_string(size) +
                " bytes, shorter than the header)");

  std::array<uint8_t, kHeaderBytes> header;
  read_exact(f.get(), header.data(), header.size(), name);
  const uint8_t* p = header.data();
  if (!std::equal(kMagic.begin(), kMagic.end(), reinterpret_cast<const char*>(p)))
    throw Error(name + ": not a prefix-cache file (no EDGLKVPC magic)");
  p += kMagic.size();
  const auto version = take<uint32_t>(p);
  if (version != kVersion)
    throw Error(name + ": prefix-cache file version " + std::to_string(version) +
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
    throw Error(name + ": saved from another model or KV layout: " + diff);
  if (file.model_hash != fingerprint.model_hash)
    throw Error(name + ": saved by another model or arithmetic (model hash " +
                hex(file.model_hash) + ", here " + hex(fingerprint.model_hash) + ")");

  const uint64_t per_block = uint64_t{file.block_tokens} * sizeof(int32_t) + file.block_bytes;
  const uint64_t body = size - kHeaderBytes - sizeof(uint64_t);
  if (blocks > body / per_block || blocks * per_block != body)
    throw Error(name + ": truncated or padded (" + std::to_string(size) +
                " bytes; its header promises " + std::to_string(blocks) + " blocks of " +
                std::to_string(per_block) + " bytes after a " + std::to_string(kHeaderBytes) +
                "-byte header, and an 8-byte check)");

  // First the whole file against its check, so that a corrupt one caches nothing.
  Hasher h;
  h.update(header.data(), header.size());
  std::vector<uint8_t> buf(size_t{1} << 20);
  for (uint64_t left = body; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    read_exact(f.get(), buf.data(), n, name);
    h.update(buf.data(), n);
    left -= n;
  }
  uint64_t sum = 0;
  read_exact(f.get(), &sum, sizeof sum, name);
  if (sum != h.digest()) throw Error(name + ": corrupt (its check does not match its contents)");

  RestoredPrefix out;
  out.bytes = static_cast<size_t>(size);
  out.tokens.resize(static_cast<size_t>(blocks * file.block_tokens));
  if (std::fseek(f.get(), static_cast<long>(kHeaderBytes), SEEK_SET) != 0)
    throw Error(name + ": seek failed (" + errno_text() + ")");
  read_exact(f.get(), out.tokens.data(), out.tokens.size() * sizeof(int32_t), name);
  std::vector<uint8_t> kv(static_cast<size_t>(file.block_bytes));
  PrefixCache::Chain chain;
  const std::span<const int32_t> all(out.tokens);
  for (size_t i = 0; i < blocks; ++i) {
    read_exact(f.get(), kv.data(), kv.size(), name);
    if (!cache.append(chain, all.subspan(i * file.block_tokens, file.block_tokens), kv)) break;
    out.cached_tokens += file.block_tokens;
  }
  return out;
}

}  // namespace edgellm
