// Causal GQA prefill attention at AttnPrecision::bf16 for AVX-512 CPUs
// without AMX: q, K, V and the softmax weights P are rounded to bf16 (nearest
// even) once, both products run on vdpbf16ps with fp32 accumulation, and the
// online softmax (max, exp, sums, rescaling) stays fp32. On Zen 4 vdpbf16ps
// does twice the fp32 FMA's flops per cycle.
//
// attention_amx.cpp's transposed layout with vdpbf16ps for the tiles:
// S^T = K Q^T and O^T += V^T P^T, query rows in the lanes, so a key's scores
// for 16 rows are one vector and the softmax runs down the columns (max, exp2
// with log2 e folded into the scale, sums, O's rescale: 16 rows at once, no
// horizontal reductions). A vdpbf16ps lane adds the products of one bf16 pair,
// broadcast from one operand, with the pair of the other:
//   K   per 32-key block [32 keys][hd / 2] dwords: key j's dims (2i, 2i + 1)
//   Q^T per work item    [hd / 2][kRows] dwords:   row r's dims (2i, 2i + 1)
//   V^T per 32-key block [hd][16] dwords:          dim d of keys (2i, 2i + 1)
//   P^T per block        [16][kRows] dwords:       row r's P of keys (2i, 2i + 1)
// K and V^T are laid out once per call for every kv head (an fp32 cache
// rounded, a bf16 one copied); keys no query of the call sees are zeros, so a
// masked key's P = 0 never meets a NaN in V. The key blocks are
// kSoftmaxBlock = 32 keys from multiples of 32, as in the avx512 and amx
// kernels: P is rounded relative to the running max of the blocks so far, and
// ref::attention_bf16 follows the same blocks.
//
// Work item = (kv head, up to kRows = 48 query rows = tokens x the group's
// heads: 16 tokens of SmolLM2's groups of 3, 12 of Gemma 3's 4). Register
// tiles of 24 accumulators: scores 8 keys x 3 row vectors, P.V 8 head dims x
// 3 row vectors.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/online_softmax_avx512.h"
#include "kernels/transpose_avx512.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

constexpr size_t kKeys = kSoftmaxBlock;
static_assert(kKeys == 32, "a key block: 16 key pairs of P^T");
constexpr size_t kRowVecs = 3;
constexpr size_t kRows = 16 * kRowVecs;
constexpr size_t kTileKeys = 8;  // keys per score register tile
constexpr size_t kTileDims = 8;  // head dims per P.V register tile

