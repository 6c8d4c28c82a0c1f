// Routes each element-wise and attention kernel to the implementation of the
// tier it is given (default: the active ISA); matmuls dispatch through their
// matrix's row of the type-traits table instead (matmul_traits.cpp). The tier is detected
// once (cpu_features.cpp); EDGELLM_ISA=scalar|avx2|avx512|amx overrides it,
// clamped to what the CPU and OS support; set_isa() switches it for tests.
// A new ISA adds an enum value, a file of kernels, a row in
// registered_kernels() and a case where it has a kernel. Tiers are ordered, so
// a kernel without a path of its own on a tier runs its best lower one
// (e.g. top_k runs avx2 on avx512).
//
// This file is compiled without ISA flags, so it runs on any x86-64 (and
// other architectures) and must not use SIMD intrinsics itself.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/avx2.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace edgellm::kernels {

namespace {

Isa clamp_to_cpu(Isa isa) {
  return std::min(isa, runnable_isa());
}

// -1 until a test sets a back end; else the TileBackend it set.
std::atomic<int> g_tile_backend{-1};

Isa initial_isa() {
  const char* env = std::getenv("EDGELLM_ISA");
  if (env == nullptr || *env == '\0') return default_isa();
  const std::optional<Isa> wanted = parse_isa(env);
  if (!wanted) {
    std::fprintf(
        stderr, "edgellm: ignoring unknown EDGELLM_ISA=%s (expected scalar, avx2, avx512 or amx)\n",
        env);
    return default_isa();
  }
  if (*wanted > detect_isa())
    std::fprintf(stderr, "edgellm: EDGELLM_ISA=%s is not supported on this CPU/OS; using %s\n", env,
                 std::string(isa_name(detect_isa())).c_str());
  return clamp_to_cpu(*wanted);
}

// Initialised on first use, so kernels called from other static
// initialisers see the detected ISA, not a zero-initialised one.
std::atomic<Isa>& isa_slot() {
  static std::atomic<Isa> slot{initial_isa()};
  return slot;
}

// The process default for callers without an ExecConfig: exact. Models
// resolve their own (runtime/exec_config.cpp).
std::atomic<GemmPrecision>& precision_slot() {
  static std::atomic<GemmPrecision> slot{GemmPrecision::fp32};
  return slot;
}

}  // namespace

std::string_view gemm_precision_name(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::bf16:
      return "bf16";
    case GemmPrecision::bf16x2:
      return "bf16x2";
    case GemmPrecision::fp32:
      return "fp32";
  }
  return "?";
}
std::optional<GemmPrecision> parse_gemm_precision(std::string_view name) {
  for (GemmPrecision p : {GemmPrecision::fp32, GemmPrecision::bf16x2, GemmPrecision::bf16})
    if (gemm_precision_name(p) == name) return p;
  return std::nullopt;
}
GemmPrecision gemm_precision() {
  return precision_slot().load(std::memory_order_relaxed);
}
void set_gemm_precision(GemmPrecision p) {
  precision_slot().store(p, std::memory_order_relaxed);
}
std::string_view gemm_activation_dtype(const ExecConfig& cfg) {
  const GemmPrecision p = cfg.gemm;
  if (cfg.isa < Isa::avx512 || p == GemmPrecision::fp32) return "f32";
  if (p == GemmPrecision::bf16) return "bf16";
  return cfg.isa == Isa::amx ? "bf16x2" : "f32";  // avx512 runs bf16x2 as fp32
}

bool quant_decode_in_bf16(const ExecConfig& cfg) {
  return cfg.gemm == GemmPrecision::bf16 && cfg.quant == QuantPrecision::fp32 &&
         cfg.isa >= Isa::avx512;
}
bool quant_prefill_in_bf16(const ExecConfig& cfg, size_t n) {
  if (!quant_decode_in_bf16(cfg)) return false;
  return n >= (cfg.isa == Isa::amx ? amx::kMinQuantTokens : avx512::kMinBf16QuantTokens);
}

std::string quant_activation_dtype(const ExecConfig& cfg) {
  const std::string base(quant_precision_name(cfg.quant));
  return quant_decode_in_bf16(cfg) ? base + " (prefill bf16, decode bf16 on 4/5-bit blocks)" : base;
}

ExecConfig process_exec_config() {
  ExecConfig cfg;
  cfg.isa = active_isa();
  cfg.gemm = gemm_precision();
  cfg.quant = quant_precision();
  return cfg;
}

