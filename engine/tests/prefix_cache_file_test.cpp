// Prefix-cache files (tiny random checkpoints): a saved chain restored into
// another cache gives the same KV bytes and continues bit for bit; a file of
// another model, KV layout or arithmetic, a short, padded, corrupt or missing
// file is an Error that caches nothing; saving is atomic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/prefix_cache.h"
#include "edgellm/prefix_cache_file.h"
#include "edgellm/session.h"
#include "tiny_model.h"

namespace edgellm {
namespace {

namespace fs = std::filesystem;
using testing::TinyModel;
using testing::write_tiny_session_model;

constexpr const char* kLayout = R"(, "head_dim": 32, "max_position_embeddings": 128)";

Model model_of(const TinyModel& m, const std::string& kv = "bf16", int threads = 2) {
  SessionOptions o;
  o.threads = threads;
  o.max_context = 128;
  o.precision = "fast";
  o.kv_cache = kv;
  Model model;
  model.setup(m.dir, o);
  return model;
}

std::vector<int32_t> prompt(size_t n) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((5 * i + 2) % 90);
  return p;
}

std::vector<float> copy(std::span<const float> s) {
  return {s.begin(), s.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One model, a cache holding the blocks of a 60-token prompt (48 tokens: three
// whole blocks), and that chain saved to a file.
struct Saved {
  TinyModel m = write_tiny_session_model(kLayout);
  Model model = model_of(m);
  Context context{model};
  PrefixCache cache{model, 100 * PrefixCache(model, 0).block_bytes()};
  KvFingerprint fp = kv_fingerprint(model, cache, context);
  std::vector<int32_t> p = prompt(60);
  std::vector<float> logits;
  fs::path file = testing::make_temp_dir("kvfile") / "prefix.bin";
  size_t written = 0;

  Saved() {
    logits = copy(context.prefill(p));
    PrefixCache::Chain chain = cache.match(p);
    cache.store(chain, p, context);
    written = save_prefix_file(file, fp, cache, chain, p);
  }
  // The file's bytes at `offset` overwritten by `bytes`.
  void patch(size_t offset, const std::string& bytes) const {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
};

TEST(PrefixCacheFile, RoundTripGivesTheSameBytesAndContinuesBitForBit) {
  Saved s;
  EXPECT_EQ(s.written, fs::file_size(s.file));
  // Header, 48 token ids, three blocks, the check.
  EXPECT_EQ(s.written, 60 + 48 * 4 + 3 * s.cache.block_bytes() + 8);
  for (const auto& e : fs::directory_iterator(s.file.parent_path()))
    EXPECT_EQ(e.path().filename(), "prefix.bin") << "no temporary file is left behind";

  // A new process's cache: the same model loaded again (and with other threads).
  const Model again = model_of(s.m, "bf16", 1);
  Context probe(again);
  PrefixCache fresh(again, 100 * s.cache.block_bytes());
  const KvFingerprint fp = kv_fingerprint(again, fresh, probe);
  EXPECT_EQ(fp.model_hash, s.fp.model_hash) << "a property of the model, not of the process";
  const RestoredPrefix r = restore_prefix_file(s.file, fp, fresh);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(s.p.begin(), s.p.begin() + 48));
  EXPECT_EQ(r.cached_tokens, 48u);
  EXPECT_EQ(r.bytes, s.written);
  EXPECT_EQ(fresh.blocks(), 3u);

  PrefixCache::Chain live = s.cache.match(s.p), restored = fresh.match(s.p);
  ASSERT_EQ(restored.tokens(), 48u);
  for (size_t i = 0; i < 3; ++i) {
    const auto a = s.cache.block_kv(live, i), b = fresh.block_kv(restored, i);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "block " << i;
  }
  // As the scheduler would: whole blocks, leaving at least kMinPrefillChunk tokens to prefill.
  Context reused(again);
  fresh.load(restored, 32, reused);
  EXPECT_TRUE(same_bits(copy(reused.prefill(std::span(s.p).subspan(32), 32)), s.logits));
}

TEST(PrefixCacheFile, AFullCacheTakesTheFirstBlocks) {
  Saved s;
  PrefixCache small(s.model, 2 * s.cache.block_bytes());
  const RestoredPrefix r = restore_prefix_file(s.file, s.fp, small);
  EXPECT_EQ(r.tokens.size(), 48u);
  EXPECT_EQ(r.cached_tokens, 32u);
  EXPECT_EQ(small.match(s.p).tokens(), 32u);
}

TEST(PrefixCacheFile, AnotherModelLayoutOrArithmeticIsRefused) {
  Saved s;
  // The same architecture and KV layout, another checkpoint (rope_theta changes every K).
  const TinyModel other =
      write_tiny_session_model(std::string(kLayout) + R"(, "rope_theta": 500.0)");
  const Model o = model_of(other);
  Context oc(o);
  PrefixCache ocache(o, 100 * s.cache.block_bytes());
  const KvFingerprint ofp = kv_fingerprint(o, ocache, oc);
  EXPECT_EQ(ofp.block_bytes, s.fp.block_bytes);
  EXPECT_NE(ofp.model_hash, s.fp.model_hash);
  EXPECT_NE(error_of([&] { restore_prefix_file(s.file, ofp, ocache); }).find("another model"),
            std::string::npos);
  EXPECT_EQ(ocache.blocks(), 0u);

  // Another KV dtype: the header's fields name the difference.
  const Model fp32 = model_of(s.m, "fp32");
  Context fc(fp32);
  PrefixCache fcache(fp32, 100 * PrefixCache(fp32, 0).block_bytes());
  const std::string e =
      error_of([&] { restore_prefix_file(s.file, kv_fingerprint(fp32, fcache, fc), fcache); });
  EXPECT_NE(e.find("KV dtype bf16 (here fp32)"), std::string::npos) << e;
  EXPECT_EQ(fcache.blocks(), 0u);

  // Other blocks (8 tokens) of the same model.
  PrefixCache eights(s.model, 100 * s.cache.block_bytes(), 8);
  const std::string b = error_of(
      [&] { restore_prefix_file(s.file, kv_fingerprint(s.model, eights, s.context), eights); });
  EXPECT_NE(b.find("block tokens 16 (here 8)"), std::string::npos) << b;
}

TEST(PrefixCacheFile, ShortPaddedCorruptOrMissingFilesAreErrors) {
  Saved s;
  auto refused = [&](const std::string& why) {
    PrefixCache fresh(s.model, 100 * s.cache.block_bytes());
    const std::string e = error_of([&] { restore_prefix_file(s.file, s.fp, fresh); });
    EXPECT_EQ(fresh.blocks(), e.empty() ? 3u : 0u) << why;
    return e;
  };
  const std::vector<char> good = [&] {
    std::ifstream f(s.file, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
  }();
  auto rewrite = [&](size_t size) {
    std::ofstream f(s.file, std::ios::binary | std::ios::trunc);
    f.write(good.data(), static_cast<std::streamsize>(std::min(size, good.size())));
    if (size > good.size()) f.put('x');
  };
  for (size_t size :
       {size_t{0}, size_t{10}, size_t{60}, good.size() / 2, good.size() - 1, good.size() + 1}) {
    rewrite(size);
    const std::string e = refused(std::to_string(size) + " bytes");
    EXPECT_TRUE(e.find("truncated or padded") != std::string::npos ||
                e.find("shorter than the header") != std::string::npos)
        << size << " bytes: " << e;
  }
  rewrite(good.size());
  ASSERT_EQ(refused("intact"), "");  // restores again once whole

  s.patch(60 + 48 * 4 + 1000, "\x7f");  // one byte of the first block's KV
  EXPECT_NE(refused("a KV byte").find("corrupt"), std::string::npos);
  rewrite(good.size());
  s.patch(60, std::string("\x01\x02\x03\x04", 4));  // a token id
  EXPECT_NE(refused("a token").find("corrupt"), std::string::npos);
  rewrite(good.size());
  s.patch(0, "NOTAFILE");
  EXPECT_NE(refused("magic").find("not a prefix-cache file"), std::string::npos);
  rewrite(good.size());
  s.patch(8, std::string("\x09\0\0\0", 4));
  EXPECT_NE(refused("version").find("version 9"), std::string::npos);

  fs::remove(s.file);
  EXPECT_NE(refused("missing").find("No such file"), std::string::npos);
  s.file = s.file.parent_path();  // a directory
  EXPECT_NE(refused("directory").find("not a regular file"), std::string::npos);
}

TEST(PrefixCacheFile, SaveReplacesAtomicallyAndReportsWriteErrors) {
  Saved s;
  const PrefixCache::Chain chain = s.cache.match(s.p);
  // Again over the same name: the new file replaces the old one whole.
  EXPECT_EQ(save_prefix_file(s.file, s.fp, s.cache, chain, s.p), s.written);
  PrefixCache fresh(s.model, 100 * s.cache.block_bytes());
  EXPECT_EQ(restore_prefix_file(s.file, s.fp, fresh).cached_tokens, 48u);
  const std::string e = error_of(
      [&] { save_prefix_file(s.file.parent_path() / "no" / "x.bin", s.fp, s.cache, chain, s.p); });
  EXPECT_NE(e.find("cannot write"), std::string::npos) << e;
}

}  // namespace
}  // namespace edgellm