// Dword i = (bf16(even[i]), bf16(odd[i])), the low half first: one
// conversion of both and a word interleave.
inline __m512i to_bf16_pairs(__m512 even, __m512 odd, __m512i interleave, bool truncate) {
  if (truncate) {
    const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    // top ? odd : even >> 16, bit by bit.
    return _mm512_ternarylogic_epi32(top, _mm512_castps_si512(odd),
                                     _mm512_srli_epi32(_mm512_castps_si512(even), 16), 0xca);
  }
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// Word 2i <- word i (even's), word 2i + 1 <- word 16 + i (odd's).
inline __m512i pair_interleave() {
  alignas(64) uint16_t idx[32];
  for (uint16_t i = 0; i < 16; ++i) {
    idx[2 * i] = i;
    idx[2 * i + 1] = static_cast<uint16_t>(16 + i);
  }
  return _mm512_load_si512(idx);
}

// A cache row of hd elements as hd / 2 dwords of bf16 pairs.
template <typename T>
void row_to_pairs(const T* row, size_t hd, bool truncate, uint32_t* out) {
  for (size_t d = 0; d < hd; d += 32) {
    __m512i v;
    if constexpr (std::is_same_v<T, uint16_t>)
      v = _mm512_loadu_si512(row + d);  // bf16 already: as stored
    else
      v = to_bf16(_mm512_loadu_ps(row + d), _mm512_loadu_ps(row + d + 16), truncate);
    _mm512_storeu_si512(out + d / 2, v);
  }
}

// The call's K and V^T of every kv head (layouts above), for the blocks from
// b0 (the block of the first key any query sees) on.
struct KvLayout {
  size_t b0 = 0, blocks = 0, hd = 0;
  const uint32_t* k = nullptr;   // [kv][blocks][kKeys][hd / 2]
  const uint32_t* vt = nullptr;  // [kv][blocks][hd][kKeys / 2]
  size_t block_dwords() const { return kKeys * hd / 2; }
  const uint32_t* k_block(size_t kvh, size_t block) const {
    return k + (kvh * blocks + block - b0) * block_dwords();
  }
  const uint32_t* vt_block(size_t kvh, size_t block) const {
    return vt + (kvh * blocks + block - b0) * block_dwords();
  }
};

// The first 64-byte aligned element of `buf` grown to hold `count` from there.
template <typename T>
T* align64(std::vector<T>& buf, size_t count) {
  const size_t pad = 64 / sizeof(T);
  if (buf.size() < count + pad) buf.resize(count + pad);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(T);
}

template <typename T>
KvLayout lay_out_kv(const AttentionArgs& a, bool truncate, std::vector<uint32_t>& kbuf,
                    std::vector<uint32_t>& vbuf, ThreadPool& pool) {
  const size_t hd = a.head_dim, keys = a.start + a.n, k_first = first_key(a, a.start);
  KvLayout t;
  t.hd = hd;
  t.b0 = k_first / kKeys;
  t.blocks = (keys + kKeys - 1) / kKeys - t.b0;
  const size_t elems = a.n_kv_heads * t.blocks * t.block_dwords();
  uint32_t* kbase = align64(kbuf, elems);
  uint32_t* vbase = align64(vbuf, elems);
  pool.parallel_for(a.n_kv_heads * t.blocks, [&](size_t item) {
    const size_t kvh = item / t.blocks, p0 = (t.b0 + item % t.blocks) * kKeys;
    // Keys [j_lo, j_hi) of the block are in the call's reach; the rest are zeros.
    const size_t j_lo = std::max(p0, k_first) - p0, j_hi = std::min(p0 + kKeys, keys) - p0;
    const T* k = static_cast<const T*>(a.k_cache) + (kvh * a.cache_stride + p0) * hd;
    const T* v = static_cast<const T*>(a.v_cache) + (kvh * a.cache_stride + p0) * hd;
    uint32_t* kdst = kbase + item * t.block_dwords();
    std::fill(kdst, kdst + t.block_dwords(), 0u);
    for (size_t j = j_lo; j < j_hi; ++j) row_to_pairs(k + j * hd, hd, truncate, kdst + j * hd / 2);
    // V rows as bf16 ([32 keys][hd] in dwords), then keys (2i, 2i + 1)
    // interleaved per head dim ([16 pairs][hd]), then that transposed.
    thread_local std::vector<uint32_t> rows, pairs;
    rows.assign(t.block_dwords(), 0u);
    pairs.resize(t.block_dwords());
    for (size_t j = j_lo; j < j_hi; ++j)
      row_to_pairs(v + j * hd, hd, truncate, rows.data() + j * hd / 2);
    const auto* src = reinterpret_cast<const uint16_t*>(rows.data());
    for (size_t i = 0; i < kKeys / 2; ++i)
      for (size_t d = 0; d < hd; d += 16) {
        const __m512i e = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i * hd + d)));
        const __m512i o = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * i + 1) * hd + d)));
        _mm512_storeu_si512(pairs.data() + i * hd + d,
                            _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
      }
    uint32_t* vdst = vbase + item * t.block_dwords();
    for (size_t d = 0; d < hd; d += 16) transpose16(pairs.data() + d, hd, vdst + d * 16, 16);
  });
  t.k = kbase;
  t.vt = vbase;
  return t;
}

