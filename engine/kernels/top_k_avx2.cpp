// top_k in one pass without sorting the vocabulary: a sorted buffer of the k
// best so far, and an AVX2 scan that compares 8 logits at a time against the
// buffer's worst value, so only the rare candidates reach scalar code.
//
// Order: value descending, ties toward the smaller index, exactly as
// ref::top_k. Indices are scanned in increasing order, so a later element
// enters the full buffer only if strictly greater than its worst value.
// NaN never compares greater, so NaNs are skipped once the buffer is full.
#include <algorithm>

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
  // Fill: the first k elements always enter.
  for (size_t i = 0; i < k; ++i) insert(vals, idx, count, k, x[i], static_cast<int32_t>(i));
  float worst = vals[k - 1];
  size_t i = k;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unsigned mask = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(worst), _CMP_GT_OQ)));
    while (mask) {
      const unsigned lane = static_cast<unsigned>(__builtin_ctz(mask));
      mask &= mask - 1;
      const float xv = x[i + lane];
      if (xv > worst) {  // `worst` may have risen since the compare
        insert(vals, idx, count, k, xv, static_cast<int32_t>(i + lane));
        worst = vals[k - 1];
      }
    }
  }
  for (; i < n; ++i) {
    if (x[i] > worst) {
      insert(vals, idx, count, k, x[i], static_cast<int32_t>(i));
      worst = vals[k - 1];
    }
  }
  std::copy_n(idx, k, out_indices);
}

}  // namespace edgellm::kernels::avx2
