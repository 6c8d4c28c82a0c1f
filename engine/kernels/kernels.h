// The kernel interface the forward pass calls. Kernels know nothing of models.
//
// Every kernel has a scalar reference in namespace `ref` (kernels/reference.cpp),
// always built, used by the unit tests as ground truth and selectable at run
// time (EDGELLM_ISA=scalar). The dispatching functions below route to the
// fastest path the CPU supports; each ISA lives in its own file. Matmuls
// dispatch through the type-traits row their matrix took at packing
// (MatmulKernels, matmul_traits.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "edgellm/exec_config.h"
#include "edgellm/thread_pool.h"

namespace edgellm::kernels {

// What the engine registers: each kernel and the ISA paths it has. The kernel
// registry (kernel_registry/supported_kernels.md) is generated from this list
// (kernel_registry/generate.py).
struct KernelInfo {
  std::string_view name;
  std::vector<Isa> paths;   // tiers with a path of their own; others run the best lower one
  std::string_view dtypes;  // what the registry documents
  std::string_view shapes;
  // Which models run it, in the engine's terms: "every model", "hidden_act silu",
  // "hidden_act gelu_tanh", "quantized weights" or "quantized weights, int8
  // activations". The registry's "Used by" column is derived from it and the
  // deployments' descriptors (kernel_registry/generate.py), so no deployment is named here.
  std::string_view used_when;
};
const std::vector<KernelInfo>& registered_kernels();
// The one CPU-feature detector (cpu_features.cpp): cpuid, XCR0, AMX permission.
Isa detect_isa();     // best tier this CPU and OS support
bool has_avx_vnni();  // AVX-VNNI beside the tier (int8-activation quantized kernels)
bool has_amx_int8();  // AMX-INT8 (TDPBSSD family) beside the amx tier
// The tier used when EDGELLM_ISA is unset: detect_isa().
Isa default_isa();
Isa active_isa();       // default_isa() unless overridden
void set_isa(Isa isa);  // tests and EDGELLM_ISA; clamped to runnable_isa()

// What runs the amx tier's tile instructions (kernels/amx_tiles.h): the CPU's
// tiles, or the exact software model of them. Default: silicon where the CPU
// has AMX, else the model, but there the amx tier stays out of reach (the
// model is for tests: small shapes, ~1000x slower) until a test asks for it.
enum class TileBackend { silicon, model };
std::string_view tile_backend_name(TileBackend b);
TileBackend tile_backend();
// Tests: `model` runs the amx tier on the model on any CPU with avx512 (it
// becomes runnable_isa()); `silicon` needs detect_isa() == amx (else ignored).
void set_tile_backend(TileBackend b);
// The best tier kernels may run: detect_isa(), or amx while a test has put
// the tile model on an AVX-512 CPU.
Isa runnable_isa();

// An optional [rows] bias a matmul adds to every output row. Owned (a model's:
// copies of the matrix share it, so nothing points into a sibling field) or
// borrowed (tests and benchmarks pass a pointer they keep alive). Reads as a
// `const float*`, nullptr when there is none.
class Bias {
 public:
  Bias() = default;
  Bias(const float* borrowed) : data_(borrowed) {}  // NOLINT(google-explicit-constructor)
  explicit Bias(std::vector<float> owned);
  const float* get() const { return data_; }
  operator const float*() const { return data_; }  // NOLINT(google-explicit-constructor)

