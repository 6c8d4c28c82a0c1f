// The kernel interface the forward pass calls. Kernels know nothing of models.
//
// Every kernel has a scalar reference in namespace `ref` (kernels/reference.cpp),
// always built, used by the unit tests as ground truth and selectable at run
// time (EDGELLM_ISA=scalar). The dispatching functions below route to the
// fastest path the CPU supports; each ISA lives in its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "edgellm/thread_pool.h"

namespace edgellm::kernels {

// ISA tiers, each a superset of the one before (a CPU with a tier has every
// lower one). avx512 = AVX-512 F/BW/VL/BF16; amx = avx512 + AMX-TILE/BF16.
enum class Isa { scalar, avx2, avx512, amx };
inline constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx};
std::string_view isa_name(Isa isa);
// "scalar" | "avx2" | "avx512" | "amx" (EDGELLM_ISA's values); nullopt otherwise.
std::optional<Isa> parse_isa(std::string_view name);

// What the engine registers: each kernel and the ISA paths it has. The kernel
// registry (kernel_registry/supported_kernels.md) is generated from this list
// (kernel_registry/generate.py).
struct KernelInfo {
  std::string_view name;
  std::vector<Isa> paths;   // tiers with a path of their own; others run the best lower one
  std::string_view dtypes;  // what the registry documents
  std::string_view shapes;
  std::string_view used_by;  // deployments, as llms/<name>
};
const std::vector<KernelInfo>& registered_kernels();
// The one CPU-feature detector (cpu_features.cpp): cpuid, XCR0, AMX permission.
Isa detect_isa();     // best tier this CPU and OS support
bool has_avx_vnni();  // AVX-VNNI beside the tier (int8-activation quantized kernels)
// The tier used when EDGELLM_ISA is unset: detect_isa().
Isa default_isa();
Isa active_isa();       // default_isa() unless overridden
void set_isa(Isa isa);  // tests and EDGELLM_ISA; clamped to detect_isa()

// A bf16 weight matrix W[rows][cols], laid out once at setup for the matmul of
// the ISA active at packing time. `data` owns the packed copy; the layout
// starts at data[offset] (the SIMD layouts pad `data` to start on a 64-byte
// boundary). Isa::scalar is plain row-major; Isa::avx2 is row panels, see
// kernels/avx2.h; Isa::avx512 and Isa::amx share one layout of row panels
// holding bf16 column pairs (VNNI order), see kernels/avx512.h. matmul()
// follows `isa` (clamped to the active ISA where the layouts agree).
struct QuantMatrix;  // kernels/quant.h
struct PackedMatrix {
  size_t rows = 0, cols = 0;
  Isa isa = Isa::scalar;
  std::vector<uint16_t> data;
  size_t offset = 0;
  const float* bias = nullptr;  // optional [rows], not owned
  // Bytes of packed weights one pass over the matrix reads (layout padding
  // included): what the profiler and roofline charge a matmul.
  size_t byte_size() const;
  // Quantized (GGUF) weights instead of bf16: matmul and unpack_row use them
  // (kernels/quant.h); shared when the embedding is also the LM head.
  std::shared_ptr<const QuantMatrix> quant;
};
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols);
// Packs for a given ISA (tests, benchmarks); one the CPU lacks falls back to detect_isa().
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa);
// Row r of W as fp32, whatever the layout (tied embeddings, tests).
void unpack_row(const PackedMatrix& w, size_t r, float* out);

// Activation precision of the prefill GEMM (n > 1) on the avx512/amx tiers.
// Products and sums are fp32 in every case; decode (n == 1) always keeps x fp32.
//  - fp32 (exact): x exact. avx512 runs fp32 FMAs; amx splits x into three
//    bf16 parts (x = hi + mid + lo exactly) and runs three TDPBF16PS passes.
//  - bf16x2: amx runs two parts (hi + mid, ~16 significant bits of x); other
//    tiers treat it as fp32. For measuring the split, not a default.
//  - bf16 (fast): x rounded to bf16 once (vdpbf16ps / one TDPBF16PS pass).
enum class GemmPrecision { bf16, bf16x2, fp32 };
std::string_view gemm_precision_name(GemmPrecision p);
std::optional<GemmPrecision> parse_gemm_precision(std::string_view name);
// The process default for callers that pass no ExecConfig (tests, benchmarks):
// fp32 unless set_gemm_precision() changed it.
GemmPrecision gemm_precision();
void set_gemm_precision(GemmPrecision p);  // tests, benchmarks

