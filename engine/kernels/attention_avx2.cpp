// Causal GQA attention for AVX2+FMA, flash style: keys are visited in blocks
// with an online softmax (running max m, running sum l, unnormalised output
// o), so no score matrix is materialised and K/V blocks are reused from L1 by
// every query row that shares them.
//
// Work item = (kv head, tile of query tokens, key split). A tile's rows are
// its tokens x the query heads of the kv head's group, so one K/V block read
// serves group x tokens rows. Prefill has many tiles; decode (n == 1) has one
// tile per kv head, too few for the pool, so its keys are split and the
// partial (m, l, o) combined afterwards (flash-decoding).
//
// The cache is fp32, bf16 or q8_0 (KvDtype): bf16 elements widen to fp32 in
// registers as they are loaded (a 16-bit shift, exact), so the arithmetic is
// the same and decode streams half the bytes; a q8_0 block of keys is widened
// (int8 times its half scale, exact) into this thread's fp32 rows before its
// rows attend, and the same fp32 code runs on them.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/avx2.h"
#include "kernels/fault_injection.h"
#include "kernels/vec_avx2.h"

namespace edgellm::kernels::avx2 {

namespace {

constexpr size_t kMaxBlockKeys = 128;
// A key split below this many keys costs more in combining than it saves.
constexpr size_t kMinSplitKeys = 128;
// Query rows per tile (tokens x group heads), about; bounds the o scratch.
constexpr size_t kTileRows = 32;

struct Plan {
  size_t group = 0;        // query heads per kv head
  size_t tile_tokens = 0;  // query tokens per tile
  size_t q_tiles = 0;
  size_t splits = 0;  // key splits per tile
  size_t block = 0;   // keys per block: K and V blocks together ~32 KiB
  // q8_0: the scales V is read with (v_scale; k_scale under Fault::v_through_k_scale)
  // and Fault::kv_scale_wrong_block.
  const uint16_t* v_scale = nullptr;
  bool neighbour_scale = false;
};

inline size_t first_key(const AttentionArgs& a, size_t pos) {
  return (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
}

// Eight cache elements as fp32.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Rows [0, rows) of a q8_0 cache (int8 rows hd apart, hd / 32 half scales
// each) as fp32 rows hd apart: exact. `neighbour`: Fault::kv_scale_wrong_block.
void dequantize_q8_0(const int8_t* q, const uint16_t* scales, size_t rows, size_t hd, float* out,
                     bool neighbour) {
  const size_t nb = hd / kKvQ8Block;
  for (size_t f = 0; f < rows * nb; ++f) {  // a row's blocks, then the next row's
    const size_t b = f % nb, sb = !neighbour || nb < 2 ? b : (b ^ 1) < nb ? b ^ 1 : b - 1;
    const __m256 sv = _mm256_set1_ps(_cvtsh_ss(scales[f - b + sb]));
    const int8_t* qb = q + f * kKvQ8Block;
    float* o = out + f * kKvQ8Block;  // rows of hd floats are contiguous too
    for (int i = 0; i < 4; ++i) {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * i));
      _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), sv));
    }
  }
}

// scores[j] = q . k_j for j in [0, count), keys `hd` elements apart.
template <typename T>
void dot_keys(const float* q, const T* k, size_t count, size_t hd, float* scores) {
  size_t j = 0;
  for (; j + 8 <= count; j += 8) {
    // The unroll pragmas keep the accumulator arrays in registers.
    __m256 acc[8];
#pragma GCC unroll 8
    for (auto& v : acc) v = _mm256_setzero_ps();
    const T* kj = k + j * hd;
    for (size_t d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
      for (size_t u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qv, load8(kj + u * hd + d), acc[u]);
    }
    _mm256_storeu_ps(scores + j, hsum8(acc));
  }
  for (; j < count; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t d = 0; d < hd; d += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + j * hd + d), acc);
    scores[j] = hsum(acc);
  }
}

