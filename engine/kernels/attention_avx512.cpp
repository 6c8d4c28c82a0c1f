// Causal GQA prefill attention for AVX-512, flash style (online softmax over
// key blocks, no score matrix), built for long prompts where attention's
// n^2 work outgrows the projections.
//
// Work item = (kv head, tile of query tokens); a tile's rows are its tokens x
// the query heads of the kv head's group, so each K/V block is read once for
// ~32 rows. Every block of kBlock keys is transposed once per call into
// Kt[head_dim][kBlock] (before the tiles run: a tile re-transposing its blocks
// cost as much as its scores), so that scores become a register-tiled product
// with keys in the lanes: S[rows][keys] += q[row][d] * Kt[d][keys], broadcast
// and FMA only, no horizontal sums. P.V keeps head dims in the lanes:
// o[row][d] += p[row][j] * V[j][d]. All arithmetic is fp32; a bf16 or q8_0
// cache (KvDtype) is widened to fp32 (exactly) in the same once-per-call pass
// that transposes K, and V once per call beside it, so the tiles run the fp32
// code unchanged and give the bits of an fp32 cache holding the widened values.
//
// Decode (n small) has too few rows per kv head to pay for the transpose; the
// dispatcher sends it to the AVX2 kernel, which splits keys across threads.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/avx512.h"
#include "kernels/online_softmax_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

constexpr size_t kBlock = kSoftmaxBlock;  // keys per block: two vectors of scores per row
constexpr size_t kTileRows = 32;          // query rows per tile, about
constexpr int kScoreRows = 6;             // rows per score register tile (12 accumulators)
constexpr int kPvRows = 4;                // rows per P.V register tile (16 accumulators)

// s[r][0..32) = q_r . Kt[:, 0..32) for NR rows; q rows given by pointers.
template <int NR>
void scores(const float* const* q, const float* kt, size_t hd, float* s) {
  __m512 acc[NR][2];
#pragma GCC unroll 6
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (size_t d = 0; d < hd; ++d) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * kBlock), k1 = _mm512_loadu_ps(kt + d * kBlock + 16);
#pragma GCC unroll 6
    for (int r = 0; r < NR; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r][d]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < NR; ++r) {
    _mm512_store_ps(s + r * kBlock, acc[r][0]);
    _mm512_store_ps(s + r * kBlock + 16, acc[r][1]);
  }
}

using ScoresFn = void (*)(const float* const*, const float*, size_t, float*);
constexpr ScoresFn kScores[kScoreRows + 1] = {nullptr,   scores<1>, scores<2>, scores<3>,
                                              scores<4>, scores<5>, scores<6>};

// o_r[d0 .. d0 + 16 * NV) = o_r * alpha_r + sum_j p_r[j] v_j for NR rows (o
// rows hd apart, p rows kBlock apart), keys [0, count).
template <int NR, int NV>
void pv(float* o, const float* alpha, const float* p, const float* v, size_t count, size_t hd) {
  __m512 acc[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    const __m512 va = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i)
      acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + r * hd + 16 * i), va);
  }
  for (size_t j = 0; j < count; ++j) {
    __m512 vj[NV];
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) vj[i] = _mm512_loadu_ps(v + j * hd + 16 * i);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kBlock + j]);
#pragma GCC unroll 4
      for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_fmadd_ps(pr, vj[i], acc[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + r * hd + 16 * i, acc[r][i]);
}

using PvFn = void (*)(float*, const float*, const float*, const float*, size_t, size_t);
template <int NR>
constexpr PvFn kPvByWidth[5] = {nullptr, pv<NR, 1>, pv<NR, 2>, pv<NR, 3>, pv<NR, 4>};
constexpr const PvFn* kPv[kPvRows + 1] = {nullptr, kPvByWidth<1>, kPvByWidth<2>, kPvByWidth<3>,
                                          kPvByWidth<4>};

