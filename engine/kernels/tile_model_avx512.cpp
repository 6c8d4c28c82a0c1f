// The exact software model of the AMX tiles (amx_tiles.h): eight registers of
// 16 rows x 64 bytes per thread, the palette-1 configuration, and the
// instructions the kernels use, with the silicon's arithmetic. Plain C++; the
// avx512 flags only let the compiler vectorise it (the amx tier it stands in
// for needs AVX-512 anyway).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/amx_tiles.h"

namespace edgellm::kernels::amx::model {

namespace {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct State {
  bool configured = false;
  TileConfig cfg;
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb] = {};
};
thread_local State state;

[[noreturn]] void fault(const char* what, int t) {
  std::fprintf(stderr, "amx tile model: #UD: %s (tmm%d)\n", what, t);
  std::abort();
}

// A tile an instruction may use: configured, with rows and bytes per row.
void check_tile(int t) {
  if (!state.configured) fault("tile instruction with no tile configuration loaded", t);
  if (t < 0 || t >= kTiles) fault("no such tile register", t);
  if (state.cfg.rows[t] == 0 || state.cfg.colsb[t] == 0) fault("tile not configured", t);
}

int rows(int t) {
  return state.cfg.rows[t];
}
int colsb(int t) {
  return state.cfg.colsb[t];
}

// Shapes of C[m][n] += A[m][k] B[k][n] in dwords, as TDP* checks them.
void check_dot(int c, int a, int b) {
  check_tile(c);
  check_tile(a);
  check_tile(b);
  if (c == a || c == b || a == b) fault("a tile used twice by one dot product", c);
  if (colsb(c) % 4 || colsb(a) % 4 || colsb(b) % 4) fault("bytes per row not a multiple of 4", c);
  if (rows(c) != rows(a)) fault("C and A have different row counts", c);
  if (colsb(a) / 4 != rows(b)) fault("A's dwords per row differ from B's rows", a);
  if (colsb(c) != colsb(b)) fault("C and B have different bytes per row", b);
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Denormals as the tiles treat them: read as zero, written as zero (sign kept).
float flush(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

float bf16_at(int t, int r, int i) {
  uint16_t v;
  std::memcpy(&v, &state.data[t][r][2 * i], sizeof(v));
  return flush(bits_to_float(static_cast<uint32_t>(v) << 16));
}

}  // namespace

void load_config(const TileConfig* cfg) {
  if (cfg->palette == 0) return release();
  if (cfg->palette != 1) fault("palette other than 0 or 1", -1);
  for (int t = 0; t < kTiles; ++t)
    if (cfg->rows[t] > kMaxRows || cfg->colsb[t] > kMaxColsb)
      fault("configured shape beyond 16 rows x 64 bytes", t);
  state.cfg = *cfg;
  state.cfg.start_row = 0;
  state.configured = true;
  std::memset(state.data, 0, sizeof(state.data));
}

void release() {
  state.configured = false;
  state.cfg = TileConfig{};
  std::memset(state.data, 0, sizeof(state.data));
}

void zero(int t) {
  check_tile(t);
  std::memset(state.data[t], 0, sizeof(state.data[t]));
}

void load(int t, const void* base, size_t stride) {
  check_tile(t);
  std::memset(state.data[t], 0, sizeof(state.data[t]));  // bytes past the shape read 0
  for (int r = 0; r < rows(t); ++r)
    std::memcpy(state.data[t][r], static_cast<const uint8_t*>(base) + r * stride, colsb(t));
}

void store(int t, void* base, size_t stride) {
  check_tile(t);
  for (int r = 0; r < rows(t); ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, state.data[t][r], colsb(t));
}

void dpbf16ps(int c, int a, int b) {
  check_dot(c, a, b);
  const int n_cols = colsb(c) / 4, k_pairs = colsb(a) / 4;
  float bt[kMaxRows][2 * kMaxRows];  // B's bf16, widened and flushed once
  for (int k = 0; k < k_pairs; ++k)
    for (int i = 0; i < 2 * n_cols; ++i) bt[k][i] = bf16_at(b, k, i);
  for (int m = 0; m < rows(c); ++m) {
    float even[kMaxRows] = {}, odd[kMaxRows] = {};
    for (int k = 0; k < k_pairs; ++k) {
      const float a0 = bf16_at(a, m, 2 * k), a1 = bf16_at(a, m, 2 * k + 1);
      for (int n = 0; n < n_cols; ++n) {
        even[n] = flush(std::fma(a0, bt[k][2 * n], even[n]));
        odd[n] = flush(std::fma(a1, bt[k][2 * n + 1], odd[n]));
      }
    }
    auto* out = reinterpret_cast<float*>(state.data[c][m]);
    for (int n = 0; n < n_cols; ++n) {
      float acc;
      std::memcpy(&acc, &out[n], sizeof(acc));
      acc = flush(flush(acc) + flush(even[n] + odd[n]));
      std::memcpy(&out[n], &acc, sizeof(acc));
    }
  }
}

void dpb_int8(Int8 kind, int c, int a, int b) {
  check_dot(c, a, b);
  const bool a_signed = kind == Int8::ss || kind == Int8::su;
  const bool b_signed = kind == Int8::ss || kind == Int8::us;
  const auto byte = [](int t, int r, int i, bool is_signed) -> int32_t {
    const uint8_t v = state.data[t][r][i];
    return is_signed ? static_cast<int32_t>(static_cast<int8_t>(v)) : static_cast<int32_t>(v);
  };
  const int n_cols = colsb(c) / 4, k_dwords = colsb(a) / 4;
  for (int m = 0; m < rows(c); ++m) {
    for (int n = 0; n < n_cols; ++n) {
      uint32_t acc;  // two's complement wraparound, as the silicon adds
      std::memcpy(&acc, &state.data[c][m][4 * n], sizeof(acc));
      for (int k = 0; k < k_dwords; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<uint32_t>(byte(a, m, 4 * k + i, a_signed) *
                                       byte(b, k, 4 * n + i, b_signed));
      std::memcpy(&state.data[c][m][4 * n], &acc, sizeof(acc));
    }
  }
}

}  // namespace edgellm::kernels::amx::model
