// Causal GQA prefill attention on AMX-BF16 tiles, flash style: a work item
// is (kv head, tile of <= 32 query rows = tokens x the group's heads), keys
// go in blocks of 32 with an online softmax, both products run on TDPBF16PS.
//
// Transposed: the tiles compute S^T = K Q^T and O^T += V^T P^T, so a key's
// scores for 16 query rows are one vector. The softmax is then vertical
// (row max, exp, row sums and O's rescale across 16 rows at once): the
// per-row horizontal reductions and scalar exp of the avx512 kernel's layout
// cost more than both tile products together.
//
// Precision: fp32 operands are split into bf16 parts as the AMX GEMM splits x
// (avx512::to_bf16_parts): with P parts, a product a.b is the sum of the part
// products a_i.b_j with i + j < P. AttnPrecision::fp32 takes P = 3: the
// dropped ones are below 2^-24 of |a||b|, the class of error of an fp32 FMA
// dot. AttnPrecision::bf16 takes P = 1: q, K, V and P rounded to bf16 once.
// Products are exact in fp32, sums fp32. A bf16 cache's K and V are their own
// single part (exact), so it takes P passes per product instead of 2P, and
// gives the very bits the fp32 cache holding the widened values gives (the
// passes it skips add zeros). A q8_0 cache is widened to fp32 first (exact:
// int8 times a half scale, up to 18 significant bits, so it needs the P parts
// of an fp32 value) and laid out as the fp32 cache holding those values; the
// widening is a small part of the once-per-call layout pass, and it keeps
// prefill on the tiles.
//
// Layouts (bf16, per part), keys past the cache's end zero:
//   K   per 32-key block [32 keys][hd]          A tiles of S^T (16 keys x 32 dims)
//   V^T per 32-key block [hd][32 keys]          A tiles of O^T (16 dims x 32 keys)
//   Q^T per item [hd / 2][32 rows][2]           B tiles of S^T (16 dim pairs x 16 rows)
//   P^T per block [16 key pairs][32 rows][2]    B tiles of O^T (16 key pairs x 16 rows)
// K and V^T are laid out once per call for every kv head; S^T [32 keys][32
// rows] and O^T [hd][32 rows] are fp32 in the item's scratch.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/amx_tiles.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/online_softmax_avx512.h"
#include "kernels/transpose_avx512.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::amx {

