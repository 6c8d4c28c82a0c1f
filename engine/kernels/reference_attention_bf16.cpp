// The scalar reference of attention at AttnPrecision::bf16, and the bound on
// a kernel's distance to it.
//
// It rounds exactly where the bf16 kernels (attention_bf16_avx512.cpp, and
// attention_amx.cpp with one part) round: q, K and V to bf16 (nearest even;
// a bf16 cache as stored), and P. P is that of the kernels' online softmax:
// keys in blocks of kAttentionKeyBlock from multiples of it, p = exp(s - m)
// with m the running max over the row's visible keys of the blocks so far,
// rounded to bf16; the row's sum l adds the unrounded p, and the output is
// sum(p_bf16 v) / l, both rescaled by exp(m_old - m_new) when m grows.
// Between the roundings it computes in double, exactly for our purposes.
//
// Tolerance. With the same rounded operands a kernel differs from this only
// by its fp32 arithmetic (u = 2^-24), and where that moves a P across a bf16
// rounding boundary. Per output (row, d), with w_j = p_j / l:
//  - a score s_j accumulated in fp32 along head_dim (sequentially: vdpbf16ps
//    adds a pair's two products with a rounding each; TDPBF16PS steps along
//    the same dims) is off by sigma_j <= scale * u * sum_d (|S_d| + |t_d|),
//    S_d the exact partial sum after term t_d (|t_d|: the slack for the
//    order within a pair). softcap's tanh has slope <= 1: sigma passes;
//  - the running max is then off by sigma_m = max sigma_j seen so far, and
//    the kernel's p_j before its rounding is within relative
//    rho_j = sigma_j + sigma_m + 8u (|s_j| + |m| + 1 + softcap) of p_j (the
//    scale and log2 e products, exp2's argument and polynomial: a few u of
//    the exponent's terms each);
//  - so its bf16 P is bf16(p_j (1 +- rho_j)): a P within rho_j of a rounding
//    boundary may round the other way, by at most hi_j - lo_j; the bound
//    adds sum_j (hi_j - lo_j) |v_jd| / l (0 for all other P);
//  - the rescales alpha = 2^(m_old - m_new) telescope: a key of block b ends
//    up scaled by 2^(m_b - m_last) of the kernel's maxima times exp2's error
//    in each block where m grew (<= 4u). O's terms, whose P equal the
//    reference's, are thus off by chain <= 2 sigma_m + 16u (|m| + 1) +
//    4u blocks; l's terms, the kernel's own p_j off by rho_j, by rho_j +
//    4u blocks (the m_b cancel), and l sums them per block (<= kBlock
//    roundings of at most the block's sum) and across blocks (one per
//    block): eps_l <= rho_max + 4u blocks + (kBlock + 1 + blocks) u;
//  - O_d accumulates p_bf16 v (exact products) in fp32 along the keys, one
//    rounding per key and per rescale: <= u sum |O_d partial| (+ |term|) / l;
//  - 1 / l and the final product: 2u of |out| <= sum_j w_j |v_jd|.
// Total: (eps_l + chain + 2u) sum_j w_j |v_jd| + u R_d / l + flips_d / l, plus
// 2^-100 for the denormals the kernels flush to zero. Nothing in it grows
// with the number of keys except the per-block terms (one u per block) and
// R_d (the fp32 summation bound of a sum of keys terms). It is rigorous, so
// loose where nothing flips: a kernel's median distance is ~1e-3 of it, and
// it comes near 1 only at a P that rounded the other way.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/kernels.h"