// Per-thread scratch of one tile: S, the output and the softmax state; Kt is
// the call's transposed K blocks of this kv head, shared by every tile, and v
// its values ([keys][hd]: the cache's own, or a bf16 cache's widened copy).
struct TileState {
  const float* kt;  // [blocks][hd][kBlock]
  const float* v;   // [keys][hd]
  float* s;         // [rows][kBlock]
  float* o;         // [rows][hd]
  float* m;         // [rows]
  float* l;         // [rows]
  float* alpha;     // [rows]
};

void attend_tile(const AttentionArgs& a, size_t group, size_t kvh, size_t t0, size_t t1,
                 const TileState& st) {
  const size_t hd = a.head_dim, rows = (t1 - t0) * group;
  const float* v_base = st.v;
  const float* q_rows[kTileRows * 8];
  for (size_t r = 0; r < rows; ++r) {
    const size_t t = t0 + r / group, h = kvh * group + r % group;
    q_rows[r] = a.q + (t * a.n_heads + h) * hd;
  }
  // Keys any row of the tile sees (rows are ordered by position).
  const size_t lo = first_key(a, a.start + t0), hi = a.start + t1;
  for (size_t p0 = lo / kBlock * kBlock; p0 < hi; p0 += kBlock) {
    const size_t count = std::min(kBlock, hi - p0);
    const float* kt = st.kt + (p0 / kBlock) * hd * kBlock;
    for (size_t r = 0; r < rows; r += kScoreRows) {
      const size_t nr = std::min<size_t>(kScoreRows, rows - r);
      kScores[nr](q_rows + r, kt, hd, st.s + r * kBlock);
    }
    // Softmax update per row: scale, softcap, causal/window mask, online max.
    for (size_t r = 0; r < rows; ++r)
      st.alpha[r] =
          softmax_block_row(a, a.start + t0 + r / group, p0, st.s + r * kBlock, st.m[r], st.l[r]);
    // o = o * alpha + P V over the block's keys, 64 head dims at a time.
    const float* v = v_base + p0 * hd;
    for (size_t r = 0; r < rows; r += kPvRows) {
      const size_t nr = std::min<size_t>(kPvRows, rows - r);
      for (size_t d = 0; d < hd; d += 64) {
        const size_t nv = std::min<size_t>(4, (hd - d) / 16);
        kPv[nr][nv](st.o + r * hd + d, st.alpha + r, st.s + r * kBlock, v + d, count, hd);
      }
    }
  }
}

// Per-thread scratch, 64-byte aligned, grown to the largest request.
float* scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats + 16) buf.resize(floats + 16);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(float);
}

// A cache element as fp32 (bf16 widens exactly: a 16-bit shift).
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t x) {
  return bf16_to_float(x);
}

// One block's `count` keys (rows hd apart) as Kt[hd][kBlock], zero past count.
template <typename T>
void transpose_block(const T* k, size_t count, size_t hd, float* out) {
  for (size_t d = 0; d < hd; ++d)
    for (size_t j = 0; j < kBlock; ++j)
      out[d * kBlock + j] = j < count ? widen(k[j * hd + d]) : 0.0f;
}

// Kt blocks of keys [0, keys) for every kv head: [kv head][block][hd][kBlock],
// lanes past the last key zero (masked in the softmax). A q8_0 block is
// widened into this thread's rows first.
template <typename T>
void transpose_keys(const AttentionArgs& a, size_t keys, float* kt, ThreadPool& pool) {
  const size_t hd = a.head_dim, blocks = (keys + kBlock - 1) / kBlock;
  pool.parallel_for(a.n_kv_heads * blocks, [&](size_t item) {
    const size_t kvh = item / blocks, p0 = (item % blocks) * kBlock;
    const size_t count = std::min(kBlock, keys - p0);
    const size_t first = (kvh * a.cache_stride + p0) * hd;  // the block's first element
    float* out = kt + item * hd * kBlock;
    const T* k = static_cast<const T*>(a.k_cache) + first;
    if constexpr (std::is_same_v<T, int8_t>) {
      thread_local std::vector<float> rows;
      rows.resize(kBlock * hd);
      dequantize_q8_0(k, a.k_scale + first / kKvQ8Block, count, hd, rows.data(), hd);
      transpose_block(rows.data(), count, hd, out);
    } else {
      transpose_block(k, count, hd, out);
    }
  });
}