namespace {
using avx512::kSoftmaxBlock;
using avx512::transpose16;
constexpr size_t kRows = 32;  // query rows per work item: two 16-row tile halves
constexpr size_t kKeys = kSoftmaxBlock;
static_assert(kKeys == 32, "a key block: two 16-key A tiles of S^T, one K step of V^T P^T");

inline __m512 widen(__m256i bf16) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

// Parts of 32 fp32 (x0: the first 16) as `parts` rows of 32 bf16, `stride`
// elements apart; each part rounds (nearest even) what the previous left, or
// truncates it under Fault::bf16_truncate.
inline void split32(__m512 x0, __m512 x1, size_t parts, bool truncate, uint16_t* out,
                    size_t stride) {
  for (size_t p = 0; p < parts; ++p) {
    const __m512i v = avx512::to_bf16(x0, x1, truncate);
    _mm512_storeu_si512(out + p * stride, v);
    x0 = _mm512_sub_ps(x0, widen(_mm512_castsi512_si256(v)));
    x1 = _mm512_sub_ps(x1, widen(_mm512_extracti64x4_epi64(v, 1)));
  }
}

// Parts of two rows' 16 values as VNNI pairs: out[p * stride + 2i + c] = part
// p of (c ? odd : even)[i]. Three parts hold any fp32 exactly however each
// rounds, so they truncate (a part is the value's top 16 bits: two logic ops
// per pair, no conversions); fewer round to nearest even, or truncate too
// under Fault::bf16_truncate.
inline void split_pairs(__m512 even, __m512 odd, size_t parts, bool truncate, uint16_t* out,
                        size_t stride) {
  if (parts == 3 || truncate) {
    const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (size_t p = 0; p < parts; ++p) {
      const __m512i e = _mm512_castps_si512(even), o = _mm512_castps_si512(odd);
      // (e >> 16) | (o & top): bit-select of o and the shifted e by `top`.
      _mm512_storeu_si512(out + p * stride,
                          _mm512_ternarylogic_epi32(top, o, _mm512_srli_epi32(e, 16), 0xca));
      even = _mm512_sub_ps(even, _mm512_castsi512_ps(_mm512_and_si512(e, top)));
      odd = _mm512_sub_ps(odd, _mm512_castsi512_ps(_mm512_and_si512(o, top)));
    }
    return;
  }
  for (size_t p = 0; p < parts; ++p) {
    const __m256i e = (__m256i)_mm512_cvtneps_pbh(even), o = (__m256i)_mm512_cvtneps_pbh(odd);
    _mm512_storeu_si512(
        out + p * stride,
        _mm512_or_si512(_mm512_cvtepu16_epi32(e), _mm512_slli_epi32(_mm512_cvtepu16_epi32(o), 16)));
    even = _mm512_sub_ps(even, widen(e));
    odd = _mm512_sub_ps(odd, widen(o));
  }
}

// C tiles 0..3 += sum over part pairs (i, j), i < a_parts, j < b_parts,
// i + j < parts, i-major, of A_i B_j: C tile 2h + c is A row half h (tile
// 4 + h) times B column half c (tile 6 + c); a(i, h) and b(j, c) give the
// tiles' addresses, strides in bytes. A is the streamed operand (K, V^T):
// each of its tiles is loaded once; B (Q^T, P^T) stays in L1.
template <class Tiles, typename A, typename B>
inline void dot_parts(Tiles tiles, size_t parts, size_t a_parts, A a, size_t a_stride,
                      size_t b_parts, B b, size_t b_stride) {
  for (size_t i = 0; i < a_parts && i < parts; ++i) {
    tile_load<4>(tiles, a(i, 0), a_stride);
    tile_load<5>(tiles, a(i, 1), a_stride);
    for (size_t j = 0; j < b_parts && i + j < parts; ++j) {
      // This order measured a third faster than pairing each B tile's two
      // uses (0, 2, 1, 3).
      tile_load<6>(tiles, b(j, 0), b_stride);
      tile_load<7>(tiles, b(j, 1), b_stride);
      tile_dpbf16ps<0, 4, 6>(tiles);
      tile_dpbf16ps<1, 4, 7>(tiles);
      tile_dpbf16ps<2, 5, 6>(tiles);
      tile_dpbf16ps<3, 5, 7>(tiles);
    }
  }
}

// The call's K and V^T of every kv head (layouts above).
struct KvTiles {
  size_t parts = 0, blocks = 0, hd = 0;  // parts of K and V; 32-key blocks per kv head
  const uint16_t* k = nullptr;           // [kv][blocks][parts][32][hd]
  const uint16_t* vt = nullptr;          // [kv][blocks][parts][hd][32]
  size_t part_elems() const { return kKeys * hd; }
  const uint16_t* k_part(size_t kvh, size_t block, size_t part) const {
    return k + ((kvh * blocks + block) * parts + part) * part_elems();
  }
  const uint16_t* vt_part(size_t kvh, size_t block, size_t part) const {
    return vt + ((kvh * blocks + block) * parts + part) * part_elems();
  }
};

// The first 64-byte aligned element of `buf` grown to hold `count` from there.
uint16_t* align64(std::vector<uint16_t>& buf, size_t count) {
  if (buf.size() < count + 32) buf.resize(count + 32);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(uint16_t);
}

// One cache row of `hd` elements as parts, out[p * stride + d] (a bf16
// cache's row is its own single part).
template <typename T>
void row_parts(const T* row, size_t hd, size_t parts, bool truncate, uint16_t* out, size_t stride) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    std::copy(row, row + hd, out);
  } else {
    for (size_t d = 0; d < hd; d += 32)
      split32(_mm512_loadu_ps(row + d), _mm512_loadu_ps(row + d + 16), parts, truncate, out + d,
              stride);
  }
}