// S^T[j][r] = k_j . q_r for the block's 32 keys and R row vectors; mx[r]:
// each row's max over the 32 (what the softmax needs when no key is masked).
template <size_t R>
void scores(const uint32_t* k, const uint32_t* qt, size_t hd, float* st, __m512* mx) {
#pragma GCC unroll 3
  for (size_t r = 0; r < R; ++r) mx[r] = _mm512_set1_ps(-INFINITY);
  const size_t hp = hd / 2;
  for (size_t j0 = 0; j0 < kKeys; j0 += kTileKeys) {
    __m512 acc[kTileKeys][R];
#pragma GCC unroll 8
    for (size_t j = 0; j < kTileKeys; ++j)
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
    const uint32_t* kj = k + j0 * hp;
    for (size_t i = 0; i < hp; ++i) {
      __m512bh q[R];
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r) q[r] = (__m512bh)_mm512_load_si512(qt + i * kRows + 16 * r);
#pragma GCC unroll 8
      for (size_t j = 0; j < kTileKeys; ++j) {
        const __m512bh kv = (__m512bh)_mm512_set1_epi32(static_cast<int>(kj[j * hp + i]));
#pragma GCC unroll 3
        for (size_t r = 0; r < R; ++r) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], kv, q[r]);
      }
    }
#pragma GCC unroll 8
    for (size_t j = 0; j < kTileKeys; ++j)
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r) {
        _mm512_store_ps(st + (j0 + j) * kRows + 16 * r, acc[j][r]);
        mx[r] = _mm512_max_ps(mx[r], acc[j][r]);
      }
  }
}

// O^T = O^T * alpha + V^T P^T over the block, for R row vectors.
template <size_t R>
void pv(float* ot, const __m512* alpha, const uint32_t* vt, const uint32_t* pt, size_t hd) {
  for (size_t d0 = 0; d0 < hd; d0 += kTileDims) {
    __m512 acc[kTileDims][R];
    float* o = ot + d0 * kRows;
#pragma GCC unroll 8
    for (size_t d = 0; d < kTileDims; ++d)
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r)
        acc[d][r] = _mm512_mul_ps(_mm512_load_ps(o + d * kRows + 16 * r), alpha[r]);
    const uint32_t* v = vt + d0 * (kKeys / 2);
    for (size_t i = 0; i < kKeys / 2; ++i) {
      __m512bh p[R];
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r) p[r] = (__m512bh)_mm512_load_si512(pt + i * kRows + 16 * r);
#pragma GCC unroll 8
      for (size_t d = 0; d < kTileDims; ++d) {
        const __m512bh vv = (__m512bh)_mm512_set1_epi32(static_cast<int>(v[d * (kKeys / 2) + i]));
#pragma GCC unroll 3
        for (size_t r = 0; r < R; ++r) acc[d][r] = _mm512_dpbf16_ps(acc[d][r], vv, p[r]);
      }
    }
#pragma GCC unroll 8
    for (size_t d = 0; d < kTileDims; ++d)
#pragma GCC unroll 3
      for (size_t r = 0; r < R; ++r) _mm512_store_ps(o + d * kRows + 16 * r, acc[d][r]);
  }
}

using ScoresFn = void (*)(const uint32_t*, const uint32_t*, size_t, float*, __m512*);
using PvFn = void (*)(float*, const __m512*, const uint32_t*, const uint32_t*, size_t);
constexpr ScoresFn kScores[kRowVecs + 1] = {nullptr, scores<1>, scores<2>, scores<3>};
constexpr PvFn kPv[kRowVecs + 1] = {nullptr, pv<1>, pv<2>, pv<3>};

