// The execution config: how the kernels compute for one model (ISA tier,
// GEMM and attention precision, KV cache dtype, quantized-matmul activations).
// Public because SessionOptions resolve to it (runtime/exec_config.cpp) and
// front ends report it; the kernels (engine/kernels/kernels.h) take it.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace edgellm::kernels {

// ISA tiers, each a superset of the one before (a CPU with a tier has every
// lower one). avx512 = AVX-512 F/BW/VL/BF16; amx = avx512 + AMX-TILE/BF16.
enum class Isa { scalar, avx2, avx512, amx };
inline constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx};
std::string_view isa_name(Isa isa);
// "scalar" | "avx2" | "avx512" | "amx" (EDGELLM_ISA's values); nullopt otherwise.
std::optional<Isa> parse_isa(std::string_view name);

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

// Activation precision of matmuls on quantized (GGUF) weights: fp32 (exact),
// or int8 per 32-block (VNNI dot products; kernels/quant.h).
enum class QuantPrecision { fp32, int8 };
std::string_view quant_precision_name(QuantPrecision p);
std::optional<QuantPrecision> parse_quant_precision(std::string_view name);

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

// How the kernels compute for one model: resolved once at setup
// (runtime/exec_config.cpp), kept with the model and its contexts and passed
// with every call, so an exact and a fast model can live in one process. The
// exact config is the gate's fp32 tier; the fast one is the deployed path,
// judged against the exact one by the verify gate's stage 2.
struct ExecConfig {
  // The tier of every kernel: element-wise kernels and attention take it per
  // call; matrices take their type-traits row for it once, at packing.
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

}  // namespace edgellm::kernels