// One 32-key block's `count` K and V rows (hd apart) as its K and V^T parts
// (layouts above; keys past count zero).
template <typename T>
void lay_out_block(const T* k, const T* v, size_t count, size_t parts, bool truncate,
                   const KvTiles& t, uint16_t* kdst, uint16_t* vdst) {
  const size_t hd = t.hd, block_elems = parts * t.part_elems();
  std::fill(kdst, kdst + block_elems, uint16_t{0});
  for (size_t j = 0; j < count; ++j)
    row_parts(k + j * hd, hd, parts, truncate, kdst + j * hd, t.part_elems());
  thread_local std::vector<uint16_t> rows;  // V as [part][32 keys][hd], then transposed
  rows.assign(block_elems, 0);
  for (size_t j = 0; j < count; ++j)
    row_parts(v + j * hd, hd, parts, truncate, rows.data() + j * hd, t.part_elems());
  // V^T: keys (2i, 2i + 1) interleaved per head dim ([16 pairs][hd] of
  // uint32), then that transposed: [hd][16 pairs] is [hd][32 keys].
  thread_local std::vector<uint32_t> pairs;
  pairs.resize(kKeys / 2 * hd);
  for (size_t p = 0; p < parts; ++p) {
    const uint16_t* src = rows.data() + p * t.part_elems();
    for (size_t i = 0; i < kKeys / 2; ++i)
      for (size_t d = 0; d < hd; d += 16) {
        const __m512i e = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i * hd + d)));
        const __m512i o = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * i + 1) * hd + d)));
        _mm512_storeu_si512(pairs.data() + i * hd + d,
                            _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
      }
    auto* dst = reinterpret_cast<uint32_t*>(vdst + p * t.part_elems());
    for (size_t d = 0; d < hd; d += 16) transpose16(pairs.data() + d, hd, dst + d * 16, 16);
  }
}

template <typename T>
KvTiles lay_out_kv(const AttentionArgs& a, size_t keys, size_t parts, bool truncate,
                   std::vector<uint16_t>& kbuf, std::vector<uint16_t>& vbuf, ThreadPool& pool) {
  KvTiles t;
  t.parts = parts;
  t.hd = a.head_dim;
  t.blocks = (keys + kKeys - 1) / kKeys;
  const size_t hd = a.head_dim, block_elems = parts * t.part_elems();
  // 64-byte aligned: a tile row split across two cache lines costs two reads.
  const size_t elems = a.n_kv_heads * t.blocks * block_elems;
  uint16_t* kbase = align64(kbuf, elems);
  uint16_t* vbase = align64(vbuf, elems);
  pool.parallel_for(a.n_kv_heads * t.blocks, [&](size_t item) {
    const size_t kvh = item / t.blocks, p0 = (item % t.blocks) * kKeys;
    const size_t count = std::min(kKeys, keys - p0);
    const size_t first = (kvh * a.cache_stride + p0) * hd;  // the block's first element
    const T* k = static_cast<const T*>(a.k_cache) + first;
    const T* v = static_cast<const T*>(a.v_cache) + first;
    uint16_t* kdst = kbase + item * block_elems;
    uint16_t* vdst = vbase + item * block_elems;
    if constexpr (std::is_same_v<T, int8_t>) {  // widened rows, laid out as an fp32 cache's
      thread_local std::vector<float> kw, vw;
      kw.resize(kKeys * hd);
      vw.resize(kKeys * hd);
      avx512::dequantize_q8_0(k, a.k_scale + first / kKvQ8Block, count, hd, kw.data(), hd);
      avx512::dequantize_q8_0(v, a.v_scale + first / kKvQ8Block, count, hd, vw.data(), hd);
      lay_out_block(kw.data(), vw.data(), count, parts, truncate, t, kdst, vdst);
    } else {
      lay_out_block(k, v, count, parts, truncate, t, kdst, vdst);
    }
  });
  t.k = kbase;
  t.vt = vbase;
  return t;
}

// Per-thread scratch of one work item, 64-byte aligned.
struct ItemScratch {
  uint16_t* qt;  // [parts][hd / 2][kRows][2]
  uint16_t* pt;  // [parts][kKeys / 2][kRows][2]
  float* st;     // [kKeys][kRows]
  float* ot;     // [hd][kRows]
};