// The online-softmax step of one block for 16 rows (one vector each): S^T
// column `st` (rows kRows apart) in, P^T column `pt` out, m/l updated (log2
// units); returns alpha per row. pos/first: each row's position and first
// visible key; `all` when every key of the block is visible to every row;
// raw_max: the rows' max raw score of the block.
__m512 softmax_rows(const AttentionArgs& a, size_t p0, bool all, __m512i pos, __m512i first,
                    float* st, __m512 raw_max, uint32_t* pt, __m512i interleave, bool truncate,
                    __m512& m, __m512& l) {
  // exp(s) = 2^(s log2 e): scores become x = s * scale * log2 e (softcap
  // applied first), here as an FMA on the raw scores or stored back.
  constexpr float kLog2e = 1.44269504088896341f;
  const bool capped = a.softcap > 0.0f;
  const float cs = capped ? 1.0f : a.scale * kLog2e;
  const __m512 c = _mm512_set1_ps(cs);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  __mmask16 keep[kKeys];
  // With every key visible and no softcap, max(s c) = c max(s) (rounding is
  // monotone; c > 0): no pass over the scores.
  const bool fused_max = all && !capped && cs > 0.0f;
  if (fused_max) mx = _mm512_mul_ps(raw_max, c);
  for (size_t j = 0; j < kKeys && !fused_max; ++j) {
    __m512 x = _mm512_load_ps(st + j * kRows);
    if (capped) {
      const __m512 cap = _mm512_set1_ps(a.softcap);
      x = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(a.scale)),
                        _mm512_set1_ps(1.0f / a.softcap));
      x = _mm512_mul_ps(_mm512_mul_ps(cap, tanh_ps(x)), _mm512_set1_ps(kLog2e));
      _mm512_store_ps(st + j * kRows, x);
    } else {
      x = _mm512_mul_ps(x, c);
    }
    keep[j] = 0xffff;
    if (!all) {
      const __m512i key = _mm512_set1_epi32(static_cast<int>(p0 + j));
      keep[j] = _mm512_cmple_epi32_mask(key, pos) & _mm512_cmpge_epi32_mask(key, first);
      x = _mm512_mask_blend_ps(keep[j], neg_inf, x);
    }
    mx = _mm512_max_ps(mx, x);
  }
  const __m512 m_new = _mm512_max_ps(m, mx);
  // Rows that saw no key yet keep m = -inf and alpha = 1 (O^T and l are 0).
  const __mmask16 seen = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
  const __m512 alpha =
      _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), seen, exp2_ps(_mm512_sub_ps(m, m_new)));
  __m512 sum = _mm512_setzero_ps();
  if (fused_max) std::fill(keep, keep + kKeys, static_cast<__mmask16>(0xffff));
  for (size_t j = 0; j < kKeys; j += 2) {
    // Masked keys get exactly 0, not exp's smallest denormal (nor the NaN
    // exp2_ps_finite gives a masked -inf, or a row that saw no key: s - -inf).
    const __m512 e0 = _mm512_maskz_mov_ps(
        keep[j] & seen, exp2_ps_finite(_mm512_fmsub_ps(_mm512_load_ps(st + j * kRows), c, m_new)));
    const __m512 e1 = _mm512_maskz_mov_ps(
        keep[j + 1] & seen,
        exp2_ps_finite(_mm512_fmsub_ps(_mm512_load_ps(st + (j + 1) * kRows), c, m_new)));
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    _mm512_store_si512(pt + (j / 2) * kRows, to_bf16_pairs(e0, e1, interleave, truncate));
  }
  l = _mm512_fmadd_ps(l, alpha, sum);
  m = m_new;
  return alpha;
}

// Per-thread scratch of one work item, 64-byte aligned.
struct ItemScratch {
  uint32_t* q_rows;  // [kRows][hd / 2]
  uint32_t* qt;      // [hd / 2][kRows]
  float* st;         // [kKeys][kRows]
  uint32_t* pt;      // [kKeys / 2][kRows]
  float* ot;         // [hd][kRows]
  float* o_rows;     // [kRows][hd]
};