 private:
  std::shared_ptr<const std::vector<float>> owned_;
  const float* data_ = nullptr;
};

// The weight formats a matrix can hold, each with a row of kernels per tier in
// the type-traits table (matmul_traits.cpp).
enum class WeightFormat {
  bf16,   // bf16 in the tier's layout (below)
  quant,  // GGUF blocks repacked into i8 / u4 / u5 segments (kernels/quant.h)
};
std::string_view weight_format_name(WeightFormat f);

struct PackedMatrix;
// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < n, at the precisions of
// `cfg` (cfg.gemm for bf16, cfg.quant for quantized weights).
using MatmulFn = void (*)(const PackedMatrix& w, const float* x, size_t n, float* y,
                          ThreadPool& pool, const ExecConfig& cfg);

// One row of the type-traits table: the kernels of one weight format on one
// tier, as ggml's type_traits_cpu. pack_matrix() / pack_quant() pick the row
// once, from the format and the tier the model runs at (ExecConfig::isa);
// matmul() calls through it. Precision stays a run-time argument (`cfg`): it
// picks among the arithmetic of one layout, not the layout.
struct MatmulKernels {
  WeightFormat format;
  Isa tier;
  MatmulFn gemv;  // n == 1: decode
  MatmulFn gemm;  // n tokens of one sequence: prefill (may block across tokens)
  MatmulFn rows;  // n independent tokens: row t bit-identical to gemv of token t
  void (*unpack_row)(const PackedMatrix& w, size_t r, float* out);  // row r as fp32
  size_t (*bytes)(const PackedMatrix& w);  // what one pass over the weights streams
};
// The table's row for (format, tier); a tier without a row of its own takes
// the best lower one. The tier is clamped to runnable_isa().
const MatmulKernels& matmul_kernels(WeightFormat format, Isa tier);
// Every row of the table (tests, the kernel registry).
const std::vector<MatmulKernels>& matmul_kernel_table();

// A weight matrix W[rows][cols], laid out once at setup for the kernels of
// one tier; `kernels` is its row of the type-traits table.
//
// bf16: `data` owns the packed copy; the layout starts at data[offset] (the
// SIMD layouts pad `data` to start on a 64-byte boundary). Isa::scalar is
// plain row-major; Isa::avx2 is row panels, see kernels/avx2.h; Isa::avx512
// and Isa::amx share one layout of row panels holding bf16 column pairs (VNNI
// order), see kernels/avx512.h.
// quant: `quant` holds the segments (kernels/quant.h), shared when the
// embedding is also the LM head; `data` is empty.
struct QuantMatrix;  // kernels/quant.h
struct PackedMatrix {
  size_t rows = 0, cols = 0;
  Isa isa = Isa::scalar;  // the tier it was packed for
  const MatmulKernels* kernels = nullptr;
  std::vector<uint16_t> data;
  size_t offset = 0;
  std::shared_ptr<const QuantMatrix> quant;
  Bias bias;
  // Bytes of packed weights one pass over the matrix reads (layout padding
  // included): what the profiler and roofline charge a matmul.
  size_t byte_size() const { return kernels ? kernels->bytes(*this) : 0; }
};
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols);
// Packs for a given ISA (tests, benchmarks); one the CPU lacks falls back to runnable_isa().
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa);
// Quantized weights, run by the kernels of tier `isa` (clamped to runnable_isa()).
PackedMatrix pack_quant(std::shared_ptr<const QuantMatrix> q, Isa isa);
// Row r of W as fp32, whatever the layout (tied embeddings, tests).
void unpack_row(const PackedMatrix& w, size_t r, float* out);

// The process default for callers that pass no ExecConfig (tests, benchmarks):
// fp32 unless set_gemm_precision() changed it.
GemmPrecision gemm_precision();
void set_gemm_precision(GemmPrecision p);  // tests, benchmarks