ItemScratch scratch(size_t parts, size_t hd) {
  thread_local std::vector<float> buf;
  const size_t q_floats = parts * kRows * hd / 2, p_floats = parts * kRows * kKeys / 2;
  const size_t floats = q_floats + p_floats + kKeys * kRows + hd * kRows;
  if (buf.size() < floats + 16) buf.resize(floats + 16);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  float* base = buf.data() + ((64 - addr % 64) % 64) / sizeof(float);
  return {reinterpret_cast<uint16_t*>(base), reinterpret_cast<uint16_t*>(base + q_floats),
          base + q_floats + p_floats, base + q_floats + p_floats + kKeys * kRows};
}

// The online-softmax step of one block for 16 rows (one vector each): S^T
// column half `st` (rows kRows apart) in, P^T parts out, m/l updated; returns
// alpha per row. pos/first: each row's position and first visible key; `all`
// when every key of the block is visible to every row.
__m512 softmax_half(const AttentionArgs& a, size_t p0, bool all, __m512i pos, __m512i first,
                    float* st, size_t parts, bool truncate, uint16_t* pt, __m512& m, __m512& l) {
  // Scores in log2 units (exp(s) = 2^(s log2 e)): m and the stored x too.
  constexpr float kLog2e = 1.44269504088896341f;
  const __m512 scale = _mm512_set1_ps(a.softcap > 0.0f ? a.scale : a.scale * kLog2e);
  const __m512 cap = _mm512_set1_ps(a.softcap), log2e = _mm512_set1_ps(kLog2e);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 mx = neg_inf;
  __mmask16 keep[kKeys];
  for (size_t j = 0; j < kKeys; ++j) {
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(st + j * kRows), scale);
    if (a.softcap > 0.0f)
      x = _mm512_mul_ps(_mm512_mul_ps(cap, avx512::tanh_ps(_mm512_div_ps(x, cap))), log2e);
    keep[j] = 0xffff;
    if (!all) {
      const __m512i key = _mm512_set1_epi32(static_cast<int>(p0 + j));
      keep[j] = _mm512_cmple_epi32_mask(key, pos) & _mm512_cmpge_epi32_mask(key, first);
      x = _mm512_mask_blend_ps(keep[j], neg_inf, x);
    }
    _mm512_storeu_ps(st + j * kRows, x);
    mx = _mm512_max_ps(mx, x);
  }
  const __m512 m_new = _mm512_max_ps(m, mx);
  // Rows that saw no key yet keep m = -inf and alpha = 1 (O^T and l are 0).
  const __mmask16 seen = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
  const __m512 alpha =
      _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), seen, avx512::exp2_ps(_mm512_sub_ps(m, m_new)));
  __m512 sum = _mm512_setzero_ps();
  for (size_t j = 0; j < kKeys; j += 2) {
    // Masked keys get exactly 0, not exp's smallest denormal.
    const __m512 e0 = _mm512_maskz_mov_ps(
        keep[j] & seen, avx512::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(st + j * kRows), m_new)));
    const __m512 e1 = _mm512_maskz_mov_ps(
        keep[j + 1] & seen,
        avx512::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(st + (j + 1) * kRows), m_new)));
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    split_pairs(e0, e1, parts, truncate, pt + (j / 2) * 2 * kRows, kKeys * kRows);
  }
  l = _mm512_fmadd_ps(l, alpha, sum);
  m = m_new;
  return alpha;
}

