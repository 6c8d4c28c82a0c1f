// Resolves the kernels' ExecConfig from SessionOptions: a precision preset
// (fast | exact), per-part overrides, and the tier the CPU allows.
#include <cstdlib>
#include <optional>
#include <string>

#include "edgellm/error.h"
#include "edgellm/session.h"
#include "kernels/kernels.h"

namespace edgellm {

namespace {

void default_from_env(std::string& field, const char* name) {
  if (!field.empty()) return;
  if (const char* v = std::getenv(name); v != nullptr && *v != '\0') field = v;
}

template <class T, class Parse>
T parse_or_throw(const std::string& value, const char* what, const char* expected, Parse parse) {
  const std::optional<T> v = parse(value);
  if (!v) throw Error(std::string(what) + " " + value + ": expected " + expected);
  return *v;
}

}  // namespace

SessionOptions with_environment_defaults(SessionOptions o) {
  default_from_env(o.precision, "EDGELLM_PRECISION");
  default_from_env(o.kv_cache, "EDGELLM_KV_CACHE");
  default_from_env(o.gemm_precision, "EDGELLM_GEMM_PRECISION");
  default_from_env(o.attn_precision, "EDGELLM_ATTN_PRECISION");
  default_from_env(o.quant_activations, "EDGELLM_QUANT_PRECISION");
  default_from_env(o.isa, "EDGELLM_ISA");
  return o;
}

kernels::ExecConfig resolve_exec_config(const SessionOptions& o) {
  using namespace kernels;
  ExecConfig cfg;
  cfg.isa = o.isa.empty() ? detect_isa()
                          : std::min(detect_isa(),
                                     parse_or_throw<Isa>(o.isa, "--isa (EDGELLM_ISA)",
                                                         "scalar, avx2, avx512 or amx", parse_isa));
  const std::string precision = o.precision.empty() ? "fast" : o.precision;
  if (precision == "fast") {
    // Every part that has a faster, stage-2-judged form on this tier takes it.
    cfg.gemm = GemmPrecision::bf16;  // avx2 / scalar GEMMs keep fp32 x regardless
    cfg.attention = AttnPrecision::bf16;
    cfg.kv = KvDtype::bf16;
    // Quantized weights keep fp32 activations: int8 ones (32-blocks, VNNI) measured 10x the
    // bf16 floor on SmolLM2's GGUF (mean KLD 0.013, same-top-1 94%; docs/quality.md), far
    // outside stage 2's budget. --quant-activations int8 stays an opt-in.
  } else if (precision != "exact") {
    throw Error("--precision (EDGELLM_PRECISION) " + precision + ": expected fast or exact");
  }
  if (!o.kv_cache.empty())
    cfg.kv = parse_or_throw<KvDtype>(o.kv_cache, "--kv-cache (EDGELLM_KV_CACHE)",
                                     "fp32, bf16 or q8_0", parse_kv_dtype);
  if (!o.gemm_precision.empty())
    cfg.gemm =
        parse_or_throw<GemmPrecision>(o.gemm_precision, "--gemm-precision (EDGELLM_GEMM_PRECISION)",
                                      "fp32, bf16x2 or bf16", parse_gemm_precision);
  if (!o.attn_precision.empty())
    cfg.attention =
        parse_or_throw<AttnPrecision>(o.attn_precision, "--attn-precision (EDGELLM_ATTN_PRECISION)",
                                      "fp32 or bf16", parse_attn_precision);
  if (!o.quant_activations.empty())
    cfg.quant = parse_or_throw<QuantPrecision>(o.quant_activations,
                                               "--quant-activations (EDGELLM_QUANT_PRECISION)",
                                               "fp32 or int8", parse_quant_precision);
  return cfg;
}

std::string describe_exec_config(const kernels::ExecConfig& cfg) {
  using namespace kernels;
  return std::string(cfg.exact() ? "exact" : "fast") + " (" + std::string(isa_name(cfg.isa)) +
         ": GEMM " + std::string(gemm_activation_dtype(cfg)) + ", attention " +
         std::string(attn_precision_name(cfg.attention)) + ", KV " +
         std::string(kv_dtype_name(cfg.kv)) + ", quantized activations " +
         quant_activation_dtype(cfg) + ")";
}

}  // namespace edgellm