namespace edgellm::kernels::ref {

namespace {

constexpr double kU = 0x1p-24;  // fp32's unit roundoff

// A cache element as the kernels multiply it: fp32 rounded to bf16, bf16 as stored.
inline double operand(float x) {
  return round_to_bf16(x);
}
inline double operand(uint16_t x) {
  return bf16_to_float(x);
}

inline double bf16_of(double p) {
  return round_to_bf16(static_cast<float>(p));
}

template <typename T>
void attention_bf16_of(const AttentionArgs& a, float* tol) {
  constexpr size_t kBlock = kAttentionKeyBlock;
  const size_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const double scale = a.scale, cap = a.softcap;
  std::vector<double> q(hd), s(kBlock), sig(kBlock), o(hd), r_sum(hd), flips(hd), f_sum(hd);
  for (size_t t = 0; t < a.n; ++t) {
    const size_t pos = a.start + t;
    const size_t first = (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
    for (size_t h = 0; h < a.n_heads; ++h) {
      const size_t row = (t * a.n_heads + h) * hd, kvh = h / group;
      for (size_t d = 0; d < hd; ++d) q[d] = round_to_bf16(a.q[row + d]);
      const T* k = static_cast<const T*>(a.k_cache) + kvh * a.cache_stride * hd;
      const T* v = static_cast<const T*>(a.v_cache) + kvh * a.cache_stride * hd;
      double m = -INFINITY, l = 0.0, sig_m = 0.0, rho_max = 0.0;
      size_t blocks = 0;
      std::fill(o.begin(), o.end(), 0.0);
      std::fill(r_sum.begin(), r_sum.end(), 0.0);
      std::fill(flips.begin(), flips.end(), 0.0);
      std::fill(f_sum.begin(), f_sum.end(), 0.0);
      for (size_t p0 = first / kBlock * kBlock; p0 <= pos; p0 += kBlock) {
        const size_t j_lo = std::max(p0, first), j_hi = std::min(p0 + kBlock, pos + 1);
        ++blocks;
        double block_max = -INFINITY;
        for (size_t j = j_lo; j < j_hi; ++j) {
          double acc = 0.0, err = 0.0;
          for (size_t d = 0; d < hd; ++d) {
            const double term = q[d] * operand(k[j * hd + d]);
            acc += term;
            err += std::fabs(acc) + std::fabs(term);
          }
          double sj = acc * scale;
          if (cap > 0.0) sj = cap * std::tanh(sj / cap);
          s[j - p0] = sj;
          sig[j - p0] = err * kU * scale;
          sig_m = std::max(sig_m, sig[j - p0]);
          block_max = std::max(block_max, sj);
        }
        const double m_new = std::max(m, block_max);
        if (m != -INFINITY) {
          const double alpha = std::exp(m - m_new);
          l *= alpha;
          for (size_t d = 0; d < hd; ++d) {
            o[d] *= alpha;
            r_sum[d] = r_sum[d] * alpha + (alpha != 1.0 ? std::fabs(o[d]) : 0.0);
            flips[d] *= alpha;
            f_sum[d] *= alpha;
          }
        }
        m = m_new;
        for (size_t j = j_lo; j < j_hi; ++j) {
          const double p = std::exp(s[j - p0] - m);
          const double rho =
              sig[j - p0] + sig_m + 8.0 * kU * (std::fabs(s[j - p0]) + std::fabs(m) + 1.0 + cap);
          rho_max = std::max(rho_max, rho);
          const double p_bf16 = bf16_of(p);
          const double flip = bf16_of(p * (1.0 + rho)) - bf16_of(p * (1.0 - rho));
          l += p;
          for (size_t d = 0; d < hd; ++d) {
            const double vd = operand(v[j * hd + d]), term = p_bf16 * vd;
            o[d] += term;
            r_sum[d] += std::fabs(o[d]) + std::fabs(term);
            flips[d] += flip * std::fabs(vd);
            f_sum[d] += p * std::fabs(vd);
          }
        }
      }
      if (a.sinks) {  // the sink's exp, off by its score's rounding like any key's
        const double sink = a.sinks[h];
        l += std::exp(sink - m);
        rho_max = std::max(rho_max, sig_m + 8.0 * kU * (std::fabs(sink) + std::fabs(m) + 1.0));
      }
      const double chain = 2.0 * sig_m + 16.0 * kU * (std::fabs(m) + 1.0) + 4.0 * kU * blocks;
      const double eps_l = rho_max + 4.0 * kU * blocks + (kBlock + 1 + blocks) * kU;
      const double eps = eps_l + chain + 2.0 * kU;
      for (size_t d = 0; d < hd; ++d) {
        a.out[row + d] = static_cast<float>(o[d] / l);
        if (tol)
          tol[row + d] = static_cast<float>(
              (eps * f_sum[d] + kU * r_sum[d] + flips[d]) / l * (1.0 + 0x1p-10) + 0x1p-100);
      }
    }
  }
}

}  // namespace

void attention_bf16(const AttentionArgs& a, float* tolerance) {
  if (a.kv_dtype == KvDtype::bf16)
    attention_bf16_of<uint16_t>(a, tolerance);
  else
    attention_bf16_of<float>(a, tolerance);
}

}  // namespace edgellm::kernels::ref