// What the precisions below amount to on `cfg.isa`: "f32", "bf16x2" or "bf16"
// for the prefill GEMM's activations (the gate's precision tier reads it).
std::string_view gemm_activation_dtype(const ExecConfig& cfg);
// Whether a quantized GEMM over n tokens rounds x to bf16 once: the avx512
// and amx tiers' prefill (quant_bf16_avx512.cpp, quant_amx.cpp) under the bf16
// GEMM precision with fp32 quantized activations, from 16 tokens.
bool quant_prefill_in_bf16(const ExecConfig& cfg, size_t n);
// Whether the quantized matmul below that (decode, batched decode, short
// prompts) rounds x to bf16 for u4 and u5 blocks (Q4_0, Q4_1, Q4_K, Q5_0,
// Q5_1): the same tiers and config (quant_gemv_bf16_avx512.cpp). The i8
// layout's decode keeps x fp32.
bool quant_decode_in_bf16(const ExecConfig& cfg);
// cfg.quant as the engine applies it: "int8", "fp32", or on the avx512 and
// amx tiers' fast config "fp32 (prefill bf16, decode bf16 on 4/5-bit blocks)".
std::string quant_activation_dtype(const ExecConfig& cfg);

// How the n rows of a matmul's x relate.
enum class Batch {
  sequence,     // consecutive tokens of one sequence (prefill): the GEMM
  independent,  // one decode token each of n sequences: each output row is
                // bit-identical to its own n == 1 GEMV, so a sequence decodes
                // the same alone or batched; the weights are read once for all
};

// The one matmul dispatcher: y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for
// t < n through w's row of the type-traits table: gemv for n == 1, else gemm
// or rows by `batch`. w's tier was chosen at packing; `cfg` gives the precision.
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            const ExecConfig& cfg, Batch batch = Batch::sequence);
// The process's config (tests, benchmarks).
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
// matmul(..., Batch::independent): batched decode.
inline void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                        const ExecConfig& cfg) {
  matmul(w, x, n, y, pool, cfg, Batch::independent);
}
void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);

// Element-wise kernels run the path of `isa` (default: active_isa()).
// y = x / sqrt(mean(x^2) + eps) * weight, over `dim` elements (x may alias y).
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y,
             Isa isa = active_isa());

// Rotates the first rotary_dim values of each of n_heads vectors of length head_dim
// in place (HF rotate_half layout: pairs are (i, i + rotary_dim/2)); the rest of each
// head passes through (Phi-3's partial rotary). cos/sin hold rotary_dim/2 values.
void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin, Isa isa = active_isa());

// out = act(gate) * up, element-wise.
void silu_mul(const float* gate, const float* up, size_t n, float* out, Isa isa = active_isa());
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out,
                   Isa isa = active_isa());
// gpt-oss's clamped SwiGLU (HF GptOssExperts): g = min(gate, limit), u = clamp(up, -limit,
// limit), out = (u + 1) * g * sigmoid(kSwigluOaiAlpha * g).
inline constexpr float kSwigluOaiAlpha = 1.702f;
void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out,
                    Isa isa = active_isa());

// acc += x
void add(float* acc, const float* x, size_t n, Isa isa = active_isa());

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
  // gpt-oss's attention sinks, [n_heads] or nullptr: head h's logit sinks[h] joins each
  // row's softmax denominator as a key whose value is zero (HF: cat, softmax, drop).
  const float* sinks = nullptr;
  AttnPrecision precision = AttnPrecision::fp32;
};
// A row's softmax denominator with head h's sink added: l is the row's sum of exp(s - m)
// over its keys, m their max (m finite: every row sees at least its own key).
inline float with_sink(const AttentionArgs& a, size_t head, float m, float l) {
  return a.sinks ? l + std::exp(a.sinks[head] - m) : l;
}
void attention(const AttentionArgs& args, ThreadPool& pool, Isa isa = active_isa());
// The useful flops of that call: 2 x 2 per head dim (q.k and p.v) for each
// key each query sees (causal, within the window), not the full square.
double attention_flops(const AttentionArgs& args);

// Indices of the k largest values, largest first; ties toward the smaller index.
// NaN ranks below every number (-inf included); NaNs among themselves by index.
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);

// The config of callers that pass none (tests, benchmarks): active_isa(),
// gemm_precision(), fp32 attention and KV, fp32 quantized activations.
ExecConfig process_exec_config();

namespace ref {
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y);
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);
void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);
void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out);
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