ItemScratch scratch(size_t hd) {
  thread_local std::vector<uint32_t> buf;
  const size_t q = kRows * hd / 2, s = kKeys * kRows, p = kKeys / 2 * kRows, o = hd * kRows;
  uint32_t* base = align64(buf, 2 * q + s + p + 2 * o);
  return {base,
          base + q,
          reinterpret_cast<float*>(base + 2 * q),
          base + 2 * q + s,
          reinterpret_cast<float*>(base + 2 * q + s + p),
          reinterpret_cast<float*>(base + 2 * q + s + p + o)};
}

// Query tokens [t0, t1) of kv head kvh: rows r = token x group + head.
// skip_diagonal: Fault::skip_attention_block (the block with the last row's
// causal diagonal left out).
void attend_item(const AttentionArgs& a, const KvLayout& kv, size_t group, size_t kvh, size_t t0,
                 size_t t1, bool truncate, bool skip_diagonal) {
  const size_t hd = a.head_dim, hp = hd / 2, rows = (t1 - t0) * group;
  const size_t vecs = (rows + 15) / 16;
  const ItemScratch sc = scratch(hd);
  std::fill(sc.ot, sc.ot + hd * kRows, 0.0f);
  alignas(64) int32_t pos[kRows], first[kRows];
  // q rows as bf16 pairs (padding rows 0), then transposed: [hd / 2][kRows].
  for (size_t r = 0; r < vecs * 16; ++r) {
    // Padding rows see what the last token sees (their q is 0, their output unused).
    const size_t t = std::min(t0 + r / group, t1 - 1);
    pos[r] = static_cast<int32_t>(a.start + t);
    first[r] = static_cast<int32_t>(first_key(a, a.start + t));
    uint32_t* dst = sc.q_rows + r * hp;
    if (r >= rows) {
      std::fill(dst, dst + hp, 0u);
      continue;
    }
    row_to_pairs(a.q + ((t0 + r / group) * a.n_heads + kvh * group + r % group) * hd, hd, truncate,
                 dst);
  }
  for (size_t r0 = 0; r0 < vecs * 16; r0 += 16)
    for (size_t i0 = 0; i0 < hp; i0 += 16)
      transpose16(sc.q_rows + r0 * hp + i0, hp, sc.qt + i0 * kRows + r0, kRows);
  __m512 m[kRowVecs], l[kRowVecs], alpha[kRowVecs], raw_max[kRowVecs];
  __m512i pos_v[kRowVecs], first_v[kRowVecs];
  for (size_t h = 0; h < vecs; ++h) {
    m[h] = _mm512_set1_ps(-INFINITY);
    l[h] = _mm512_setzero_ps();
    pos_v[h] = _mm512_load_si512(pos + 16 * h);
    first_v[h] = _mm512_load_si512(first + 16 * h);
  }
  const __m512i interleave = pair_interleave();
  const size_t min_pos = a.start + t0, max_first = first_key(a, a.start + t1 - 1);
  const size_t lo = first_key(a, min_pos), hi = a.start + t1;
  const size_t diagonal = (hi - 1) / kKeys * kKeys;
  for (size_t p0 = lo / kKeys * kKeys; p0 < hi; p0 += kKeys) {
    if (skip_diagonal && p0 == diagonal) continue;
    const size_t block = p0 / kKeys;
    kScores[vecs](kv.k_block(kvh, block), sc.qt, hd, sc.st, raw_max);
    const bool all = p0 + kKeys - 1 <= min_pos && p0 >= max_first;
    for (size_t h = 0; h < vecs; ++h)
      alpha[h] = softmax_rows(a, p0, all, pos_v[h], first_v[h], sc.st + 16 * h, raw_max[h],
                              sc.pt + 16 * h, interleave, truncate, m[h], l[h]);
    kPv[vecs](sc.ot, alpha, kv.vt_block(kvh, block), sc.pt, hd);
  }
  alignas(64) float inv_l[kRows];
  for (size_t h = 0; h < vecs; ++h)
    _mm512_store_ps(inv_l + 16 * h, _mm512_div_ps(_mm512_set1_ps(1.0f), l[h]));
  if (a.sinks) add_sinks_log2(a, group, kvh, rows, m, l, inv_l);
  // O^T back to rows ([kRows][hd]), each scaled by 1 / l.
  for (size_t d0 = 0; d0 < hd; d0 += 16)
    for (size_t r0 = 0; r0 < vecs * 16; r0 += 16)
      transpose16(reinterpret_cast<const uint32_t*>(sc.ot + d0 * kRows + r0), kRows,
                  reinterpret_cast<uint32_t*>(sc.o_rows + r0 * hd + d0), hd);
  for (size_t r = 0; r < rows; ++r) {
    float* out = a.out + ((t0 + r / group) * a.n_heads + kvh * group + r % group) * hd;
    const __m512 inv = _mm512_set1_ps(inv_l[r]);
    for (size_t d = 0; d < hd; d += 16)
      _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_load_ps(sc.o_rows + r * hd + d), inv));
  }
}

}  // namespace

