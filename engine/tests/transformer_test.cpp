// Tier-1 model tests on tiny random checkpoints (no download): the KV-cached
// decode path must reproduce a full prefill, for each family's flags.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "edgellm/bf16.h"
#include "edgellm/config.h"
#include "edgellm/error.h"
#include "edgellm/session.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "models/transformer.h"
#include "models/weights.h"
#include "test_util.h"
#include "tiny_model.h"

namespace edgellm {
namespace {

using testing::TinyModel;
using testing::write_tiny;
using testing::write_tiny_session_model;

std::vector<float> prefill_logits(Transformer& model, const std::vector<int32_t>& tokens,
                                  int vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  KvCache kv = model.new_kv_cache();
  Scratch scratch;
  model.forward(kv, scratch, tokens.data(), tokens.size(), 0, logits.data(), nullptr);
  return logits;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  EXPECT_LE(max_diff, 1e-4 * std::max(1.0, max_abs)) << what;
}

// The process's config (tests' set_isa / set_gemm_precision) with a KV dtype.
kernels::ExecConfig with_kv(kernels::KvDtype kv) {
  kernels::ExecConfig cfg = kernels::process_exec_config();
  cfg.kv = kv;
  return cfg;
}

class DecodeMatchesPrefill : public ::testing::TestWithParam<std::pair<std::string, std::string>> {
};

TEST_P(DecodeMatchesPrefill, AtEveryPosition) {
  const auto& [arch, extra] = GetParam();
  // This checks the KV cache and positions, to 1e-4: keep the prefill GEMM's
  // activations in fp32 like decode's (bf16 ones differ by their rounding,
  // which kernels_test bounds separately).
  const kernels::GemmPrecision saved = kernels::gemm_precision();
  kernels::set_gemm_precision(kernels::GemmPrecision::fp32);
  struct Restore {
    kernels::GemmPrecision p;
    ~Restore() { kernels::set_gemm_precision(p); }
  } restore{saved};
  TinyModel m = write_tiny(arch, extra);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  // Both cache dtypes: decode and prefill read the same rounded K/V.
  for (kernels::KvDtype kv_dtype : {kernels::KvDtype::fp32, kernels::KvDtype::bf16}) {
    Transformer model(m.config, load_weights(ckpt, m.config), 64, pool, prof, with_kv(kv_dtype));
    const std::vector<int32_t> tokens = {5, 17, 3,  96, 42, 8,
                                         0, 61, 23, 77, 11};  // longer than the window
    std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
    KvCache kv = model.new_kv_cache();
    Scratch scratch;
    model.forward(kv, scratch, tokens.data(), 3, 0, logits.data(), nullptr);
    for (size_t pos = 3; pos < tokens.size(); ++pos) {
      model.forward(kv, scratch, &tokens[pos], 1, pos, logits.data(), nullptr);
      const std::vector<int32_t> prefix(tokens.begin(),
                                        tokens.begin() + static_cast<std::ptrdiff_t>(pos + 1));
      expect_close(logits, prefill_logits(model, prefix, m.config.vocab_size),
                   arch + " " + std::string(kernels::kv_dtype_name(kv_dtype)) + " cache pos " +
                       std::to_string(pos));
    }
  }
}

// A bf16 cache holds the fp32 cache's K/V rounded to nearest even: exactly so
// in layer 0 (its K/V depend on the embeddings alone), and within bf16's
// rounding of the slightly different activations after it.
TEST_P(DecodeMatchesPrefill, Bf16CacheHoldsRoundedKeysAndValues) {
  const auto& [arch, extra] = GetParam();
  TinyModel m = write_tiny(arch, extra);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  Transformer f32(m.config, load_weights(ckpt, m.config), 16, pool, prof,
                  kernels::process_exec_config());
  Transformer b16(m.config, load_weights(ckpt, m.config), 16, pool, prof,
                  with_kv(kernels::KvDtype::bf16));
  EXPECT_EQ(b16.kv_cache_bytes() * 2, f32.kv_cache_bytes());
  const std::vector<int32_t> tokens = {5, 17, 3, 96, 42, 8, 0};
  std::vector<float> logits32(static_cast<size_t>(m.config.vocab_size)), logits16(logits32);
  KvCache kv32 = f32.new_kv_cache(), kv16 = b16.new_kv_cache();
  ASSERT_TRUE(kv16.k.empty() && kv16.v.empty() && kv32.k16.empty());
  Scratch scratch;
  f32.forward(kv32, scratch, tokens.data(), tokens.size(), 0, logits32.data(), nullptr);
  b16.forward(kv16, scratch, tokens.data(), tokens.size(), 0, logits16.data(), nullptr);
  const size_t layer = static_cast<size_t>(m.config.num_kv_heads) * 16 * m.config.head_dim;
  ASSERT_EQ(kv16.k16.size(), kv32.k.size());
  for (size_t i = 0; i < layer; ++i) {
    ASSERT_EQ(kv16.k16[i], float_to_bf16(kv32.k[i])) << arch << " key element " << i;
    ASSERT_EQ(kv16.v16[i], float_to_bf16(kv32.v[i])) << arch << " value element " << i;
  }
  for (size_t i = layer; i < kv32.k.size(); ++i) {
    const float k = kv32.k[i], v = kv32.v[i];
    EXPECT_NEAR(bf16_to_float(kv16.k16[i]), k, 0.02 * std::max(1.0f, std::fabs(k))) << i;
    EXPECT_NEAR(bf16_to_float(kv16.v16[i]), v, 0.02 * std::max(1.0f, std::fabs(v))) << i;
  }
}

// A q8_0 cache (head_dim 32: one block per key) holds the fp32 cache's K/V
// quantized by quantize_kv_q8_0: exactly so in layer 0 (its K/V depend on the
// embeddings alone); decode on it matches a prefill on it, as for the other
// dtypes; a head_dim that is not a multiple of 32 is refused.
TEST(TransformerKvQ8, CacheHoldsQuantizedKeysAndValues) {
  TinyModel m = write_tiny("LlamaForCausalLM", R"(, "head_dim": 32)");
  ASSERT_EQ(m.config.head_dim, 32);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  Transformer f32(m.config, load_weights(ckpt, m.config), 16, pool, prof,
                  kernels::process_exec_config());
  Transformer q8(m.config, load_weights(ckpt, m.config), 16, pool, prof,
                 with_kv(kernels::KvDtype::q8_0));
  EXPECT_EQ(q8.kv_cache_bytes() * 64, f32.kv_cache_bytes() * 17);  // 1.0625 vs 4 bytes
  const std::vector<int32_t> tokens = {5, 17, 3, 96, 42, 8, 0};
  const size_t vocab = static_cast<size_t>(m.config.vocab_size);
  std::vector<float> logits32(vocab), logits8(vocab);
  KvCache kv32 = f32.new_kv_cache(), kv8 = q8.new_kv_cache();
  ASSERT_TRUE(kv8.k.empty() && kv8.k16.empty() && kv32.k8.empty() && kv32.k_scale.empty());
  Scratch scratch;
  f32.forward(kv32, scratch, tokens.data(), tokens.size(), 0, logits32.data(), nullptr);
  q8.forward(kv8, scratch, tokens.data(), tokens.size(), 0, logits8.data(), nullptr);
  const size_t layer = static_cast<size_t>(m.config.num_kv_heads) * 16 * 32;
  ASSERT_EQ(kv8.k8.size(), kv32.k.size());
  ASSERT_EQ(kv8.k_scale.size(), kv32.k.size() / 32);
  std::vector<int8_t> kq(layer), vq(layer);
  std::vector<uint16_t> ks(layer / 32), vs(layer / 32);
  kernels::quantize_kv_q8_0(kv32.k.data(), layer, kq.data(), ks.data());
  kernels::quantize_kv_q8_0(kv32.v.data(), layer, vq.data(), vs.data());
  for (size_t i = 0; i < layer; ++i) {
    ASSERT_EQ(kv8.k8[i], kq[i]) << "key element " << i;
    ASSERT_EQ(kv8.v8[i], vq[i]) << "value element " << i;
    ASSERT_EQ(kv8.k_scale[i / 32], ks[i / 32]) << "key scale " << i / 32;
    ASSERT_EQ(kv8.v_scale[i / 32], vs[i / 32]) << "value scale " << i / 32;
  }
  // keys()/key_scales() of a layer's offset address that layer's data.
  EXPECT_EQ(kv8.keys(layer), kv8.k8.data() + layer);
  EXPECT_EQ(kv8.value_scales(layer), kv8.v_scale.data() + layer / 32);
  EXPECT_EQ(kv32.key_scales(layer), nullptr);
  // Decode on the q8_0 cache reproduces a prefill on one.
  KvCache kv = q8.new_kv_cache();
  std::vector<float> logits(vocab);
  q8.forward(kv, scratch, tokens.data(), 3, 0, logits.data(), nullptr);
  for (size_t pos = 3; pos < tokens.size(); ++pos) {
    q8.forward(kv, scratch, &tokens[pos], 1, pos, logits.data(), nullptr);
    const std::vector<int32_t> prefix(tokens.begin(),
                                      tokens.begin() + static_cast<std::ptrdiff_t>(pos + 1));
    expect_close(logits, prefill_logits(q8, prefix, m.config.vocab_size),
                 "q8_0 cache pos " + std::to_string(pos));
  }
  // head_dim 16 cannot hold a block of 32.
  TinyModel m16 = write_tiny("LlamaForCausalLM", "");
  Checkpoint ckpt16 = Checkpoint::open(m16.dir);
  EXPECT_THROW(Transformer(m16.config, load_weights(ckpt16, m16.config), 16, pool, prof,
                           with_kv(kernels::KvDtype::q8_0)),
               Error);
}

// A model runs its matmuls on the tier it was packed for: weights packed for
// another tier are refused at construction, not run on the packing's kernels.
TEST(TransformerTier, WeightsPackedForAnotherTierAreRefused) {
  if (kernels::detect_isa() == kernels::Isa::scalar) GTEST_SKIP() << "one tier only";
  TinyModel m = write_tiny("LlamaForCausalLM", "");
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(1);
  Profiler prof;
  kernels::ExecConfig cfg = with_kv(kernels::KvDtype::fp32);
  cfg.isa = kernels::detect_isa();
  EXPECT_THROW(
      Transformer(m.config, load_weights(ckpt, m.config, nullptr, nullptr, kernels::Isa::scalar),
                  16, pool, prof, cfg),
      Error);
  EXPECT_NO_THROW(Transformer(m.config,
                              load_weights(ckpt, m.config, &pool, nullptr, kernels::detect_isa()),
                              16, pool, prof, cfg));
}

// Continuous batching's promise: a sequence decodes to the same bits alone or
// in a batch with others at different positions (and different batch sizes).
TEST_P(DecodeMatchesPrefill, BatchedDecodeIsBitIdenticalToAlone) {
  const auto& [arch, extra] = GetParam();
  TinyModel m = write_tiny(arch, extra);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  for (kernels::KvDtype kv_dtype : {kernels::KvDtype::fp32, kernels::KvDtype::bf16}) {
    Transformer model(m.config, load_weights(ckpt, m.config), 64, pool, prof, with_kv(kv_dtype));
    const size_t vocab = static_cast<size_t>(m.config.vocab_size);
    const std::vector<std::vector<int32_t>> prompts = {
        {5, 17, 3}, {96, 42, 8, 0, 61, 23, 77}, {11}, {2, 4, 6, 8, 10}, {90, 1}};
    const size_t B = prompts.size();
    std::vector<KvCache> alone, batched;
    std::vector<std::vector<float>> alone_logits(B, std::vector<float>(vocab)),
        batch_logits(B, std::vector<float>(vocab));
    Scratch scratch;
    for (size_t i = 0; i < B; ++i) {
      alone.push_back(model.new_kv_cache());
      batched.push_back(model.new_kv_cache());
      model.forward(alone[i], scratch, prompts[i].data(), prompts[i].size(), 0,
                    alone_logits[i].data(), nullptr);
      model.forward(batched[i], scratch, prompts[i].data(), prompts[i].size(), 0,
                    batch_logits[i].data(), nullptr);
    }
    Scratch batch_scratch;
    for (int step = 0; step < 8; ++step) {
      // Sequences leave and join: step s runs the first B - s % 3 of them.
      const size_t active = B - static_cast<size_t>(step % 3);
      std::vector<SequenceRows> rows;
      std::vector<int32_t> tokens;
      for (size_t i = 0; i < active; ++i) {
        const size_t pos = prompts[i].size() + static_cast<size_t>(step);
        const int32_t token = static_cast<int32_t>((7 * i + 13 * step) % vocab);
        if (pos >= 64) continue;
        model.forward(alone[i], scratch, &token, 1, pos, alone_logits[i].data(), nullptr);
        rows.push_back({&batched[i], pos, 1, batch_logits[i].data()});
        tokens.push_back(token);
      }
      // Not-running sequences catch up alone, so every cache stays complete.
      for (size_t i = active; i < B; ++i) {
        const size_t pos = prompts[i].size() + static_cast<size_t>(step);
        const int32_t token = static_cast<int32_t>((7 * i + 13 * step) % vocab);
        model.forward(alone[i], scratch, &token, 1, pos, alone_logits[i].data(), nullptr);
        model.forward(batched[i], scratch, &token, 1, pos, batch_logits[i].data(), nullptr);
      }
      model.decode_batch(rows, batch_scratch, tokens.data());
      for (size_t i = 0; i < B; ++i)
        ASSERT_EQ(
            0, std::memcmp(alone_logits[i].data(), batch_logits[i].data(), vocab * sizeof(float)))
            << arch << ": sequence " << i << " step " << step << " differs batched";
    }
  }
}

// The same promise where attention splits a sequence's keys across threads
// (>= 256 keys): batched, each sequence's attention runs its split items
// serially on one thread and must still give the bits of the parallel call.
class DecodeBatchSplitKeys : public ::testing::TestWithParam<kernels::KvDtype> {};
INSTANTIATE_TEST_SUITE_P(KvDtypes, DecodeBatchSplitKeys,
                         ::testing::Values(kernels::KvDtype::fp32, kernels::KvDtype::bf16,
                                           kernels::KvDtype::q8_0),
                         [](const auto& info) {
                           return std::string(kernels::kv_dtype_name(info.param));
                         });

TEST_P(DecodeBatchSplitKeys, BitIdenticalToAlone) {
  // q8_0 needs head_dim % 32 == 0 (the tiny model's is 16).
  const bool q8 = GetParam() == kernels::KvDtype::q8_0;
  TinyModel m = write_tiny("LlamaForCausalLM", std::string(R"(, "max_position_embeddings": 512)") +
                                                   (q8 ? R"(, "head_dim": 32)" : ""));
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  Transformer model(m.config, load_weights(ckpt, m.config), 512, pool, prof, with_kv(GetParam()));
  const size_t vocab = static_cast<size_t>(m.config.vocab_size);
  const std::vector<size_t> lengths = {300, 420, 260};
  std::vector<KvCache> alone, batched;
  std::vector<std::vector<float>> a(lengths.size(), std::vector<float>(vocab)),
      b(lengths.size(), std::vector<float>(vocab));
  Scratch scratch, batch_scratch;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> prompt(lengths[i]);
    for (size_t j = 0; j < prompt.size(); ++j)
      prompt[j] = static_cast<int32_t>((31 * j + 7 * i) % vocab);
    alone.push_back(model.new_kv_cache());
    batched.push_back(model.new_kv_cache());
    model.forward(alone[i], scratch, prompt.data(), prompt.size(), 0, a[i].data(), nullptr);
    model.forward(batched[i], scratch, prompt.data(), prompt.size(), 0, b[i].data(), nullptr);
  }
  for (size_t step = 0; step < 3; ++step) {
    std::vector<SequenceRows> rows;
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int32_t token = static_cast<int32_t>((5 * i + 11 * step) % vocab);
      model.forward(alone[i], scratch, &token, 1, lengths[i] + step, a[i].data(), nullptr);
      rows.push_back({&batched[i], lengths[i] + step, 1, b[i].data()});
      tokens.push_back(token);
    }
    model.decode_batch(rows, batch_scratch, tokens.data());
    for (size_t i = 0; i < lengths.size(); ++i)
      ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), vocab * sizeof(float)))
          << "sequence " << i << " step " << step << " differs batched";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, DecodeMatchesPrefill,
    ::testing::Values(std::make_pair("LlamaForCausalLM", ""),
                      std::make_pair("LlamaForCausalLM",
                                     R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})"),
                      std::make_pair("Qwen2ForCausalLM", ""),
                      std::make_pair("Qwen3ForCausalLM", ""),
                      std::make_pair("Gemma3ForCausalLM", "")));