std::string_view attn_precision_name(AttnPrecision p) {
  return p == AttnPrecision::bf16 ? "bf16" : "fp32";
}
std::optional<AttnPrecision> parse_attn_precision(std::string_view name) {
  for (AttnPrecision p : {AttnPrecision::fp32, AttnPrecision::bf16})
    if (attn_precision_name(p) == name) return p;
  return std::nullopt;
}

std::string_view kv_dtype_name(KvDtype d) {
  return d == KvDtype::q8_0 ? "q8_0" : d == KvDtype::bf16 ? "bf16" : "fp32";
}
std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
  for (KvDtype d : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0})
    if (kv_dtype_name(d) == name) return d;
  return std::nullopt;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::amx:
      return "amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : kAllIsas)
    if (name == isa_name(isa)) return isa;
  return std::nullopt;
}

Isa default_isa() {
  // AMX included: at the default fp32 precision its GEMM splits x into three
  // bf16 parts (exact), so the gate's fp32 tier holds (docs/benchmarks.md).
  return detect_isa();
}

const std::vector<KernelInfo>& registered_kernels() {
  constexpr Isa S = Isa::scalar, A2 = Isa::avx2, A5 = Isa::avx512, AMX = Isa::amx;
  constexpr std::string_view all = "every model", quantized = "quantized weights",
                             int8x = "quantized weights, int8 activations";
  // The matmuls' paths are the tiers of their format's rows in the type-traits
  // table (matmul_traits.cpp), so a row added there shows up in the registry.
  const auto tiers = [](WeightFormat f) {
    std::vector<Isa> paths;
    for (const MatmulKernels& k : matmul_kernel_table())
      if (k.format == f) paths.push_back(k.tier);
    return paths;
  };
  static const std::vector<KernelInfo> kernels = {
      {"matmul", tiers(WeightFormat::bf16),
       "W bf16 (pre-packed), x/y fp32, optional fp32 bias; n > 1 on avx512/amx: the fast "
       "config rounds x to bf16 once (vdpbf16ps / one TDPBF16PS pass), the exact config keeps "
       "it fp32 (avx512 FMAs; amx 3 exact bf16 parts, 3 passes); decode (n == 1) keeps x fp32",
       "any rows x cols x n (0 included)", all},
      {"matmul_rows", tiers(WeightFormat::bf16),
       "matmul with Batch::independent: one token of each of n sequences (decode_batch), each "
       "row bit-identical to the n == 1 GEMV of its "
       "layout, the weights read once for all n",
       "any rows x cols x n; avx512 / amx layouts: up to 8 tokens per pass over a panel; "
       "quantized (i8 / u4 / u5): the GEMV's 4-row tiles over up to 4 tokens at once (a block "
       "unpacked "
       "once per tile, each token's decode arithmetic)",
       all},
      {"matmul_i8", tiers(WeightFormat::quant),
       "W int8 + fp32 scale (+ min) per 32 or 16 (GGUF Q8_0/Q2_K/Q3_K/Q5_K/Q6_K/"
       "IQ4_NL/IQ4_XS repacked), x/y fp32; avx512 prefill (n >= 16) under the fast config: panels "
       "unpacked to bf16 per call, x rounded to bf16 once, VDPBF16PS per group, scales and mins "
       "in fp32 (weights exact); amx (n >= 16): the same panels, x as 3 exact bf16 parts (exact) "
       "or rounded to bf16 once (fast config, one TDPBF16PS pass), C tiles per group scaled in "
       "fp32",
       "rows any, cols % 32 == 0, any n", quantized},
      {"matmul_u4", tiers(WeightFormat::quant),
       "W uint4 + fp32 scale (+ min) per 32 (GGUF Q4_0/Q4_1/Q4_K repacked), x/y fp32 (default); "
       "avx512 fast prefill and amx (n >= 16) as matmul_i8; avx512 / amx fast decode (n < 16): "
       "x rounded to bf16 once, a row's block pair unpacked by VPERMW to bf16 (q - zero), "
       "VDPBF16PS, scales and mins in fp32 (weights exact)",
       "rows any, cols % 32 == 0, any n", quantized},
      {"matmul_u5", tiers(WeightFormat::quant),
       "W uint5 (the uint4 block + a 32-bit plane of fifth bits) + fp32 scale (+ min) per 32 "
       "(GGUF Q5_0/Q5_1 in their own 22 / 24 bytes per 32), x/y fp32 (default); avx512 fast "
       "prefill and amx (n >= 16) as matmul_i8; fast decode as matmul_u4 (the fifth bits "
       "added to the VPERMW indices through masks)",
       "rows any, cols % 32 == 0, any n", quantized},
      {"matmul_i8_int8x",
       {S, A2},
       "W as matmul_i8, x quantized to int8 per 32 (opt-in --quant-activations int8: 10x the "
       "bf16 floor in stage 2, so not the fast default)",
       "rows any, cols % 32 == 0; AVX-VNNI used where present (avx512 machines included)",
       int8x},
      {"matmul_u4_int8x",
       {S, A2},
       "W as matmul_u4, x quantized to int8 per 32 (opt-in --quant-activations int8)",
       "rows any, cols % 32 == 0; AVX-VNNI used where present (avx512 machines included)",
       int8x},
      {"matmul_u5_int8x",
       {S, A2},
       "W as matmul_u5, x quantized to int8 per 32 (opt-in --quant-activations int8)",
       "rows any, cols % 32 == 0; AVX-VNNI used where present (avx512 machines included)",
       int8x},
      {"attention",
       {S, A2, A5, AMX},
       "q, out fp32; K/V cache fp32, or bf16 (the fast default) / q8_0 (int8 + fp16 scale per "
       "32) widened exactly on load. Exact: fp32 products (amx: q, K, V, P as 3 exact bf16 "
       "parts, 6 tile passes per product; 3 on a bf16 cache). Fast (bf16) prefill: q, K, V, P "
       "rounded to bf16 once, vdpbf16ps (avx512, attention_bf16_avx512.cpp) or one TDPBF16PS "
       "pass (amx); decode stays fp32 (bandwidth)",
       "causal, GQA, any n / start, sliding window, softcap, attention sinks; q8_0: head_dim % 32 "
       "== 0; avx2: "
       "head_dim % 8 == 0; avx512 "
       "(prefill, n >= 16; decode, n < 16, keys split across threads): head_dim % 16 == 0; amx "
       "(prefill, n >= 16): head_dim % 32 == 0, <= 32 query heads per kv head",
       all},
      {"rmsnorm", {S, A2, A5}, "fp32 (sum of squares in double)", "any dim; in place allowed", all},
      {"rope",
       {S, A2, A5},
       "fp32",
       "any n_heads, even rotary_dim <= head_dim (HF rotate_half)",
       all},
      {"silu_mul", {S, A2, A5}, "fp32", "any n; in place allowed", "hidden_act silu"},
      {"gelu_tanh_mul", {S, A2, A5}, "fp32", "any n; in place allowed", "hidden_act gelu_tanh"},
      {"swiglu_oai_mul",
       {S, A2, A5},
       "fp32",
       "any n; in place allowed; gate clamped above, up both ways at the limit",
       "hidden_act swiglu_oai"},
      {"add", {S, A2, A5}, "fp32", "any n", all},
      {"top_k", {S, A2}, "fp32 in, int32 indices", "any n, k; NaN ranks last", all},
  };
  return kernels;
}