// Activation precision of matmuls on quantized (GGUF) weights: fp32 (exact),
// or int8 per 32-block (VNNI dot products; kernels/quant.h).
enum class QuantPrecision { fp32, int8 };
std::string_view quant_precision_name(QuantPrecision p);
std::optional<QuantPrecision> parse_quant_precision(std::string_view name);

// What the precisions below amount to on `cfg.isa`: "f32", "bf16x2" or "bf16"
// for the prefill GEMM's activations (the gate's precision tier reads it).
struct ExecConfig;
std::string_view gemm_activation_dtype(const ExecConfig& cfg);

// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < n. n == 1 is decode's GEMV.
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            const ExecConfig& cfg);
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
// The same product for n independent rows (batched decode: one token of each of
// n sequences): the weights are read once, and row t is bit-identical to
// matmul(w, x + t * cols, 1, ...), so a sequence decodes the same alone or batched.
void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                 const ExecConfig& cfg);
void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);

// Element-wise kernels run the path of `isa` (default: active_isa()).
// y = x / sqrt(mean(x^2) + eps) * weight, over `dim` elements (x may alias y).
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y,
             Isa isa = active_isa());

// Rotates each of n_heads vectors of length head_dim in place (HF rotate_half
// layout: pairs are (i, i + head_dim/2)). cos/sin hold head_dim/2 values.
void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin,
          Isa isa = active_isa());

// out = act(gate) * up, element-wise.
void silu_mul(const float* gate, const float* up, size_t n, float* out, Isa isa = active_isa());
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out,
                   Isa isa = active_isa());

// acc += x
void add(float* acc, const float* x, size_t n, Isa isa = active_isa());

// Element type of the KV cache (EDGELLM_KV_CACHE=fp32|bf16|q8_0). Every
// kernel widens the cache to fp32 exactly as it reads it, so all attention
// arithmetic stays fp32; what changes is the memory and the bytes decode
// attention streams.
//  - bf16: K and V rounded to bf16 (nearest even) when written.
//  - q8_0 (llama.cpp's -ctk/-ctv q8_0): each key's and value's head_dim
//    elements in blocks of 32, one IEEE-half scale per block; s = max|x| / 127
//    rounded to half (then up one half ulp if that leaves max|x| > 127 s),
//    q = round-to-nearest(x / s) in int8, read back as q * s. Half scales,
//    not fp32: q * s has <= 7 + 11 significant bits, so it is exact in fp32
//    (every kernel, however it orders the multiply, sees the same values),
//    and a block is 34 bytes, not 36. Needs head_dim % 32 == 0.
enum class KvDtype { fp32, bf16, q8_0 };
std::string_view kv_dtype_name(KvDtype d);  // "fp32" | "bf16" | "q8_0"
std::optional<KvDtype> parse_kv_dtype(std::string_view name);
inline constexpr size_t kKvQ8Block = 32;  // q8_0 elements per scale
// Bytes per cache element, scales included (q8_0: 1 + 2 / 32).
inline double kv_dtype_bytes(KvDtype d) {
  return d == KvDtype::q8_0 ? 1.0 + 2.0 / kKvQ8Block : d == KvDtype::bf16 ? 2.0 : 4.0;
}
// Bytes of `elems` cache elements (q8_0: elems % 32 == 0), scales included.
inline size_t kv_bytes(KvDtype d, size_t elems) {
  return d == KvDtype::q8_0 ? elems + elems / kKvQ8Block * 2 : elems * (d == KvDtype::bf16 ? 2 : 4);
}
// Quantizes n values (n % 32 == 0) to q8_0 as above: q[n] int8, scales[n / 32]
// half bits. A block holding NaN or inf gets a NaN scale (it reads back NaN,
// as an fp32 cache would hold it); |x| <= 127 * 65504 keeps the scale finite.
void quantize_kv_q8_0(const float* x, size_t n, int8_t* q, uint16_t* scales);

