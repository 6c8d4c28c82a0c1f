// Causal GQA decode attention for AVX-512 (n < kMinPrefillTokens query
// tokens): a memory-bound stream over the K/V cache, so the design goal is to
// keep DRAM busy and touch each K/V byte once.
//
// Work item = (kv head, key split). Decode has one tile per kv head, too few
// for the pool, so keys are split and the partial (m, l, o) per row combined
// afterwards (flash-decoding, the scheme of attention_avx2.cpp). Within an
// item, keys go by blocks of ~16 KiB of K (L1-sized) with an online softmax.
// A token's query heads of one kv head (its group) see the same keys, so:
//   - scores: per row, 16 keys at a time into 16 accumulators, reduced to one
//     vector of 16 scores by a transpose-add tree (4 shuffle levels, no
//     per-key horizontal sum); the K block is read from DRAM by the first row
//     and from L1 by the others;
//   - P.V: up to 4 rows at once, so one V load feeds every row of the group.
// Software prefetch runs a fixed distance ahead on both streams; bf16 cache
// elements widen to fp32 in registers (a 16-bit shift, exact), so a bf16
// cache gives the bits of an fp32 cache holding the widened values.
//
// q8_0 (int8 + a half scale per 32 head dims) widens exactly too: each block
// of keys is dequantized once into an L1 buffer that every row of the group
// then reads as fp32 K (int8 -> fp32 costs two conversions and a multiply per
// vector, so done per row it would triple), and V is widened in registers
// inside P.V, where one load already serves all the group's rows. Folding the
// K scale into the scores instead saves the multiply but needs a 16-key
// transpose-sum per 32-dim block and row. Both give the very bits of the fp32
// cache holding the dequantized values.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/online_softmax_avx512.h"  // first_key
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

constexpr size_t kMaxBlockKeys = 128;
// A key split below this many keys costs more in combining than it saves.
constexpr size_t kMinSplitKeys = 128;
// Rows whose P.V shares one V load; 4 rows x 4 vectors of head_dim = 16
// accumulators, leaving registers for the V vectors.
constexpr size_t kPvRows = 4;
// Bytes ahead of the current key that each stream prefetches (16 to 32 keys
// at head_dim 64). Measured on the 4096-key smollm2 shape from DRAM: 4 KiB
// took 2 threads from 17 to 21 GB/s (fp32) and 13 to 16 GB/s (bf16) over no
// prefetch; 2 and 8 KiB were each worse for one dtype. Into L2 (T1) rather
// than L1: one core's L1 has few miss buffers, and on one thread T1 took
// bf16 from ~7 to ~8 GB/s, fp32 unchanged.
constexpr size_t kPrefetchAhead = 4096;

// Per-thread buffer with internal linkage: no inline function of this file
// may be merged by the linker with an AVX2 build of the same name.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }
  float* get(size_t floats) {
    if (floats > capacity_) {
      std::free(data_);
      const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data_) throw std::bad_alloc();
      capacity_ = bytes / sizeof(float);
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

// Sixteen cache elements as fp32.
inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sixteen int8 of a q8_0 cache as fp32 (the block scale applied by the caller).
inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Sums of 16 vectors, lane u = sum of acc[u]'s lanes. Each level adds pairs
// after interleaving, halving the vector count: 30 shuffles for 16 sums.
inline __m512 transpose_sum16(const __m512* acc) {
  __m512 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i) {  // lanes hold (a0, a1) pairs of 2-lane sums
    const __m512 a = acc[2 * i], b = acc[2 * i + 1];
    l1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i) {  // 4-lane sums of (a0, a1, a2, a3) per 128 bits
    const __m512d a = _mm512_castps_pd(l1[2 * i]), b = _mm512_castps_pd(l1[2 * i + 1]);
    l2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i) {  // 128-bit lanes (0, 2 | 1, 3) of two vectors
    const __m512 a = l2[2 * i], b = l2[2 * i + 1];
    l3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(l3[0], l3[1], 0x88),
                       _mm512_shuffle_f32x4(l3[0], l3[1], 0xdd));
}

// Prefetches the line at p + kPrefetchAhead into L2.
inline void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T1);
}

