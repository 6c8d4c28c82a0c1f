// Prefix-cache files (tiny random checkpoints): a saved chain restored into
// another cache gives the same KV bytes and continues bit for bit; a file of
// another model, KV layout or arithmetic, a short, padded, corrupt, too long
// or missing file, or one with token ids outside the vocabulary, is an Error
// that caches nothing; saving is atomic. The folder is hostile: a symbolic
// link at a saved or temporary name is never written through, and a link,
// FIFO, directory or device is refused to restore, without blocking.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/prefix_cache.h"
#include "edgellm/prefix_cache_file.h"
#include "edgellm/session.h"
#include "runtime/confined_dir.h"
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

std::string contents(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_file(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
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
  fs::path dir = testing::make_temp_dir("kvfile");
  std::string name = "prefix.bin";
  fs::path file = dir / name;
  PrefixBlocks blocks;
  size_t written = 0;

  Saved() {
    logits = copy(context.prefill(p));
    PrefixCache::Chain chain = cache.match(p);
    cache.store(chain, p, context);
    blocks = copy_prefix_blocks(cache, chain, p);
    written = save_prefix_file(dir, name, fp, blocks);
  }
  // The file's bytes at `offset` overwritten by `bytes`.
  void patch(size_t offset, const std::string& bytes) const {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // Restores `name` from `folder` into a fresh cache: the error, "" when it
  // restored; a refused file caches nothing.
  std::string refusal(const fs::path& folder, const std::string& file_name,
                      const KvFingerprint& with) const {
    PrefixCache fresh(model, 100 * cache.block_bytes());
    const std::string e = error_of(
        [&] { cache_prefix_blocks(load_prefix_file(folder, file_name, with).blocks, fresh); });
    EXPECT_EQ(fresh.blocks(), e.empty() ? 3u : 0u) << file_name << ": " << e;
    return e;
  }
  std::string refusal(const fs::path& folder, const std::string& file_name) const {
    return refusal(folder, file_name, fp);
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
  const LoadedPrefix r = load_prefix_file(s.dir, s.name, fp);
  EXPECT_EQ(r.blocks.tokens, std::vector<int32_t>(s.p.begin(), s.p.begin() + 48));
  EXPECT_EQ(r.bytes, s.written);
  EXPECT_EQ(cache_prefix_blocks(r.blocks, fresh), 48u);
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
  const LoadedPrefix r = load_prefix_file(s.dir, s.name, s.fp);
  EXPECT_EQ(r.blocks.tokens.size(), 48u);
  EXPECT_EQ(cache_prefix_blocks(r.blocks, small), 32u);
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
  EXPECT_NE(s.refusal(s.dir, s.name, ofp).find("another model"), std::string::npos);

  // Another KV dtype: the header's fields name the difference.
  const Model fp32 = model_of(s.m, "fp32");
  Context fc(fp32);
  PrefixCache fcache(fp32, 100 * PrefixCache(fp32, 0).block_bytes());
  const std::string e = s.refusal(s.dir, s.name, kv_fingerprint(fp32, fcache, fc));
  EXPECT_NE(e.find("KV dtype bf16 (here fp32)"), std::string::npos) << e;

  // Other blocks (8 tokens) of the same model.
  PrefixCache eights(s.model, 100 * s.cache.block_bytes(), 8);
  const std::string b = s.refusal(s.dir, s.name, kv_fingerprint(s.model, eights, s.context));
  EXPECT_NE(b.find("block tokens 16 (here 8)"), std::string::npos) << b;
}

TEST(PrefixCacheFile, ShortPaddedCorruptOrMissingFilesAreErrors) {
  Saved s;
  auto refused = [&](const std::string& why) {
    SCOPED_TRACE(why);
    return s.refusal(s.dir, s.name);
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
}

TEST(PrefixCacheFile, SaveReplacesAtomicallyAndReportsWriteErrors) {
  Saved s;
  // Again over the same name: the new file replaces the old one whole.
  EXPECT_EQ(save_prefix_file(s.dir, s.name, s.fp, s.blocks), s.written);
  EXPECT_EQ(s.refusal(s.dir, s.name), "");
  const std::string e = error_of([&] { save_prefix_file(s.dir / "no", "x.bin", s.fp, s.blocks); });
  EXPECT_NE(e.find("cannot open the folder"), std::string::npos) << e;
  fs::create_directory(s.dir / "sub");  // a rename cannot replace a directory
  const std::string d = error_of([&] { save_prefix_file(s.dir, "sub", s.fp, s.blocks); });
  EXPECT_NE(d.find("sub: cannot write (Is a directory)"), std::string::npos) << d;
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(s.dir)) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"prefix.bin", "sub"})) << "no temporary file left";
}

TEST(PrefixCacheFile, TokenIdsOutsideTheVocabularyAreRefused) {
  Saved s;
  // Whole files (their check matches) that name ids the model does not have.
  for (const int32_t id : {s.fp.vocab_size, int32_t{-1}, int32_t{0x7fffffff}}) {
    PrefixBlocks bad = s.blocks;
    bad.tokens[21] = id;
    save_prefix_file(s.dir, "bad.bin", s.fp, bad);
    const std::string e = s.refusal(s.dir, "bad.bin");
    EXPECT_NE(e.find("bad.bin: token id " + std::to_string(id) +
                     " at position 21 is outside the vocabulary of " +
                     std::to_string(s.fp.vocab_size) + " tokens"),
              std::string::npos)
        << e;
  }
}