// Query tokens [t0, t1) of kv head kvh: rows r = token x group + head.
// skip_diagonal: Fault::skip_attention_block (the block with the last row's
// causal diagonal left out).
template <class Tiles>
void attend_item(Tiles tiles, const AttentionArgs& a, const KvTiles& kv, size_t parts,
                 bool truncate, bool skip_diagonal, size_t group, size_t kvh, size_t t0,
                 size_t t1) {
  const size_t hd = a.head_dim, rows = (t1 - t0) * group;
  const ItemScratch sc = scratch(parts, hd);
  const size_t q_plane = hd / 2 * kRows * 2, p_plane = kKeys / 2 * kRows * 2;
  std::fill(sc.ot, sc.ot + hd * kRows, 0.0f);
  alignas(64) int32_t pos[kRows], first[kRows];
  // Q's parts row by row ([part][32 rows][hd]; padding rows 0), then
  // transposed with dim pairs kept together: [hd / 2][32 rows] of uint32.
  thread_local std::vector<uint16_t> q_rows;
  q_rows.resize(parts * kRows * hd);
  for (size_t r = 0; r < kRows; ++r) {
    // Padding rows see every key of the item (their q is 0, their output unused).
    const size_t t = std::min(t0 + r / group, t1 - 1);
    pos[r] = static_cast<int32_t>(a.start + t);
    first[r] = static_cast<int32_t>(avx512::first_key(a, a.start + t));
    if (r >= rows) {
      for (size_t p = 0; p < parts; ++p)
        std::fill_n(q_rows.data() + (p * kRows + r) * hd, hd, uint16_t{0});
      continue;
    }
    const float* q = a.q + ((t0 + r / group) * a.n_heads + kvh * group + r % group) * hd;
    row_parts(q, hd, parts, truncate, q_rows.data() + r * hd, kRows * hd);
  }
  for (size_t p = 0; p < parts; ++p) {
    const auto* src = reinterpret_cast<const uint32_t*>(q_rows.data() + p * kRows * hd);
    auto* dst = reinterpret_cast<uint32_t*>(sc.qt + p * q_plane);
    for (size_t r0 = 0; r0 < kRows; r0 += 16)
      for (size_t i0 = 0; i0 < hd / 2; i0 += 16)
        transpose16(src + r0 * (hd / 2) + i0, hd / 2, dst + i0 * kRows + r0, kRows);
  }
  __m512 m[2], l[2];
  __m512i pos_v[2], first_v[2];
  for (int h = 0; h < 2; ++h) {
    m[h] = _mm512_set1_ps(-INFINITY);
    l[h] = _mm512_setzero_ps();
    pos_v[h] = _mm512_load_si512(pos + 16 * h);
    first_v[h] = _mm512_load_si512(first + 16 * h);
  }
  const size_t min_pos = a.start + t0, max_first = avx512::first_key(a, a.start + t1 - 1);
  const size_t tile_row_bytes = kRows * 2 * sizeof(uint16_t);  // a B tile row: 32 rows' pairs
  const size_t lo = avx512::first_key(a, min_pos), hi = a.start + t1;
  const size_t diagonal = (hi - 1) / kKeys * kKeys;
  for (size_t p0 = lo / kKeys * kKeys; p0 < hi; p0 += kKeys) {
    if (skip_diagonal && p0 == diagonal) continue;
    const size_t block = p0 / kKeys;
    // S^T = K Q^T, 32 head dims per step.
    tile_zero<0>(tiles);
    tile_zero<1>(tiles);
    tile_zero<2>(tiles);
    tile_zero<3>(tiles);
    for (size_t d0 = 0; d0 < hd; d0 += 32) {
      dot_parts(
          tiles, parts, kv.parts,
          [&](size_t i, size_t h) { return kv.k_part(kvh, block, i) + h * 16 * hd + d0; },
          hd * sizeof(uint16_t), parts,
          [&](size_t j, size_t c) { return sc.qt + j * q_plane + (d0 / 2) * kRows * 2 + 32 * c; },
          tile_row_bytes);
    }
    tile_store<0>(tiles, sc.st, kRows * sizeof(float));
    tile_store<1>(tiles, sc.st + 16, kRows * sizeof(float));
    tile_store<2>(tiles, sc.st + 16 * kRows, kRows * sizeof(float));
    tile_store<3>(tiles, sc.st + 16 * kRows + 16, kRows * sizeof(float));
    const bool all = p0 + kKeys - 1 <= min_pos && p0 >= max_first;
    for (int h = 0; h < 2; ++h) {
      const __m512 alpha = softmax_half(a, p0, all, pos_v[h], first_v[h], sc.st + 16 * h, parts,
                                        truncate, sc.pt + 32 * h, m[h], l[h]);
      if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) != 0)
        for (size_t d = 0; d < hd; ++d) {
          float* o = sc.ot + d * kRows + 16 * h;
          _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), alpha));
        }
    }
    // O^T += V^T P^T, 32 head dims (two C tiles per row half) per step.
    for (size_t d0 = 0; d0 < hd; d0 += 32) {
      float* o = sc.ot + d0 * kRows;
      const size_t o_bytes = kRows * sizeof(float);
      tile_load<0>(tiles, o, o_bytes);
      tile_load<1>(tiles, o + 16, o_bytes);
      tile_load<2>(tiles, o + 16 * kRows, o_bytes);
      tile_load<3>(tiles, o + 16 * kRows + 16, o_bytes);
      dot_parts(
          tiles, parts, kv.parts,
          [&](size_t i, size_t h) { return kv.vt_part(kvh, block, i) + (d0 + 16 * h) * kKeys; },
          kKeys * sizeof(uint16_t), parts,
          [&](size_t j, size_t c) { return sc.pt + j * p_plane + 32 * c; }, tile_row_bytes);
      tile_store<0>(tiles, o, o_bytes);
      tile_store<1>(tiles, o + 16, o_bytes);
      tile_store<2>(tiles, o + 16 * kRows, o_bytes);
      tile_store<3>(tiles, o + 16 * kRows + 16, o_bytes);
    }
  }
  alignas(64) float inv_l[kRows];
  for (int h = 0; h < 2; ++h)
    _mm512_store_ps(inv_l + 16 * h, _mm512_div_ps(_mm512_set1_ps(1.0f), l[h]));
  if (a.sinks) avx512::add_sinks_log2(a, group, kvh, rows, m, l, inv_l);
  // O^T back to rows ([32 rows][hd]), each scaled by 1 / l.
  thread_local std::vector<float> o_rows;
  o_rows.resize(kRows * hd);
  for (size_t d0 = 0; d0 < hd; d0 += 16)
    for (size_t r0 = 0; r0 < kRows; r0 += 16)
      transpose16(reinterpret_cast<const uint32_t*>(sc.ot + d0 * kRows + r0), kRows,
                  reinterpret_cast<uint32_t*>(o_rows.data() + r0 * hd + d0), hd);
  for (size_t r = 0; r < rows; ++r) {
    float* out = a.out + ((t0 + r / group) * a.n_heads + kvh * group + r % group) * hd;
    const __m512 inv = _mm512_set1_ps(inv_l[r]);
    for (size_t d = 0; d < hd; d += 16)
      _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(o_rows.data() + r * hd + d), inv));
  }
}

}  // namespace