// scores[j] = q . k_j for j in [0, count), keys `hd` elements apart; with
// `prefetch`, the K bytes kPrefetchAhead past each 16 keys are requested.
// kHd > 0: head_dim known at compile time, so the 16 key rows are constant
// offsets from one pointer (a runtime stride needs 16 pointers, and spills).
template <typename T, size_t kHd>
void dot_keys_hd(const float* q, const T* k, size_t count, size_t hd_arg, bool prefetch,
                 float* scores) {
  const size_t hd = kHd > 0 ? kHd : hd_arg;
  size_t j = 0;
  for (; j + 16 <= count; j += 16) {
    // The unroll pragmas keep the accumulator array in registers.
    __m512 acc[16];
#pragma GCC unroll 16
    for (auto& v : acc) v = _mm512_setzero_ps();
    const T* kj = k + j * hd;
    for (size_t d = 0; d < hd; d += 16) {
      // 1/(hd/16) of the 16 keys' bytes per step: requests spread between the FMAs.
      if (prefetch)
#pragma GCC unroll 16
        for (size_t b = 0; b < 256 * sizeof(T); b += 64)
          prefetch_ahead(reinterpret_cast<const char*>(kj) + d * 16 * sizeof(T) + b);
      const __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
      for (size_t u = 0; u < 16; ++u) acc[u] = _mm512_fmadd_ps(qv, load16(kj + u * hd + d), acc[u]);
    }
    _mm512_storeu_ps(scores + j, transpose_sum16(acc));
  }
  for (; j < count; ++j) {  // the range's last < 16 keys
    __m512 acc = _mm512_setzero_ps();
    for (size_t d = 0; d < hd; d += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(k + j * hd + d), acc);
    scores[j] = _mm512_reduce_add_ps(acc);
  }
}

template <typename T>
void dot_keys(const float* q, const T* k, size_t count, size_t hd, bool prefetch, float* scores) {
  switch (hd) {
    case 64:
      return dot_keys_hd<T, 64>(q, k, count, hd, prefetch, scores);
    case 128:
      return dot_keys_hd<T, 128>(q, k, count, hd, prefetch, scores);
    case 256:
      return dot_keys_hd<T, 256>(q, k, count, hd, prefetch, scores);
    default:
      return dot_keys_hd<T, 0>(q, k, count, hd, prefetch, scores);
  }
}

