// top_k in one pass without sorting the vocabulary: a sorted buffer of the k
// best so far, and an AVX2 scan that compares 8 logits at a time against the
// buffer's worst value, so only the rare candidates reach scalar code.
//
// Order: value descending, ties toward the smaller index, exactly as
// ref::top_k. Indices are scanned in increasing order, so a later element
// enters the full buffer only if strictly greater than its worst value.
// NaN ranks below every number: NaNs never enter the buffer, and fill what it
// lacks at the end (fewer than k numbers), in index order.
#include <algorithm>
#include <cmath>

#include "kernels/avx2.h"
#include "kernels/vec_avx2.h"

namespace edgellm::kernels::avx2 {

namespace {

// Above this k the insertion buffer's O(k) shifts lose to a partial sort.
constexpr size_t kMaxBufferedK = 256;

// Inserts (v, i) into the sorted buffer of `count` entries (capacity k),
// dropping the last one when full. Entries before it are all better.
inline void insert(float* vals, int32_t* idx, size_t& count, size_t k, float v, int32_t i) {
  size_t pos = count;
  // Earlier indices win ties, so (v, i) goes after every entry >= v.
  while (pos > 0 && vals[pos - 1] < v) --pos;
  const size_t last = std::min(count, k - 1);
  for (size_t j = last; j > pos; --j) {
    vals[j] = vals[j - 1];
    idx[j] = idx[j - 1];
  }
  vals[pos] = v;
  idx[pos] = i;
  if (count < k) ++count;
}

}  // namespace

void top_k(const float* x, size_t n, size_t k, int32_t* out_indices) {
  k = std::min(k, n);
  if (k == 0) return;
  if (k > kMaxBufferedK) {
    ref::top_k(x, n, k, out_indices);
    return;
  }
  float vals[kMaxBufferedK];
  int32_t idx[kMaxBufferedK];
  size_t count = 0;
  // Until the buffer is full every number enters (the compare is "ordered",
  // i.e. not NaN); then only what beats its worst value.
  auto wanted = [&](float v) { return count < k ? !std::isnan(v) : v > vals[k - 1]; };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 hit = count < k ? _mm256_cmp_ps(v, v, _CMP_ORD_Q)
                                 : _mm256_cmp_ps(v, _mm256_set1_ps(vals[k - 1]), _CMP_GT_OQ);
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(hit));
    while (mask) {
      const unsigned lane = static_cast<unsigned>(__builtin_ctz(mask));
      mask &= mask - 1;
      const float xv = x[i + lane];
      // The buffer may have filled or its worst risen since the compare.
      if (wanted(xv)) insert(vals, idx, count, k, xv, static_cast<int32_t>(i + lane));
    }
  }
  for (; i < n; ++i)
    if (wanted(x[i])) insert(vals, idx, count, k, x[i], static_cast<int32_t>(i));
  for (size_t j = 0; j < n && count < k; ++j)
    if (std::isnan(x[j])) idx[count++] = static_cast<int32_t>(j);
  std::copy_n(idx, k, out_indices);
}

}  // namespace edgellm::kernels::avx2