// A bf16 or q8_0 cache's values of keys [0, keys) as fp32: [kv head][keys][hd].
void widen_values(const AttentionArgs& a, size_t keys, float* out, ThreadPool& pool) {
  const size_t hd = a.head_dim, blocks = (keys + kBlock - 1) / kBlock;
  pool.parallel_for(a.n_kv_heads * blocks, [&](size_t item) {
    const size_t kvh = item / blocks, p0 = (item % blocks) * kBlock;
    const size_t rows = std::min(kBlock, keys - p0), n = rows * hd;  // hd % 16 == 0
    const size_t first = (kvh * a.cache_stride + p0) * hd;
    float* o = out + (kvh * keys + p0) * hd;
    if (a.kv_dtype == KvDtype::q8_0)
      return dequantize_q8_0(static_cast<const int8_t*>(a.v_cache) + first,
                             a.v_scale + first / kKvQ8Block, rows, hd, o, hd);
    const auto* v = static_cast<const uint16_t*>(a.v_cache) + first;
    for (size_t i = 0; i < n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
      _mm512_storeu_ps(o + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
  });
}

}  // namespace

void attention_prefill(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n == 0 || a.n_heads == 0) return;
  const size_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  // Keys any query sees are below start + n; the caller's buffer, read by all.
  const size_t keys = a.start + a.n, blocks = (keys + kBlock - 1) / kBlock;
  thread_local std::vector<float> kt_buf, v_buf;
  kt_buf.resize(a.n_kv_heads * blocks * hd * kBlock);
  const float* kt_all = kt_buf.data();
  const float* v_all = nullptr;
  size_t v_stride = a.cache_stride;  // keys between two kv heads' values
  if (a.kv_dtype != KvDtype::fp32) {
    if (a.kv_dtype == KvDtype::q8_0)
      transpose_keys<int8_t>(a, keys, kt_buf.data(), pool);
    else
      transpose_keys<uint16_t>(a, keys, kt_buf.data(), pool);
    v_buf.resize(a.n_kv_heads * keys * hd);
    widen_values(a, keys, v_buf.data(), pool);
    v_all = v_buf.data();
    v_stride = keys;
  } else {
    transpose_keys<float>(a, keys, kt_buf.data(), pool);
    v_all = static_cast<const float*>(a.v_cache);
  }
  const size_t tile_tokens = std::max<size_t>(1, kTileRows / group);
  const size_t q_tiles = (a.n + tile_tokens - 1) / tile_tokens;
  const size_t max_rows = tile_tokens * group;
  pool.parallel_for(a.n_kv_heads * q_tiles, [&](size_t item) {
    // Latest tiles (most keys) first, for load balance.
    const size_t kvh = item % a.n_kv_heads, qt = q_tiles - 1 - item / a.n_kv_heads;
    const size_t t0 = qt * tile_tokens, t1 = std::min(a.n, t0 + tile_tokens);
    const size_t rows = (t1 - t0) * group;
    float* base = scratch(max_rows * (kBlock + hd + 3));
    const TileState st{kt_all + kvh * blocks * hd * kBlock,
                       v_all + kvh * v_stride * hd,
                       base,
                       base + max_rows * kBlock,
                       base + max_rows * (kBlock + hd),
                       base + max_rows * (kBlock + hd + 1),
                       base + max_rows * (kBlock + hd + 2)};
    std::fill(st.o, st.o + rows * hd, 0.0f);
    std::fill(st.m, st.m + rows, -INFINITY);
    std::fill(st.l, st.l + rows, 0.0f);
    attend_tile(a, group, kvh, t0, t1, st);
    for (size_t r = 0; r < rows; ++r) {
      const size_t t = t0 + r / group, h = kvh * group + r % group;
      const __m512 inv = _mm512_set1_ps(1.0f / with_sink(a, h, st.m[r], st.l[r]));
      float* out = a.out + (t * a.n_heads + h) * hd;
      for (size_t d = 0; d < hd; d += 16)
        _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(st.o + r * hd + d), inv));
    }
  });
}

}  // namespace edgellm::kernels::avx512