// Arithmetic of attention's two products (q.k and p.v). fp32: exact fp32
// products (amx: q, K, V, P as three exact bf16 parts). bf16: q, K, P and V
// rounded to bf16 (nearest even) once, products with fp32 accumulation
// (vdpbf16ps / one TDPBF16PS pass); the softmax stays fp32 in both. P is
// that of an online softmax over blocks of kAttentionKeyBlock keys from
// multiples of it: exp(s - m) with m the running max of the blocks so far,
// rounded to bf16 (ref::attention_bf16). bf16 runs on avx512 (no AMX) and amx
// prefill with any cache (q8_0 widened exactly first); decode and other paths compute fp32.
enum class AttnPrecision { fp32, bf16 };
std::string_view attn_precision_name(AttnPrecision p);  // "fp32" | "bf16"
std::optional<AttnPrecision> parse_attn_precision(std::string_view name);
inline constexpr size_t kAttentionKeyBlock = 32;

// Causal multi-head attention with grouped KV heads, for `n` query tokens at
// positions [start, start + n). The cache holds positions [0, start + n):
// k_cache/v_cache are [n_kv_heads][cache_stride][head_dim] of kv_dtype (float,
// bf16 bits as uint16_t, or q8_0's int8_t); a q8_0 cache's scales are
// k_scale/v_scale, IEEE-half bits [n_kv_heads][cache_stride][head_dim / 32]
// (element e of the cache has scale e / 32), kept apart from the int8 so a
// key's values stay whole vectors. q and out are [n][n_heads][head_dim] fp32.
// window > 0 keeps only keys with q_pos - k_pos < window.
struct AttentionArgs {
  const float* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KvDtype kv_dtype = KvDtype::fp32;
  const uint16_t* k_scale = nullptr;  // q8_0 only
  const uint16_t* v_scale = nullptr;
  float* out = nullptr;
  size_t n = 0, start = 0;
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  size_t cache_stride = 0;
  size_t window = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = off; else logits = softcap * tanh(logits / softcap)
  AttnPrecision precision = AttnPrecision::fp32;
};
void attention(const AttentionArgs& args, ThreadPool& pool, Isa isa = active_isa());
// The useful flops of that call: 2 x 2 per head dim (q.k and p.v) for each
// key each query sees (causal, within the window), not the full square.
double attention_flops(const AttentionArgs& args);

// Indices of the k largest values, largest first; ties toward the smaller index.
// NaN ranks below every number (-inf included); NaNs among themselves by index.
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);

// How the kernels compute for one model: resolved once at setup
// (runtime/exec_config.cpp), kept with the model and its contexts and passed
// with every call, so an exact and a fast model can live in one process. The
// exact config is the gate's fp32 tier; the fast one is the deployed path,
// judged against the exact one by the gate's stage 2 (llms/verify/README.md).
struct ExecConfig {
  Isa isa = Isa::scalar;
  GemmPrecision gemm = GemmPrecision::fp32;
  AttnPrecision attention = AttnPrecision::fp32;
  KvDtype kv = KvDtype::fp32;
  QuantPrecision quant = QuantPrecision::fp32;
  bool exact() const {
    return gemm == GemmPrecision::fp32 && attention == AttnPrecision::fp32 && kv == KvDtype::fp32 &&
           quant == QuantPrecision::fp32;
  }
};
// The config of callers that pass none (tests, benchmarks): active_isa(),
// gemm_precision(), fp32 attention and KV, fp32 quantized activations.
ExecConfig process_exec_config();

namespace ref {
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y);
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);
void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);
void add(float* acc, const float* x, size_t n);
// Honours args.precision: bf16 (fp32 or bf16 cache) is attention_bf16.
void attention(const AttentionArgs& args);
// Attention at AttnPrecision::bf16 (reference_attention_bf16.cpp): q, K, V
// and P rounded where the bf16 kernels round them, everything between exact
// (double). `tolerance`, when given ([n][n_heads][head_dim]), receives per
// output the bound on |kernel - reference| of a kernel that accumulates in
// fp32 along head_dim and along the keys (derivation in the file).
void attention_bf16(const AttentionArgs& args, float* tolerance = nullptr);
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);
}  // namespace ref

}  // namespace edgellm::kernels