// o[0 .. 8*NV) = o * alpha + sum_j p[j] * v_j[0 .. 8*NV), v rows `hd` apart.
template <typename T, int NV>
void accumulate_pv(float* o, float alpha, const float* p, const T* v, size_t count, size_t hd) {
  __m256 acc[NV];
  const __m256 va = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_mul_ps(_mm256_loadu_ps(o + 8 * i), va);
  for (size_t j = 0; j < count; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    const T* vj = v + j * hd;
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(pj, load8(vj + 8 * i), acc[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(o + 8 * i, acc[i]);
}

template <typename T>
using PvFn = void (*)(float*, float, const float*, const T*, size_t, size_t);
template <typename T>
constexpr PvFn<T> kPv[9] = {nullptr,
                            accumulate_pv<T, 1>,
                            accumulate_pv<T, 2>,
                            accumulate_pv<T, 3>,
                            accumulate_pv<T, 4>,
                            accumulate_pv<T, 5>,
                            accumulate_pv<T, 6>,
                            accumulate_pv<T, 7>,
                            accumulate_pv<T, 8>};

// The rows of query tokens [t0, t1) of kv head `kvh` over keys [p0, p1) of
// one block, whose K and V rows (hd apart) start at k and v: one online-softmax
// step of the per-row state m[rows], l[rows], o[rows][hd] (row = (t - t0) *
// group + g).
template <typename T>
void attend_block(const AttentionArgs& a, const Plan& plan, size_t kvh, size_t t0, size_t t1,
                  size_t p0, size_t p1, const T* k, const T* v, float* m, float* l, float* o) {
  const size_t hd = a.head_dim, group = plan.group;
  alignas(32) float s[kMaxBlockKeys];
  for (size_t t = t0; t < t1; ++t) {
    const size_t pos = a.start + t;
    // This row's keys within the block: [j0, j1) relative to p0.
    const size_t r_lo = std::max(p0, first_key(a, pos)), r_hi = std::min(p1, pos + 1);
    if (r_lo >= r_hi) continue;
    const size_t j0 = r_lo - p0, j1 = r_hi - p0;
    // Vector range over s, widened to whole vectors; lanes outside [j0, j1) are -inf.
    const size_t v0 = j0 / 8 * 8, v1 = std::min((j1 + 7) / 8 * 8, kMaxBlockKeys);
    for (size_t g = 0; g < group; ++g) {
      const size_t h = kvh * group + g, row = (t - t0) * group + g;
      const float* q = a.q + (t * a.n_heads + h) * hd;
      dot_keys(q, k + j0 * hd, j1 - j0, hd, s + j0);
      const __m256 scale = _mm256_set1_ps(a.scale);
      for (size_t j = v0; j < v1; j += 8) {  // lanes outside [j0, j1) are masked below
        __m256 x = _mm256_mul_ps(_mm256_load_ps(s + j), scale);
        if (a.softcap > 0.0f) {
          const __m256 cap = _mm256_set1_ps(a.softcap);
          x = _mm256_mul_ps(cap, tanh_ps(_mm256_div_ps(x, cap)));
        }
        _mm256_store_ps(s + j, x);
      }
      for (size_t j = v0; j < j0; ++j) s[j] = -INFINITY;
      for (size_t j = j1; j < v1; ++j) s[j] = -INFINITY;
      __m256 vmax = _mm256_set1_ps(-INFINITY);
      for (size_t j = v0; j < v1; j += 8) vmax = _mm256_max_ps(vmax, _mm256_load_ps(s + j));
      const float m_old = m[row];
      const float m_new = std::max(m_old, hmax(vmax));
      // m_old = -inf on a row's first block: alpha = 0 scales the zero o.
      const float alpha = std::exp(m_old - m_new);
      const __m256 vm = _mm256_set1_ps(m_new);
      __m256 vsum = _mm256_setzero_ps();
      for (size_t j = v0; j < v1; j += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_load_ps(s + j), vm));  // -inf -> 0
        _mm256_store_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
      }
      l[row] = l[row] * alpha + hsum(vsum);
      m[row] = m_new;
      float* o_row = o + row * hd;
      for (size_t d = 0; d < hd; d += 64) {
        const size_t nv = std::min<size_t>(8, (hd - d) / 8);
        kPv<T>[nv](o_row + d, alpha, s + j0, v + j0 * hd + d, j1 - j0, hd);
      }
    }
  }
}

// Runs the online softmax for query tokens [t0, t1) of kv head `kvh` over keys
// [kb, ke), updating per-row state m[rows], l[rows], o[rows][hd] (row =
// (t - t0) * group + g). The caller initialises the state.
template <typename T>
void attend_tile(const AttentionArgs& a, const Plan& plan, size_t kvh, size_t t0, size_t t1,
                 size_t kb, size_t ke, float* m, float* l, float* o) {
  const size_t hd = a.head_dim;
  const T* k_base = static_cast<const T*>(a.k_cache) + kvh * a.cache_stride * hd;
  const T* v_base = static_cast<const T*>(a.v_cache) + kvh * a.cache_stride * hd;
  // Keys any row of the tile sees: rows are ordered by position.
  const size_t lo = std::max(kb, first_key(a, a.start + t0));
  const size_t hi = std::min(ke, a.start + t1);
  for (size_t p0 = lo; p0 < hi; p0 += plan.block) {
    const size_t p1 = std::min(hi, p0 + plan.block);
    // Prefetch the next block's K and V while this one computes: the hardware
    // prefetcher alone leaves DRAM idle during a block's arithmetic.
    if (p1 < hi) {
      const char* next_k = reinterpret_cast<const char*>(k_base + p1 * hd);
      const char* next_v = reinterpret_cast<const char*>(v_base + p1 * hd);
      const size_t bytes = (std::min(hi, p1 + plan.block) - p1) * hd * sizeof(T);
      for (size_t b = 0; b < bytes; b += 64) {
        _mm_prefetch(next_k + b, _MM_HINT_T0);
        _mm_prefetch(next_v + b, _MM_HINT_T0);
      }
    }
    if constexpr (std::is_same_v<T, int8_t>) {
      thread_local Scratch k_scratch, v_scratch;
      float* kw = k_scratch.get(plan.block * hd);
      float* vw = v_scratch.get(plan.block * hd);
      const size_t s0 = (kvh * a.cache_stride + p0) * (hd / kKvQ8Block);  // the block's first scale
      dequantize_q8_0(k_base + p0 * hd, a.k_scale + s0, p1 - p0, hd, kw, plan.neighbour_scale);
      dequantize_q8_0(v_base + p0 * hd, plan.v_scale + s0, p1 - p0, hd, vw, plan.neighbour_scale);
      attend_block<float>(a, plan, kvh, t0, t1, p0, p1, kw, vw, m, l, o);
    } else {
      attend_block<T>(a, plan, kvh, t0, t1, p0, p1, k_base + p0 * hd, v_base + p0 * hd, m, l, o);
    }
  }
}

Plan make_plan(const AttentionArgs& a, size_t threads) {
  Plan p;
  p.group = a.n_heads / a.n_kv_heads;
  p.tile_tokens = std::max<size_t>(1, kTileRows / p.group);
  p.q_tiles = (a.n + p.tile_tokens - 1) / p.tile_tokens;
  const size_t tiles = a.n_kv_heads * p.q_tiles;
  // The longest row sees min(window, start + n) keys.
  const size_t keys = a.window > 0 ? std::min(a.window, a.start + a.n) : a.start + a.n;
  const size_t want = (2 * threads + tiles - 1) / tiles;  // ~2 items per thread
  p.splits = std::max<size_t>(1, std::min(want, keys / kMinSplitKeys));
  const size_t block = 4096 / a.head_dim / 8 * 8;
  p.block = std::clamp<size_t>(block, 8, kMaxBlockKeys);
  return p;
}

}  // namespace