// For each of R rows: o_r[0 .. 16*NV) = o_r * alpha_r + sum_j p_r[j] v_j,
// rows of o `hd` apart, rows of p `ps` apart, v rows `hd` apart; with
// `prefetch`, the V bytes kPrefetchAhead past each row's slice are requested.
// int8 (q8_0) v_j is scaled by vs[j * hd / 32 + i / 2] for its vector i (the
// slice starts a 32-dim block): exact, as the fp32 cache would hold it.
template <typename T, int R, int NV>
void accumulate_pv(float* o, const float* alpha, const float* p, size_t ps, const T* v,
                   const float* vs, size_t count, size_t hd, bool prefetch) {
  __m512 acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 va = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i)
      acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(o + r * hd + 16 * i), va);
  }
  for (size_t j = 0; j < count; ++j) {
    const T* vj = v + j * hd;
    if (prefetch)  // one request per 64-byte line of the slice
#pragma GCC unroll 4
      for (int i = 0; i < NV; i += static_cast<int>(64 / (16 * sizeof(T))))
        prefetch_ahead(vj + 16 * i);
    __m512 vv[NV];
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) {
      vv[i] = load16(vj + 16 * i);
      if constexpr (std::is_same_v<T, int8_t>)
        vv[i] = _mm512_mul_ps(vv[i], _mm512_set1_ps(vs[j * (hd / kKvQ8Block) + i / 2]));
      // Keep v in a register: folded into each row's FMA it is loaded R times,
      // and the load ports, not the FMAs, would set the pace.
      if constexpr (R > 1) asm("" : "+v"(vv[i]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r * ps + j]);
#pragma GCC unroll 4
      for (int i = 0; i < NV; ++i) acc[r][i] = _mm512_fmadd_ps(pj, vv[i], acc[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + r * hd + 16 * i, acc[r][i]);
}

template <typename T>
using PvFn = void (*)(float*, const float*, const float*, size_t, const T*, const float*, size_t,
                      size_t, bool);
template <typename T, int R>
constexpr PvFn<T> kPvRow[5] = {nullptr, accumulate_pv<T, R, 1>, accumulate_pv<T, R, 2>,
                               accumulate_pv<T, R, 3>, accumulate_pv<T, R, 4>};
template <typename T>
constexpr const PvFn<T>* kPv[kPvRows + 1] = {nullptr, kPvRow<T, 1>, kPvRow<T, 2>, kPvRow<T, 3>,
                                             kPvRow<T, 4>};

// Issues prefetches for the bytes [from, to) of a stream, one per line.
inline void prefetch_range(const char* base, size_t from, size_t to) {
  for (size_t b = from / 64 * 64; b < to; b += 64) _mm_prefetch(base + b, _MM_HINT_T0);
}

struct Plan {
  size_t group = 0;   // query heads per kv head
  size_t splits = 0;  // key splits per kv head
  size_t block = 0;   // keys per block
  // q8_0: the scales V is read with (v_scale; k_scale under Fault::v_through_k_scale)
  // and Fault::kv_scale_wrong_block.
  const uint16_t* v_scale = nullptr;
  bool neighbour_scale = false;
};

// Half scales [0, n) as fp32 into out (whole vectors: out holds n rounded up to 16).
inline void widen_scales(const uint16_t* s, size_t n, float* out) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    _mm512_store_ps(out + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
}

// One row's online-softmax step over `count` keys (fp32, rows hd apart):
// scores into s (exp(score - m), dead lanes of the last vector 0), m and l
// updated; returns alpha = exp(m_old - m_new). Not inlined: every cache dtype
// runs this one copy, so floating-point contraction cannot differ between them
// (a widened cache then gives the fp32 cache's very bits).
template <typename T>
__attribute__((noinline)) float score_row(const AttentionArgs& a, const float* q, const T* k,
                                          size_t count, bool prefetch, float* s, float& m,
                                          float& l) {
  dot_keys(q, k, count, a.head_dim, prefetch, s);
  const size_t full = count / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (count % 16)) - 1);
  // Scale, cap, and find the max; the tail vector's dead lanes read -inf.
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512 cap = _mm512_set1_ps(a.softcap);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (size_t c = 0; c <= full; ++c) {
    const __mmask16 mk = c < full ? __mmask16(0xffff) : tail;
    if (!mk) break;
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + 16 * c), scale);
    if (a.softcap > 0.0f) x = _mm512_mul_ps(cap, tanh_ps(_mm512_div_ps(x, cap)));
    x = _mm512_mask_blend_ps(mk, _mm512_set1_ps(-INFINITY), x);
    _mm512_store_ps(s + 16 * c, x);
    vmax = _mm512_max_ps(vmax, x);
  }
  const float m_old = m;
  const float m_new = std::max(m_old, _mm512_reduce_max_ps(vmax));
  // m_old = -inf on a row's first block: alpha = 0 scales the zero o.
  const float alpha = std::exp(m_old - m_new);
  const __m512 vm = _mm512_set1_ps(m_new);
  __m512 vsum = _mm512_setzero_ps();
  for (size_t c = 0; c * 16 < count; ++c) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * c), vm));  // -inf -> 0
    _mm512_store_ps(s + 16 * c, e);
    vsum = _mm512_add_ps(vsum, e);  // dead lanes: exp(-inf) = 0
  }
  l = l * alpha + _mm512_reduce_add_ps(vsum);
  m = m_new;
  return alpha;
}