TEST(PrefixCacheFile, AFileLongerThanTheContextIsRefusedBeforeItIsRead) {
  Saved s;
  KvFingerprint shorter = s.fp;  // a server started with a shorter context
  shorter.max_tokens = 47;       // two whole blocks: the file has three
  const std::string e = s.refusal(s.dir, s.name, shorter);
  EXPECT_NE(e.find("promises 3 blocks of 16 tokens, more than the context of 47 tokens holds (2)"),
            std::string::npos)
      << e;
  shorter.max_tokens = 48;
  EXPECT_EQ(s.refusal(s.dir, s.name, shorter), "");
}

// An attacker who can write to the folder, and a file outside it that a save
// must never write.
struct Hostile : Saved {
  fs::path outside = testing::make_temp_dir("kvfile-outside");
  fs::path victim = outside / "victim";
  Hostile() { write_file(victim, "keep"); }
};

TEST(PrefixCacheFile, ASymbolicLinkAtTheSavedNameIsReplacedNotWrittenThrough) {
  Hostile h;
  fs::remove(h.file);
  fs::create_symlink(h.victim, h.file);
  EXPECT_EQ(save_prefix_file(h.dir, h.name, h.fp, h.blocks), h.written);
  EXPECT_EQ(contents(h.victim), "keep");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(h.file)));
  EXPECT_EQ(h.refusal(h.dir, h.name), "");
}

TEST(PrefixCacheFile, ASymbolicLinkAtATemporaryNameIsNeverWrittenThrough) {
  Hostile h;
  // The predictable name a save used to write first (DIR/.NAME.tmp<pid>).
  const fs::path old_tmp = h.dir / ("." + h.name + ".tmp" + std::to_string(getpid()));
  fs::create_symlink(h.victim, old_tmp);
  EXPECT_EQ(save_prefix_file(h.dir, h.name, h.fp, h.blocks), h.written);
  EXPECT_EQ(contents(h.victim), "keep");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(old_tmp)));

  // Whatever the name, the temporary file is created new: a link there, to a
  // file or to a name not yet taken outside the folder, is refused.
  const fs::path made = h.outside / "made";
  fs::create_symlink(h.victim, h.dir / ".taken");
  fs::create_symlink(made, h.dir / ".dangling");
  const ConfinedDir folder(h.dir);
  for (const std::string name : {".taken", ".dangling", "prefix.bin"}) {
    const std::string e = error_of([&] {
      const File f = folder.create_new(name);
      std::fputs("written", f.get());
    });
    EXPECT_NE(e.find(name + ": cannot create (File exists)"), std::string::npos) << e;
  }
  EXPECT_EQ(contents(h.victim), "keep");
  EXPECT_FALSE(fs::exists(made));
}

TEST(PrefixCacheFile, RestoreRefusesASymbolicLinkEvenToAGoodFile) {
  Hostile h;
  fs::rename(h.file, h.outside / "good.bin");
  fs::create_symlink(h.outside / "good.bin", h.file);
  EXPECT_NE(h.refusal(h.dir, h.name).find("prefix.bin: a symbolic link, which is not followed"),
            std::string::npos);
  EXPECT_EQ(h.refusal(h.outside, "good.bin"), "") << "the file itself is good";
}

TEST(PrefixCacheFile, NamesThatLeaveTheFolderAreRefused) {
  Hostile h;
  fs::rename(h.file, h.outside / "good.bin");
  const std::string up = "../" + h.outside.filename().string() + "/good.bin";
  for (const std::string& name : {up, h.outside.string() + "/good.bin", std::string(".."),
                                  std::string("."), std::string("")}) {
    EXPECT_NE(h.refusal(h.dir, name).find("not a plain file name"), std::string::npos) << name;
    const std::string e = error_of([&] { save_prefix_file(h.dir, name, h.fp, h.blocks); });
    EXPECT_NE(e.find("not a plain file name"), std::string::npos) << name << ": " << e;
  }
  EXPECT_EQ(contents(h.outside / "good.bin").size(), h.written) << "not replaced by a save";
}

TEST(PrefixCacheFile, AFifoIsRefusedWithoutWaitingForAWriter) {
  Saved s;
  const fs::path fifo = s.dir / "fifo.bin";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto restore = std::async(std::launch::async, [&] { return s.refusal(s.dir, "fifo.bin"); });
  if (restore.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "restoring a FIFO with no writer is still waiting after 5 s";
    close(open(fifo.c_str(), O_WRONLY | O_NONBLOCK));  // a writer comes and goes: it returns
  }
  EXPECT_NE(restore.get().find("fifo.bin: not a regular file (a FIFO)"), std::string::npos);
}

TEST(PrefixCacheFile, ADirectoryOrADeviceIsRefused) {
  Saved s;
  fs::create_directory(s.dir / "sub");
  EXPECT_NE(s.refusal(s.dir, "sub").find("sub: not a regular file (a directory)"),
            std::string::npos);
  EXPECT_NE(s.refusal("/dev", "zero").find("/dev/zero: not a regular file (a character device)"),
            std::string::npos);
}

}  // namespace
}  // namespace edgellm
