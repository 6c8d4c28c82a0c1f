// matmul_rows (batched decode) against matmul with n == 1, row by row: the
// results must be bit-identical, or a sequence would decode differently when
// batched. Odd shapes (not multiples of the vector width or the panel), for
// every packed layout this CPU can run; the reference bounds the error too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "edgellm/bf16.h"
#include "edgellm/thread_pool.h"
#include "kernels/avx2.h"
#include "kernels/kernels.h"
#include "kernels/matmul_rows_avx512.h"

namespace edgellm::kernels {
namespace {

// Every layout this CPU can run: scalar, avx2 panels, the VNNI pairs packed
// for avx512 and for amx.
std::vector<Isa> layouts() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx})
    if (isa <= runnable_isa()) isas.push_back(isa);
  return isas;
}

TEST(MatmulRows, EachRowBitIdenticalToGemv) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  ThreadPool pool(2);
  struct Shape {
    size_t rows, cols, n;
  };
  // cols: odd, pairs not a multiple of 4, one column, the models' widths;
  // n: below, at and above the 8 tokens a VNNI sweep holds.
  for (const Shape& sh :
       {Shape{37, 61, 5}, Shape{16, 1, 3}, Shape{129, 576, 8}, Shape{3, 7, 1}, Shape{50, 1536, 9},
        Shape{33, 14, 2}, Shape{17, 9, 8}, Shape{70, 640, 17}, Shape{5, 3, 7}}) {
    std::vector<uint16_t> w(sh.rows * sh.cols);
    for (uint16_t& v : w) v = float_to_bf16(dist(rng));
    std::vector<float> bias(sh.rows), x(sh.n * sh.cols);
    for (float& v : bias) v = dist(rng);
    for (float& v : x) v = dist(rng);
    for (Isa isa : layouts()) {
      PackedMatrix m = pack_matrix(w.data(), sh.rows, sh.cols, isa);
      m.bias = bias.data();
      std::vector<float> batched(sh.n * sh.rows + 1, -7.0f), alone(sh.rows), ref(sh.n * sh.rows);
      matmul_rows(m, x.data(), sh.n, batched.data(), pool);
      EXPECT_EQ(batched.back(), -7.0f) << "wrote past the output";
      PackedMatrix plain = pack_matrix(w.data(), sh.rows, sh.cols, Isa::scalar);
      plain.bias = bias.data();
      ref::matmul(plain, x.data(), sh.n, ref.data());
      // Each implementation of the AVX2 layout's batch, not only the one dispatch picks.
      std::vector<std::vector<float>> variants;
      if (m.isa == Isa::avx2) {
        variants.emplace_back(sh.n * sh.rows);
        avx2::matmul_rows(m, x.data(), sh.n, variants.back().data(), pool);
        if (detect_isa() >= Isa::avx512) {
          variants.emplace_back(sh.n * sh.rows);
          avx512::matmul_rows(m, x.data(), sh.n, variants.back().data(), pool);
        } else {
          std::printf("[ SKIPPED  ] avx512 matmul_rows: the CPU lacks AVX-512F\n");
        }
      }
      for (size_t t = 0; t < sh.n; ++t) {
        matmul(m, &x[t * sh.cols], 1, alone.data(), pool);
        for (size_t v = 0; v < variants.size(); ++v)
          EXPECT_EQ(0,
                    std::memcmp(alone.data(), &variants[v][t * sh.rows], sh.rows * sizeof(float)))
              << "variant " << v << " " << sh.rows << "x" << sh.cols << " row " << t;
        EXPECT_EQ(0, std::memcmp(alone.data(), &batched[t * sh.rows], sh.rows * sizeof(float)))
            << isa_name(isa) << " " << sh.rows << "x" << sh.cols << " row " << t;
        for (size_t r = 0; r < sh.rows; ++r) {
          const float tol = 1e-5f * static_cast<float>(sh.cols + 1);
          EXPECT_NEAR(batched[t * sh.rows + r], ref[t * sh.rows + r],
                      tol * (1.0f + std::fabs(ref[t * sh.rows + r])))
              << isa_name(isa) << " row " << t << " out " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace edgellm::kernels