TEST(WeightsTest, MissingTensorIsNamed) {
  TinyModel m = write_tiny("LlamaForCausalLM", "", /*drop_a_tensor=*/true);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  try {
    load_weights(ckpt, m.config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(WeightsTest, ShapeDisagreeingWithConfigIsNamed) {
  TinyModel m = write_tiny("LlamaForCausalLM", "");
  std::string cfg =
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 48, "intermediate_size": 96,
    "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 97})";
  testing::write_text(m.dir / "config.json", cfg);
  const ModelConfig c = load_model_config(m.dir / "config.json");
  Checkpoint ckpt = Checkpoint::open(m.dir);
  try {
    load_weights(ckpt, c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gate_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[80, 48]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[96, 48]"), std::string::npos) << msg;
  }
}

// Regression: before setup (or after a failed one) the accessors dereferenced
// a null state; the Python binding segfaulted on `Session().tokenizer`.
TEST(SessionTest, UseBeforeOrAfterFailedSetupIsAnError) {
  Session s;
  auto expect_not_set_up = [](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not set up"), std::string::npos) << e.what();
    }
  };
  auto all = [&] {
    expect_not_set_up([&] { s.tokenizer(); });
    expect_not_set_up([&] { s.config(); });
    expect_not_set_up([&] { s.chat_template(); });
    expect_not_set_up([&] { s.profiler(); });
    expect_not_set_up([&] { s.max_context(); });
    expect_not_set_up([&] { s.threads(); });
    expect_not_set_up([&] { s.weight_bytes(); });
    expect_not_set_up([&] { s.decode_step(1, 0); });
    const std::vector<int32_t> tokens = {1, 2};
    expect_not_set_up([&] { s.prefill(tokens); });
  };
  all();
  TinyModel m = write_tiny_session_model();
  std::filesystem::remove(m.dir / "tokenizer.json");
  EXPECT_THROW(s.setup(m.dir), Error);
  all();
}

// Regression: --threads 1000 on 2 cores ran for a minute with no output.
TEST(SessionTest, ThreadCountIsBounded) {
  TinyModel m = write_tiny_session_model();
  Session s;
  SessionOptions o;
  o.threads = 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) + 1;
  try {
    s.setup(m.dir, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("threads must be at most"), std::string::npos) << e.what();
  }
  o.threads = 2;
  s.setup(m.dir, o);
  EXPECT_EQ(s.threads(), 2);
}

// The KV cache dtype: the option, else EDGELLM_KV_CACHE, else fp32; unknown
// names are one clear error, and the memory estimate names the dtype.
// The arithmetic is resolved once at setup from the options alone: a preset
// (fast by default, exact on request), per-part overrides, clear errors. The
// environment is a front end's default (with_environment_defaults), never read
// by setup itself.
TEST(SessionTest, ExecConfigFromOptions) {
  TinyModel m = write_tiny_session_model();
  const auto setup_error = [&](const SessionOptions& o) -> std::string {
    Session s;
    try {
      s.setup(m.dir, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SessionOptions o;
  o.max_context = 32;
  Session fast;
  fast.setup(m.dir, o);
  const kernels::ExecConfig& f = fast.exec_config();
  EXPECT_FALSE(f.exact());
  EXPECT_EQ(f.gemm, kernels::GemmPrecision::bf16);
  EXPECT_EQ(f.attention, kernels::AttnPrecision::bf16);
  EXPECT_EQ(fast.kv_cache_dtype(), "bf16");
  EXPECT_EQ(f.isa, kernels::detect_isa());
  o.precision = "exact";
  Session exact;
  exact.setup(m.dir, o);
  EXPECT_TRUE(exact.exec_config().exact());
  EXPECT_EQ(exact.kv_cache_dtype(), "fp32");
  EXPECT_EQ(fast.kv_cache_bytes() * 2, exact.kv_cache_bytes());
  o.kv_cache = "bf16";  // an override of one part
  Session exact_bf16_kv;
  exact_bf16_kv.setup(m.dir, o);
  EXPECT_EQ(exact_bf16_kv.kv_cache_dtype(), "bf16");
  EXPECT_EQ(exact_bf16_kv.exec_config().gemm, kernels::GemmPrecision::fp32);
  o.kv_cache = "fp16";
  EXPECT_EQ(setup_error(o), "--kv-cache (EDGELLM_KV_CACHE) fp16: expected fp32, bf16 or q8_0");
  o.kv_cache = "";
  o.precision = "fastest";
  EXPECT_EQ(setup_error(o), "--precision (EDGELLM_PRECISION) fastest: expected fast or exact");
  o.precision = "";
  o.isa = "avx9";
  EXPECT_EQ(setup_error(o), "--isa (EDGELLM_ISA) avx9: expected scalar, avx2, avx512 or amx");
  o.isa = "scalar";
  Session scalar;
  scalar.setup(m.dir, o);
  EXPECT_EQ(scalar.exec_config().isa, kernels::Isa::scalar);
  o.isa = "";

  const char* saved = std::getenv("EDGELLM_KV_CACHE");
  const std::string saved_value = saved ? saved : "";
  struct Restore {
    bool had;
    std::string value;
    ~Restore() {
      if (had)
        ::setenv("EDGELLM_KV_CACHE", value.c_str(), 1);
      else
        ::unsetenv("EDGELLM_KV_CACHE");
    }
  } restore{saved != nullptr, saved_value};
  ::setenv("EDGELLM_KV_CACHE", "fp32", 1);
  Session ignores_env;
  ignores_env.setup(m.dir, o);
  EXPECT_EQ(ignores_env.kv_cache_dtype(), "bf16");  // setup reads no environment
  {
    // q8_0 quantizes blocks of 32 head dims: refused at setup for the tiny
    // model's head_dim 16, taken for 32 (1 + 2/32 bytes an element).
    SessionOptions q = o;
    q.kv_cache = "q8_0";
    EXPECT_EQ(setup_error(q),
              "a q8_0 KV cache quantizes blocks of 32 head dims, and this model's head_dim is 16: "
              "use --kv-cache fp32 or bf16");
    TinyModel hd32 = write_tiny_session_model(R"(, "head_dim": 32)");
    Session q8;
    q8.setup(hd32.dir, q);
    EXPECT_EQ(q8.kv_cache_dtype(), "q8_0");
    q.kv_cache = "fp32";
    Session q8_fp32;
    q8_fp32.setup(hd32.dir, q);
    EXPECT_EQ(q8.kv_cache_bytes() * 64, q8_fp32.kv_cache_bytes() * 17);
  }
  Session from_env;
  from_env.setup(m.dir, with_environment_defaults(o));
  EXPECT_EQ(from_env.kv_cache_dtype(), "fp32");
  o.kv_cache = "bf16";  // the option wins over the environment
  EXPECT_EQ(with_environment_defaults(o).kv_cache, "bf16");
  o.kv_cache = "";
  ::setenv("EDGELLM_KV_CACHE", "int8", 1);
  EXPECT_EQ(setup_error(with_environment_defaults(o)),
            "--kv-cache (EDGELLM_KV_CACHE) int8: expected fp32, bf16 or q8_0");
  // The memory estimate names the dtype.
  TinyModel huge = write_tiny_session_model(R"(, "max_position_embeddings": 2147483647)");
  o.max_context = 2147483647;
  o.kv_cache = "bf16";
  Session s;
  try {
    s.setup(huge.dir, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 KV cache"), std::string::npos) << e.what();
  }
}

// An exact and a fast model live side by side in one process: each computes
// with its own config, bit-identical to the same model loaded alone, so no
// setting leaks through process state.
TEST(SessionTest, ExactAndFastSideBySide) {
  TinyModel m = write_tiny_session_model(R"(, "max_position_embeddings": 128)");
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((7 * i + 3) % 50);
  const auto run = [&](Session& s) {
    std::vector<float> out;
    const auto first = s.prefill(prompt);
    out.assign(first.begin(), first.end());
    const auto next = s.decode_step(5, static_cast<int>(prompt.size()));
    out.insert(out.end(), next.begin(), next.end());
    return out;
  };
  SessionOptions o;
  o.max_context = 64;
  o.precision = "exact";
  Session exact_alone;
  exact_alone.setup(m.dir, o);
  const std::vector<float> exact_ref = run(exact_alone);
  o.precision = "fast";
  Session fast_alone;
  fast_alone.setup(m.dir, o);
  const std::vector<float> fast_ref = run(fast_alone);

  Session exact, fast;
  o.precision = "exact";
  exact.setup(m.dir, o);
  o.precision = "fast";
  fast.setup(m.dir, o);
  const std::vector<float> fast_got = run(fast);  // fast first, then exact
  const std::vector<float> exact_got = run(exact);
  EXPECT_EQ(0, std::memcmp(exact_got.data(), exact_ref.data(), exact_ref.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(fast_got.data(), fast_ref.data(), fast_ref.size() * sizeof(float)));
  // Where the tier has faster arithmetic, the two paths really differ.
  if (kernels::detect_isa() >= kernels::Isa::avx512) {
    EXPECT_NE(0, std::memcmp(fast_got.data(), exact_got.data(), fast_got.size() * sizeof(float)));
  }
}

// Regression: a context of 2^31 positions asked for the memory and died with
// "internal error: std::bad_alloc"; setup now computes the need and refuses.
TEST(SessionTest, MemoryNeedIsCheckedBeforeAllocating) {
  TinyModel m = write_tiny_session_model(R"(, "max_position_embeddings": 2147483647)");
  Session s;
  SessionOptions o;
  o.max_context = 2147483647;
  try {
    s.setup(m.dir, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("setup needs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GB available"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2147483647 positions"), std::string::npos) << msg;
  }
  o.max_context = 64;
  s.setup(m.dir, o);
  EXPECT_EQ(s.max_context(), 64);
}

// Regression: the embedding table was read from the live mapping after setup,
// so editing the model file gave NaN output and truncating it gave SIGBUS.
TEST(SessionTest, ModelFileChangesAfterSetupDoNotMatter) {
  for (const char* extra : {"", R"(, "tie_word_embeddings": true)"}) {
    TinyModel m = write_tiny_session_model(extra);
    Session s;
    s.setup(m.dir);
    const std::vector<int32_t> tokens = {5, 17, 3};
    auto logits = [&] {
      const auto l = s.prefill(tokens);
      return std::vector<float>(l.begin(), l.end());
    };
    const std::vector<float> before = logits();
    const auto path = m.dir / "model.safetensors";
    const auto size = std::filesystem::file_size(path);
    {  // In place: every data byte 0xff, i.e. NaN in bf16.
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      uint64_t header_len = 0;
      f.read(reinterpret_cast<char*>(&header_len), 8);
      f.seekp(static_cast<std::streamoff>(8 + header_len));
      f << std::string(size - 8 - header_len, '\xff');
    }
    EXPECT_EQ(logits(), before) << "edited" << extra;
    std::filesystem::resize_file(path, 0);
    EXPECT_EQ(logits(), before) << "truncated" << extra;
    s.decode_step(7, 3);
  }
}

}  // namespace
}  // namespace edgellm