// Runs the online softmax for every query token of kv head `kvh` over keys
// [kb, ke), updating per-row state m[rows], l[rows], o[rows][hd] (row =
// t * group + g). The caller initialises the state.
template <typename T>
void attend(const AttentionArgs& a, const Plan& plan, size_t kvh, size_t kb, size_t ke, float* m,
            float* l, float* o) {
  constexpr bool q8 = std::is_same_v<T, int8_t>;
  const size_t hd = a.head_dim, group = plan.group, nb = hd / kKvQ8Block;
  const T* k_base = static_cast<const T*>(a.k_cache) + kvh * a.cache_stride * hd;
  const T* v_base = static_cast<const T*>(a.v_cache) + kvh * a.cache_stride * hd;
  const char* k_bytes = reinterpret_cast<const char*>(k_base);
  const char* v_bytes = reinterpret_cast<const char*>(v_base);
  const size_t lo = std::max(kb, first_key(a, a.start));
  const size_t hi = std::min(ke, a.start + a.n);
  if (lo >= hi) return;
  const size_t row_bytes = hd * sizeof(T), end_bytes = hi * row_bytes;
  alignas(64) float s[kPvRows][kMaxBlockKeys];
  // q8_0: the block's K widened to fp32 and its V scales (this thread's buffers).
  thread_local Buffer k_buf, vs_buf;
  float* k_wide = q8 ? k_buf.get(plan.block * hd) : nullptr;
  float* v_scales = q8 ? vs_buf.get(plan.block * nb + 16) : nullptr;
  const uint16_t* k_scale = q8 ? a.k_scale + kvh * a.cache_stride * nb : nullptr;
  const uint16_t* v_scale = q8 ? plan.v_scale + kvh * a.cache_stride * nb : nullptr;
  // The first lines of both streams, before the loop's prefetches reach them.
  prefetch_range(k_bytes, lo * row_bytes, std::min(end_bytes, lo * row_bytes + kPrefetchAhead));
  prefetch_range(v_bytes, lo * row_bytes, std::min(end_bytes, lo * row_bytes + kPrefetchAhead));
  for (size_t p0 = lo; p0 < hi; p0 += plan.block) {
    const size_t p1 = std::min(hi, p0 + plan.block);
    if constexpr (q8) {
      dequantize_q8_0(k_base + p0 * hd, k_scale + p0 * nb, p1 - p0, hd, k_wide, hd,
                      {kPrefetchAhead, plan.neighbour_scale});
      // V's scales as many keys ahead as its int8 prefetch (1/16 of the bytes).
      const char* vs_bytes = reinterpret_cast<const char*>(v_scale);
      for (size_t b = p0 * nb * 2; b < p1 * nb * 2; b += 64)
        _mm_prefetch(vs_bytes + b + kPrefetchAhead / 16, _MM_HINT_T1);
      widen_scales(v_scale + p0 * nb, (p1 - p0) * nb, v_scales);
    }
    for (size_t t = 0; t < a.n; ++t) {
      const size_t pos = a.start + t;
      // This token's keys within the block (the same for all its group rows).
      const size_t r_lo = std::max(p0, first_key(a, pos)), r_hi = std::min(p1, pos + 1);
      if (r_lo >= r_hi) continue;
      const size_t count = r_hi - r_lo;
      const T* v = v_base + r_lo * hd;
      const float* vs = q8 ? v_scales + (r_lo - p0) * nb : nullptr;
      for (size_t g0 = 0; g0 < group; g0 += kPvRows) {
        const size_t rows = std::min(kPvRows, group - g0);
        alignas(16) float alpha[kPvRows];
        for (size_t r = 0; r < rows; ++r) {
          const size_t h = kvh * group + g0 + r, row = t * group + g0 + r;
          const float* q = a.q + (t * a.n_heads + h) * hd;
          // The first row streams K from DRAM; the others find it in L1.
          if constexpr (q8)
            alpha[r] =
                score_row(a, q, k_wide + (r_lo - p0) * hd, count, false, s[r], m[row], l[row]);
          else
            alpha[r] = score_row(a, q, k_base + r_lo * hd, count, row == 0, s[r], m[row], l[row]);
        }
        float* o_rows = o + (t * group + g0) * hd;
        for (size_t d = 0; d < hd; d += 64) {
          const size_t nv = std::min<size_t>(4, (hd - d) / 16);
          kPv<T>[rows][nv](o_rows + d, alpha, &s[0][0], kMaxBlockKeys, v + d,
                           q8 ? vs + d / kKvQ8Block : nullptr, count, hd, t == 0 && g0 == 0);
        }
      }
    }
  }
}

Plan make_plan(const AttentionArgs& a, size_t threads) {
  Plan p;
  p.group = a.n_heads / a.n_kv_heads;
  // The longest row sees min(window, start + n) keys.
  const size_t keys = a.window > 0 ? std::min(a.window, a.start + a.n) : a.start + a.n;
  const size_t want = (2 * threads + a.n_kv_heads - 1) / a.n_kv_heads;  // ~2 items per thread
  p.splits = std::max<size_t>(1, std::min(want, keys / kMinSplitKeys));
  // ~16 KiB of fp32 K per block (L1 holds it for the group's other rows).
  p.block = std::clamp<size_t>(4096 / a.head_dim / 16 * 16, 16, kMaxBlockKeys);
  return p;
}

}  // namespace