void attention_prefill(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n == 0 || a.n_heads == 0) return;
  const size_t parts = a.precision == AttnPrecision::bf16 ? 1 : 3;
  const fault::Fault f = fault::active();
  const bool truncate = f == fault::Fault::bf16_truncate;
  const bool skip_diagonal = f == fault::Fault::skip_attention_block;
  const size_t keys = a.start + a.n, group = a.n_heads / a.n_kv_heads;
  // Buffers of the calling thread, read by the workers.
  thread_local std::vector<uint16_t> kbuf, vbuf;
  const KvTiles kv =
      a.kv_dtype == KvDtype::bf16   ? lay_out_kv<uint16_t>(a, keys, 1, truncate, kbuf, vbuf, pool)
      : a.kv_dtype == KvDtype::q8_0 ? lay_out_kv<int8_t>(a, keys, parts, truncate, kbuf, vbuf, pool)
                                    : lay_out_kv<float>(a, keys, parts, truncate, kbuf, vbuf, pool);
  const size_t tile_tokens = kRows / group;
  const size_t q_tiles = (a.n + tile_tokens - 1) / tile_tokens;
  static const TileConfig cfg = uniform_tile_config();
  pool.parallel_for(a.n_kv_heads * q_tiles, [&](size_t item) {
    // One kv head at a time (its K and V^T stay in L2 across its tiles),
    // latest tiles (most keys) first, for load balance.
    const size_t kvh = item / q_tiles, qt = q_tiles - 1 - item % q_tiles;
    const size_t t0 = qt * tile_tokens, t1 = std::min(a.n, t0 + tile_tokens);
    with_tiles([&](auto tiles) {
      tile_config(tiles, &cfg);
      attend_item(tiles, a, kv, parts, truncate, skip_diagonal, group, kvh, t0, t1);
      tile_release(tiles);
    });
  });
}

}  // namespace edgellm::kernels::amx