void attention_prefill_bf16(const AttentionArgs& in, ThreadPool& pool) {
  if (in.n == 0 || in.n_heads == 0) return;
  // A q8_0 cache is widened to fp32 first (exact: int8 times a half scale), so
  // the kernel computes what it computes on the fp32 cache holding those values.
  thread_local std::vector<float> k_wide, v_wide;
  AttentionArgs a = in;
  if (in.kv_dtype == KvDtype::q8_0) {
    const size_t keys = in.start + in.n, hd = in.head_dim;
    k_wide.resize(in.n_kv_heads * keys * hd);
    v_wide.resize(in.n_kv_heads * keys * hd);
    // The caller's buffers (a worker's thread_local would be its own).
    float* const kw = k_wide.data();
    float* const vw = v_wide.data();
    pool.parallel_for(2 * in.n_kv_heads, [&](size_t i) {
      const size_t kvh = i / 2, first = kvh * in.cache_stride * hd;
      const bool value = i % 2;
      dequantize_q8_0(static_cast<const int8_t*>(value ? in.v_cache : in.k_cache) + first,
                      (value ? in.v_scale : in.k_scale) + first / kKvQ8Block, keys, hd,
                      (value ? vw : kw) + kvh * keys * hd, hd);
    });
    a.k_cache = kw;
    a.v_cache = vw;
    a.kv_dtype = KvDtype::fp32;
    a.cache_stride = keys;
  }
  const fault::Fault f = fault::active();
  const bool truncate = f == fault::Fault::bf16_truncate;
  const bool skip_diagonal = f == fault::Fault::skip_attention_block;
  const size_t group = a.n_heads / a.n_kv_heads;
  // Buffers of the calling thread, read by the workers.
  thread_local std::vector<uint32_t> kbuf, vbuf;
  const KvLayout kv = a.kv_dtype == KvDtype::bf16
                          ? lay_out_kv<uint16_t>(a, truncate, kbuf, vbuf, pool)
                          : lay_out_kv<float>(a, truncate, kbuf, vbuf, pool);
  const size_t tile_tokens = kRows / group;
  const size_t q_tiles = (a.n + tile_tokens - 1) / tile_tokens;
  pool.parallel_for(a.n_kv_heads * q_tiles, [&](size_t item) {
    // One kv head at a time (its K and V^T stay in L2 across its tiles),
    // latest tiles (most keys) first, for load balance.
    const size_t kvh = item / q_tiles, qt = q_tiles - 1 - item % q_tiles;
    const size_t t0 = qt * tile_tokens, t1 = std::min(a.n, t0 + tile_tokens);
    attend_item(a, kv, group, kvh, t0, t1, truncate, skip_diagonal);
  });
}

}  // namespace edgellm::kernels::avx512