void attention_decode(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n == 0 || a.n_heads == 0) return;
  const size_t hd = a.head_dim;
  Plan plan = make_plan(a, static_cast<size_t>(pool.size()));
  const fault::Fault f = fault::active();
  plan.v_scale = f == fault::Fault::v_through_k_scale ? a.k_scale : a.v_scale;
  plan.neighbour_scale = f == fault::Fault::kv_scale_wrong_block;
  const size_t rows = a.n * plan.group;
  const size_t state = rows * (hd + 2);  // o, then m, then l
  const size_t items = a.n_kv_heads * plan.splits;

  // Split partials live in the caller's buffer, one state block per item.
  thread_local Buffer partial_buf;
  float* partials = plan.splits > 1 ? partial_buf.get(items * state) : nullptr;

  pool.parallel_for(items, [&](size_t item) {
    const size_t kvh = item % a.n_kv_heads, split = item / a.n_kv_heads;
    // Key range of this split: equal shares of the keys any row sees.
    const size_t k_lo = first_key(a, a.start), k_hi = a.start + a.n;
    const size_t kb = k_lo + (k_hi - k_lo) * split / plan.splits;
    const size_t ke = k_lo + (k_hi - k_lo) * (split + 1) / plan.splits;

    thread_local Buffer tile_buf;
    float* o = plan.splits > 1 ? partials + item * state : tile_buf.get(state);
    float* m = o + rows * hd;
    float* l = m + rows;
    std::fill(o, o + rows * hd, 0.0f);
    std::fill(m, m + rows, -INFINITY);
    std::fill(l, l + rows, 0.0f);
    if (a.kv_dtype == KvDtype::q8_0)
      attend<int8_t>(a, plan, kvh, kb, ke, m, l, o);
    else if (a.kv_dtype == KvDtype::bf16)
      attend<uint16_t>(a, plan, kvh, kb, ke, m, l, o);
    else
      attend<float>(a, plan, kvh, kb, ke, m, l, o);
    if (plan.splits > 1) return;
    for (size_t row = 0; row < rows; ++row) {
      const size_t t = row / plan.group, g = row % plan.group;
      const size_t h = kvh * plan.group + g;
      const __m512 inv = _mm512_set1_ps(1.0f / with_sink(a, h, m[row], l[row]));
      float* out = a.out + (t * a.n_heads + h) * hd;
      for (size_t d = 0; d < hd; d += 16)
        _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(o + row * hd + d), inv));
    }
  });
  if (plan.splits == 1) return;

  // Combine the splits: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
  for (size_t kvh = 0; kvh < a.n_kv_heads; ++kvh) {
    for (size_t row = 0; row < rows; ++row) {
      const size_t t = row / plan.group, g = row % plan.group;
      float m_max = -INFINITY;
      for (size_t s = 0; s < plan.splits; ++s)
        m_max = std::max(m_max, partials[(kvh + s * a.n_kv_heads) * state + rows * hd + row]);
      float* out = a.out + (t * a.n_heads + kvh * plan.group + g) * hd;
      float total = 0.0f;
      for (size_t d = 0; d < hd; d += 16) _mm512_storeu_ps(out + d, _mm512_setzero_ps());
      for (size_t s = 0; s < plan.splits; ++s) {
        const float* st = partials + (kvh + s * a.n_kv_heads) * state;
        const float ms = st[rows * hd + row];
        if (ms == -INFINITY) continue;  // this split held none of the row's keys
        const float w = std::exp(ms - m_max);
        total += st[rows * (hd + 1) + row] * w;
        const __m512 vw = _mm512_set1_ps(w);
        for (size_t d = 0; d < hd; d += 16)
          _mm512_storeu_ps(out + d, _mm512_fmadd_ps(_mm512_loadu_ps(st + row * hd + d), vw,
                                                    _mm512_loadu_ps(out + d)));
      }
      const __m512 inv = _mm512_set1_ps(1.0f / with_sink(a, kvh * plan.group + g, m_max, total));
      for (size_t d = 0; d < hd; d += 16)
        _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(out + d), inv));
    }
  }
}

}  // namespace edgellm::kernels::avx512