std::string_view tile_backend_name(TileBackend b) {
  return b == TileBackend::silicon ? "silicon" : "tile model";
}

TileBackend tile_backend() {
  const int set = g_tile_backend.load(std::memory_order_relaxed);
  if (set >= 0) return static_cast<TileBackend>(set);
  return detect_isa() == Isa::amx ? TileBackend::silicon : TileBackend::model;
}

void set_tile_backend(TileBackend b) {
  if (b == TileBackend::silicon && detect_isa() != Isa::amx) return;
  g_tile_backend.store(static_cast<int>(b), std::memory_order_relaxed);
}

Isa runnable_isa() {
  const Isa best = detect_isa();
  const bool model_on =
      g_tile_backend.load(std::memory_order_relaxed) == static_cast<int>(TileBackend::model);
  return best == Isa::avx512 && model_on ? Isa::amx : best;
}

Isa active_isa() {
  return isa_slot().load(std::memory_order_relaxed);
}
void set_isa(Isa isa) {
  isa_slot().store(clamp_to_cpu(isa), std::memory_order_relaxed);
}

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y, Isa isa) {
  if (isa >= Isa::avx512) return avx512::rmsnorm(x, weight, dim, eps, y);
  if (isa >= Isa::avx2) return avx2::rmsnorm(x, weight, dim, eps, y);
  ref::rmsnorm(x, weight, dim, eps, y);
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin, Isa isa) {
  if (isa >= Isa::avx512) return avx512::rope(x, n_heads, head_dim, rotary_dim, cos, sin);
  if (isa >= Isa::avx2) return avx2::rope(x, n_heads, head_dim, rotary_dim, cos, sin);
  ref::rope(x, n_heads, head_dim, rotary_dim, cos, sin);
}

