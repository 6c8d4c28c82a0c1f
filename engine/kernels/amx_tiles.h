// The AMX tile configuration shared by the *_amx.cpp kernels. Plain data: any
// file may include it; loading it (_tile_loadconfig) needs the amx flags.
#pragma once

#include <cstdint>

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

}  // namespace edgellm::kernels::amx
