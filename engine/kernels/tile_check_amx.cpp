// Test support: one tile instruction on either back end (amx_tiles.h), so a
// test can hold the model to the silicon instruction by instruction.
#include "kernels/amx_tiles.h"

namespace edgellm::kernels::amx {

namespace {

template <class Tiles>
void run_on(Tiles tiles, TileOp op, const TileConfig& cfg, const void* c, const void* a,
            const void* b, void* out, size_t stride) {
  tile_config(tiles, &cfg);
  tile_load<0>(tiles, c, stride);
  tile_load<1>(tiles, a, stride);
  tile_load<2>(tiles, b, stride);
  switch (op) {
    case TileOp::dpbf16ps:
      tile_dpbf16ps<0, 1, 2>(tiles);
      break;
    case TileOp::dpbssd:
      tile_dpbssd<0, 1, 2>(tiles);
      break;
    case TileOp::dpbusd:
      tile_dpbusd<0, 1, 2>(tiles);
      break;
  }
  tile_store<0>(tiles, out, stride);
  tile_release(tiles);
}

}  // namespace

void run_tile_op(TileBackend backend, TileOp op, const TileConfig& cfg, const void* c,
                 const void* a, const void* b, void* out, size_t stride) {
  if (backend == TileBackend::silicon)
    run_on(Silicon{}, op, cfg, c, a, b, out, stride);
  else
    run_on(TileModel{}, op, cfg, c, a, b, out, stride);
}

}  // namespace edgellm::kernels::amx
