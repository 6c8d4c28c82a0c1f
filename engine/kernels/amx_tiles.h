// The AMX tile layer. Every *_amx.cpp kernel issues its tile instructions
// through the functions below, templated on a back end:
//   Silicon    the instructions themselves (the amx compile flags, a CPU with
//              AMX and the Linux tile permission, cpu_features.cpp);
//   TileModel  an exact software model of the eight tile registers and of the
//              instructions' arithmetic (tile_model_avx512.cpp), so the amx
//              tier's logic (panel layouts, tails, fault hooks, precision
//              paths) runs and is tested on any AVX-512 machine.
// A kernel is written once as a template over `Tiles` and instantiated for
// both; kernels.h's tile_backend() picks which one a call runs. Where AMX
// exists, a test holds the model bit-identical to the silicon (kernels_test).
//
// The model follows the SDM's definitions, checked against Sapphire/Emerald
// Rapids silicon: TDPBF16PS keeps two fp32 sums per output, one of the even
// and one of the odd bf16 products, each accumulated by FMA over the K pairs
// from zero (round to nearest even, inputs and results denormal-flushed), then
// adds them and that to C (two more roundings). It is not the naive "C +=
// a0 b0; C += a1 b1" loop: that one differs from the silicon on ~28% of
// random outputs. The int8 products (TDPBSSD family) are exact, summed with
// 32-bit wraparound.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AMX_TILE__)
#include <immintrin.h>
#endif

#include "kernels/kernels.h"

namespace edgellm::kernels::amx {

// The LDTILECFG memory operand (64 bytes), palette 1: per tile its rows and
// bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// All eight tiles 16 rows x 64 bytes: C tiles of 16 x 16 fp32, A/B tiles of
// 16 rows x 32 bf16.
inline TileConfig uniform_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

// The model's instructions on the calling thread's tile state. Misuse the
// silicon faults on (#UD: no configuration, operand shapes that do not fit)
// aborts with a message naming it.
namespace model {
void load_config(const TileConfig* cfg);
void release();
void zero(int t);
void load(int t, const void* base, size_t stride);
void store(int t, void* base, size_t stride);
void dpbf16ps(int c, int a, int b);
// Signedness of the A and B bytes: ss = TDPBSSD, su = TDPBSUD, us = TDPBUSD, uu = TDPBUUD.
enum class Int8 { ss, su, us, uu };
void dpb_int8(Int8 kind, int c, int a, int b);
}  // namespace model

struct Silicon {};
struct TileModel {};

inline void tile_config(TileModel, const TileConfig* cfg) {
  model::load_config(cfg);
}
inline void tile_release(TileModel) {
  model::release();
}
template <int T>
inline void tile_zero(TileModel) {
  model::zero(T);
}
template <int T>
inline void tile_load(TileModel, const void* base, size_t stride) {
  model::load(T, base, stride);
}
template <int T>
inline void tile_store(TileModel, void* base, size_t stride) {
  model::store(T, base, stride);
}
template <int C, int A, int B>
inline void tile_dpbf16ps(TileModel) {
  model::dpbf16ps(C, A, B);
}
template <int C, int A, int B>
inline void tile_dpbssd(TileModel) {
  model::dpb_int8(model::Int8::ss, C, A, B);
}
template <int C, int A, int B>
inline void tile_dpbusd(TileModel) {
  model::dpb_int8(model::Int8::us, C, A, B);
}

#if defined(__AMX_TILE__)
// The instructions by hand: GCC's _tile_* macros paste their tile argument
// into the asm text, so they cannot take a template parameter; "%c" prints
// one. AT&T operand order (sources first); "memory": loads and stores touch
// memory the compiler must not cache across them.
inline void tile_config(Silicon, const TileConfig* cfg) {
  _tile_loadconfig(cfg);
}
inline void tile_release(Silicon) {
  _tile_release();
}
template <int T>
inline void tile_zero(Silicon) {
  __asm__ volatile("tilezero %%tmm%c0" ::"n"(T));
}
template <int T>
inline void tile_load(Silicon, const void* base, size_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "n"(T) : "memory");
}
template <int T>
inline void tile_store(Silicon, void* base, size_t stride) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "n"(T) : "memory");
}
template <int C, int A, int B>
inline void tile_dpbf16ps(Silicon) {
  __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}
template <int C, int A, int B>
inline void tile_dpbssd(Silicon) {
  __asm__ volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}
template <int C, int A, int B>
inline void tile_dpbusd(Silicon) {
  __asm__ volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}
#endif

// Tests: one instruction on one back end (tile_check_amx.cpp). Loads `cfg`,
// tmm0 (C) from c, tmm1 (A) from a, tmm2 (B) from b, rows `stride` bytes
// apart, runs tmm0 += tmm1 . tmm2, stores tmm0 to out (same stride), releases.
enum class TileOp { dpbf16ps, dpbssd, dpbusd };
void run_tile_op(TileBackend backend, TileOp op, const TileConfig& cfg, const void* c,
                 const void* a, const void* b, void* out, size_t stride);

// Runs f(Silicon{}) or f(TileModel{}), as tile_backend() says.
template <class F>
inline void with_tiles(F&& f) {
#if defined(__AMX_TILE__)
  if (tile_backend() == TileBackend::silicon) return f(Silicon{});
#endif
  f(TileModel{});
}

}  // namespace edgellm::kernels::amx
