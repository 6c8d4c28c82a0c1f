// Whether this test binary runs under AddressSanitizer (make test-sanitize), and the
// sampling the largest kernel sweeps use there.
#pragma once

#include <cstddef>

namespace edgellm::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Under ASan + UBSan at -O1 the kernel sweeps run 10-30x slower (the amx attention sweep on
// the tile model alone took 306 s), so there a sweep checks every 5th case: 5 is coprime to
// each loop's length in those sweeps, so every value of every parameter is still met, and
// ASan still sees every code path. `make test` runs every case. Call once per case, in order.
inline bool sampled_case(std::size_t& counter) {
  constexpr std::size_t kStride = kSanitized ? 5 : 1;
  return counter++ % kStride == 0;
}

}  // namespace edgellm::testing