void silu_mul(const float* gate, const float* up, size_t n, float* out, Isa isa) {
  if (isa >= Isa::avx512) return avx512::silu_mul(gate, up, n, out);
  if (isa >= Isa::avx2) return avx2::silu_mul(gate, up, n, out);
  ref::silu_mul(gate, up, n, out);
}

void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out, Isa isa) {
  if (isa >= Isa::avx512) return avx512::gelu_tanh_mul(gate, up, n, out);
  if (isa >= Isa::avx2) return avx2::gelu_tanh_mul(gate, up, n, out);
  ref::gelu_tanh_mul(gate, up, n, out);
}

void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out,
                    Isa isa) {
  if (fault::active() == fault::Fault::swiglu_clamp_dropped) limit = INFINITY;
  if (isa >= Isa::avx512) return avx512::swiglu_oai_mul(gate, up, n, limit, out);
  if (isa >= Isa::avx2) return avx2::swiglu_oai_mul(gate, up, n, limit, out);
  ref::swiglu_oai_mul(gate, up, n, limit, out);
}

void add(float* acc, const float* x, size_t n, Isa isa) {
  if (isa >= Isa::avx512) return avx512::add(acc, x, n);
  if (isa >= Isa::avx2) return avx2::add(acc, x, n);
  ref::add(acc, x, n);
}

void attention(const AttentionArgs& args, ThreadPool& pool, Isa isa) {
  // Setup refuses such a model (Transformer); a q8_0 block never straddles two keys.
  if (args.kv_dtype == KvDtype::q8_0 && args.head_dim % kKvQ8Block != 0)
    throw std::invalid_argument("attention: a q8_0 KV cache needs head_dim % 32 == 0");
  // The AVX2 path works on whole vectors of head_dim; others take the reference.
  // Prefill on amx, else avx512; decode (n < 16) on avx512 (keys split across threads).
  // AttnPrecision::bf16 runs on the amx prefill (one bf16 part) and the avx512
  // bf16 prefill; everything else computes fp32 at either precision. Decode
  // stays fp32 on purpose: it streams the cache once per token, bound by
  // bandwidth, not by the products.
  const bool prefill = args.n >= avx512::kMinPrefillTokens;
  const bool bf16 = args.precision == AttnPrecision::bf16;
  if (isa == Isa::amx && prefill && args.head_dim % 32 == 0 &&
      args.n_heads <= amx::kMaxAttentionGroup * args.n_kv_heads)
    return amx::attention_prefill(args, pool);
  if (isa >= Isa::avx512 && prefill && bf16 && args.head_dim % 32 == 0 &&
      args.n_heads <= avx512::kMaxBf16Group * args.n_kv_heads)
    return avx512::attention_prefill_bf16(args, pool);
  if (isa >= Isa::avx512 && prefill && args.head_dim % 16 == 0 &&
      args.n_heads <= avx512::kMaxGroup * args.n_kv_heads)
    return avx512::attention_prefill(args, pool);
  if (isa >= Isa::avx512 && !prefill && args.head_dim % 16 == 0)
    return avx512::attention_decode(args, pool);
  if (isa >= Isa::avx2 && args.head_dim % 8 == 0) return avx2::attention(args, pool);
  AttentionArgs fp32 = args;
  fp32.precision = AttnPrecision::fp32;
  ref::attention(fp32);
}

double attention_flops(const AttentionArgs& args) {
  double seen = 0.0;
  for (size_t t = 0; t < args.n; ++t) {
    const size_t visible = args.start + t + 1;
    seen += static_cast<double>(args.window > 0 ? std::min(args.window, visible) : visible);
  }
  return 4.0 * seen * static_cast<double>(args.n_heads * args.head_dim);
}

void top_k(const float* x, size_t n, size_t k, int32_t* out_indices) {
  if (active_isa() >= Isa::avx2) return avx2::top_k(x, n, k, out_indices);
  ref::top_k(x, n, k, out_indices);
}

}  // namespace edgellm::kernels