void attention(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n == 0 || a.n_heads == 0) return;
  const size_t hd = a.head_dim;
  Plan plan = make_plan(a, static_cast<size_t>(pool.size()));
  const fault::Fault f = fault::active();
  plan.v_scale = f == fault::Fault::v_through_k_scale ? a.k_scale : a.v_scale;
  plan.neighbour_scale = f == fault::Fault::kv_scale_wrong_block;
  const size_t rows_per_tile = plan.tile_tokens * plan.group;
  const size_t state = rows_per_tile * (hd + 2);  // o, then m, then l
  const size_t items = a.n_kv_heads * plan.q_tiles * plan.splits;

  // Split partials live in the caller's scratch, one state block per item.
  thread_local Scratch partial_scratch;
  float* partials = plan.splits > 1 ? partial_scratch.get(items * state) : nullptr;

  pool.parallel_for(items, [&](size_t item) {
    // Largest tiles (latest tokens, most keys) first for load balance.
    const size_t kvh = item % a.n_kv_heads;
    const size_t rest = item / a.n_kv_heads;
    const size_t split = rest % plan.splits;
    const size_t qt = plan.q_tiles - 1 - rest / plan.splits;
    const size_t t0 = qt * plan.tile_tokens, t1 = std::min(a.n, t0 + plan.tile_tokens);
    const size_t rows = (t1 - t0) * plan.group;
    // Key range of this split: equal shares of the tile's keys.
    const size_t k_lo = first_key(a, a.start + t0), k_hi = a.start + t1;
    const size_t kb = k_lo + (k_hi - k_lo) * split / plan.splits;
    const size_t ke = k_lo + (k_hi - k_lo) * (split + 1) / plan.splits;

    thread_local Scratch tile_scratch;
    float* o = plan.splits > 1 ? partials + item * state : tile_scratch.get(state);
    float* m = o + rows_per_tile * hd;
    float* l = m + rows_per_tile;
    std::fill(o, o + rows * hd, 0.0f);
    std::fill(m, m + rows, -INFINITY);
    std::fill(l, l + rows, 0.0f);
    if (a.kv_dtype == KvDtype::q8_0)
      attend_tile<int8_t>(a, plan, kvh, t0, t1, kb, ke, m, l, o);
    else if (a.kv_dtype == KvDtype::bf16)
      attend_tile<uint16_t>(a, plan, kvh, t0, t1, kb, ke, m, l, o);
    else
      attend_tile<float>(a, plan, kvh, t0, t1, kb, ke, m, l, o);
    if (plan.splits > 1) return;
    for (size_t t = t0; t < t1; ++t) {
      for (size_t g = 0; g < plan.group; ++g) {
        const size_t row = (t - t0) * plan.group + g;
        const size_t h = kvh * plan.group + g;
        const __m256 inv = _mm256_set1_ps(1.0f / with_sink(a, h, m[row], l[row]));
        float* out = a.out + (t * a.n_heads + h) * hd;
        for (size_t d = 0; d < hd; d += 8)
          _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(o + row * hd + d), inv));
      }
    }
  });
  if (plan.splits == 1) return;

  // Combine the splits: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
  for (size_t kvh = 0; kvh < a.n_kv_heads; ++kvh) {
    for (size_t qt = 0; qt < plan.q_tiles; ++qt) {
      const size_t t0 = qt * plan.tile_tokens, t1 = std::min(a.n, t0 + plan.tile_tokens);
      const size_t item0 = kvh + a.n_kv_heads * (plan.splits * (plan.q_tiles - 1 - qt));
      for (size_t t = t0; t < t1; ++t) {
        for (size_t g = 0; g < plan.group; ++g) {
          const size_t row = (t - t0) * plan.group + g;
          float m_max = -INFINITY;
          for (size_t s = 0; s < plan.splits; ++s) {
            const float* st = partials + (item0 + s * a.n_kv_heads) * state;
            m_max = std::max(m_max, st[rows_per_tile * hd + row]);
          }
          float* out = a.out + (t * a.n_heads + kvh * plan.group + g) * hd;
          float total = 0.0f;
          for (size_t d = 0; d < hd; ++d) out[d] = 0.0f;
          for (size_t s = 0; s < plan.splits; ++s) {
            const float* st = partials + (item0 + s * a.n_kv_heads) * state;
            const float ms = st[rows_per_tile * hd + row];
            if (ms == -INFINITY) continue;  // this split held none of the row's keys
            const float w = std::exp(ms - m_max);
            total += st[rows_per_tile * (hd + 1) + row] * w;
            const __m256 vw = _mm256_set1_ps(w);
            for (size_t d = 0; d < hd; d += 8) {
              const __m256 acc = _mm256_loadu_ps(out + d);
              _mm256_storeu_ps(out + d,
                               _mm256_fmadd_ps(_mm256_loadu_ps(st + row * hd + d), vw, acc));
            }
          }
          const __m256 inv =
              _mm256_set1_ps(1.0f / with_sink(a, kvh * plan.group + g, m_max, total));
          for (size_t d = 0; d < hd; d += 8)
            _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inv));
        }
      }
    }
  }
}

}  // namespace edgellm::kernels::avx2
