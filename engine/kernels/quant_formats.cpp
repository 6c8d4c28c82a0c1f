// GGUF block formats -> the internal i8 / u4 / u5 / c4 layouts (kernels/quant.h), the
// exact dequantization of a row, and ggml's reference quantizers for q8_0 and
// q4_0 (quantizing a bf16 checkpoint at setup). Block layouts follow ggml's
// block_q4_0 ... block_q6_K, block_iq4_nl, block_iq4_xs, block_mxfp4 (ggml-common.h); the
// arithmetic follows gguf-py's quants.py, whose results the tests hold us to
// bit for bit.
//
// Compiled without ISA flags, so no FMA contraction: d * q + m rounds twice,
// as numpy does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "edgellm/bf16.h"
#include "edgellm/error.h"
#include "kernels/quant.h"

namespace edgellm::kernels {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float load_f16(const uint8_t* p) {
  return f16_to_float(load_u16(p));
}

// Q4_K's and Q5_K's 12 bytes of packed 6-bit scales and mins (gguf-py
// Q4_K.get_scale_min).
void q4k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
    m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// Element p of a Q2_K / Q3_K super-block's 2-bit field: 64 bytes, each half of
// 128 elements in 32 bytes, four 2-bit planes of 32 elements.
int q2_value(const uint8_t* qs, int p) {
  return (qs[32 * (p / 128) + p % 32] >> (2 * (p % 128 / 32))) & 3;
}

// IQ4_NL's and IQ4_XS's non-linear codebook (ggml kvalues_iq4nl).
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4's E2M1 codes, doubled to integers (ggml kvalues_mxfp4): sign bit 3,
// then 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

uint8_t as_byte(int q) {
  return static_cast<uint8_t>(static_cast<int8_t>(q));
}

// GGUF row `from` (at src) -> the segment's row `r`; `where` names the tensor in errors.
void repack_row(BlockFormat f, const uint8_t* src, size_t cols, QuantSegment& s, size_t r,
                size_t from, std::string_view where) {
  uint8_t* qs = s.qs.data() + r * s.row_bytes();
  float* scales = s.scales.empty() ? nullptr : s.scales.data() + r * (cols / s.group);
  float* mins = s.has_min ? s.mins.data() + r * (cols / s.group) : nullptr;
  const size_t nb = cols / block_elems(f), bb = block_bytes(f);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * bb;
    switch (f) {
      case BlockFormat::q8_0:
        scales[b] = load_f16(blk);
        std::memcpy(qs + b * 32, blk + 2, 32);
        break;
      // Q5_0: d, qh[4], qs[16]; Q5_1: d, m, qh[4], qs[16]. The u5 block is qs
      // (the u4 nibble order already), then qh (bit j: element j's fifth bit).
      case BlockFormat::q5_0:
        scales[b] = load_f16(blk);
        std::memcpy(qs + b * 20, blk + 6, 16);
        std::memcpy(qs + b * 20 + 16, blk + 2, 4);
        break;
      case BlockFormat::q5_1:
        scales[b] = load_f16(blk);
        mins[b] = load_f16(blk + 2);
        std::memcpy(qs + b * 20, blk + 8, 16);
        std::memcpy(qs + b * 20 + 16, blk + 4, 4);
        break;
      case BlockFormat::q2_k: {  // scales[16] (low nibble scale, high min), qs[64], d, dmin
        const float d = load_f16(blk + 80), dmin = load_f16(blk + 82);
        for (int g = 0; g < 16; ++g) {
          scales[b * 16 + g] = d * static_cast<float>(blk[g] & 0xf);
          mins[b * 16 + g] = -(dmin * static_cast<float>(blk[g] >> 4));
        }
        for (int p = 0; p < 256; ++p) qs[b * 256 + p] = as_byte(q2_value(blk + 16, p));
        break;
      }
      case BlockFormat::q3_k: {  // hmask[32], qs[64], scales[12] (6-bit), d
        const uint8_t *hmask = blk, *sc = blk + 96;
        const float d = load_f16(blk + 108);
        for (int g = 0; g < 16; ++g) {
          const int lo = (sc[g % 8] >> (4 * (g / 8))) & 0xf;
          const int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
          scales[b * 16 + g] = d * static_cast<float>((lo | hi << 4) - 32);
        }
        // A clear hmask bit subtracts 4 (the high bit is stored inverted).
        for (int p = 0; p < 256; ++p)
          qs[b * 256 + p] =
              as_byte(q2_value(blk + 32, p) - ((hmask[p % 32] >> (p / 32)) & 1 ? 0 : 4));
        break;
      }
      case BlockFormat::q6_k: {
        const uint8_t *ql = blk, *qh = blk + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
        const float d = load_f16(blk + 208);
        for (int g = 0; g < 16; ++g) scales[b * 16 + g] = d * static_cast<float>(sc[g]);
        for (int p = 0; p < 256; ++p) {
          const int h = p / 128, rr = p % 128;
          const int lo = (ql[64 * h + rr % 64] >> (4 * (rr / 64))) & 0xf;
          const int hi = (qh[32 * h + rr % 32] >> (2 * (rr / 32))) & 3;
          qs[b * 256 + p] = as_byte((lo | hi << 4) - 32);
        }
        break;
      }
      case BlockFormat::q5_k: {  // d, dmin, scales[12], qh[32], qs[128]
        const float d = load_f16(blk), dmin = load_f16(blk + 2);
        const uint8_t *qh = blk + 16, *q = blk + 48;
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          q4k_scale_min(blk + 4, j, sc, m);
          scales[b * 8 + j] = d * static_cast<float>(sc);
          mins[b * 8 + j] = -(dmin * static_cast<float>(m));
          // Sub-block j: nibble j % 2 of q[32 (j / 2) + l], bit j of qh[l].
          for (int l = 0; l < 32; ++l)
            qs[b * 256 + j * 32 + l] =
                as_byte(((q[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf) | ((qh[l] >> j) & 1) << 4);
        }
        break;
      }
      // IQ4_NL, IQ4_XS, MXFP4: 16 bytes of codes per 32, already in the c4
      // nibble order (element j in nibble j / 16 of byte j % 16).
      case BlockFormat::iq4_nl:
        scales[b] = load_f16(blk);
        std::memcpy(qs + b * 16, blk + 2, 16);
        break;
      case BlockFormat::iq4_xs: {  // d, scales_h (u16), scales_l[4], qs[128]
        const float d = load_f16(blk);
        const uint16_t sh = load_u16(blk + 2);
        for (int j = 0; j < 8; ++j) {
          const int lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 0xf, hi = (sh >> (2 * j)) & 3;
          scales[b * 8 + j] = d * static_cast<float>((lo | hi << 4) - 32);
          std::memcpy(qs + (b * 8 + j) * 16, blk + 8 + 16 * j, 16);
        }
        break;
      }
      case BlockFormat::mxfp4:           // e (E8M0), qs[16]
        if (blk[0] > kMaxMxfp4Exponent)  // the message is built only on failure
          throw Error(std::string(where) + ": MXFP4 block " + std::to_string(b) + " of row " +
                      std::to_string(from) + " has exponent byte " + std::to_string(blk[0]) +
                      ", above " + std::to_string(kMaxMxfp4Exponent) +
                      " (its weights would overflow fp32)");
        s.scales8[r * (cols / 32) + b] = blk[0];
        std::memcpy(qs + b * 16, blk + 1, 16);
        break;
      case BlockFormat::q4_0:
        scales[b] = load_f16(blk);
        std::memcpy(qs + b * 16, blk + 2, 16);
        break;
      case BlockFormat::q4_1:
        scales[b] = load_f16(blk);
        mins[b] = load_f16(blk + 2);
        std::memcpy(qs + b * 16, blk + 4, 16);
        break;
      case BlockFormat::q4_k: {
        const float d = load_f16(blk), dmin = load_f16(blk + 2);
        const uint8_t* q = blk + 16;
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          q4k_scale_min(blk + 4, j, sc, m);
          scales[b * 8 + j] = d * static_cast<float>(sc);
          mins[b * 8 + j] = -(dmin * static_cast<float>(m));
          // Sub-block j = 2i + half: elements are nibble `half` of q[32 i + l].
          const int i = j / 2, shift = 4 * (j % 2);
          uint8_t* out = qs + (b * 8 + j) * 16;
          for (int l = 0; l < 16; ++l)
            out[l] = static_cast<uint8_t>(((q[32 * i + l] >> shift) & 0xf) |
                                          (((q[32 * i + l + 16] >> shift) & 0xf) << 4));
        }
        break;
      }
    }
  }
}

// What each format repacks into (ggml-common.h block sizes).
struct FormatInfo {
  std::string_view name;
  size_t elems, bytes;
  QuantLayout layout;
  size_t group;
  int zero;
  bool has_min;
};

const FormatInfo& info(BlockFormat f) {
  using L = QuantLayout;
  static const FormatInfo kInfo[] = {
      {"Q4_0", 32, 18, L::u4, 32, 8, false},   {"Q4_1", 32, 20, L::u4, 32, 0, true},
      {"Q5_0", 32, 22, L::u5, 32, 16, false},  {"Q5_1", 32, 24, L::u5, 32, 0, true},
      {"Q8_0", 32, 34, L::i8, 32, 0, false},   {"Q2_K", 256, 84, L::i8, 16, 0, true},
      {"Q3_K", 256, 110, L::i8, 16, 0, false}, {"Q4_K", 256, 144, L::u4, 32, 0, true},
      {"Q5_K", 256, 176, L::i8, 32, 0, true},  {"Q6_K", 256, 210, L::i8, 16, 0, false},
      {"IQ4_NL", 32, 18, L::c4, 32, 0, false}, {"IQ4_XS", 256, 136, L::c4, 32, 0, false},
      {"MXFP4", 32, 17, L::c4, 32, 0, false},
  };
  static_assert(std::size(kInfo) == static_cast<size_t>(BlockFormat::mxfp4) + 1);
  return kInfo[static_cast<size_t>(f)];
}

}  // namespace

std::string_view block_format_name(BlockFormat f) {
  return info(f).name;
}
size_t block_elems(BlockFormat f) {
  return info(f).elems;
}
size_t block_bytes(BlockFormat f) {
  return info(f).bytes;
}

size_t QuantSegment::bytes() const {
  return qs.size() + (scales.size() + mins.size()) * sizeof(float) +
         (scales16.size() + mins16.size()) * sizeof(uint16_t) + scales8.size();
}

float QuantSegment::scale(size_t i) const {
  return e8m0_scales ? e8m0_half(scales8[i]) : half_scales ? f16_to_float(scales16[i]) : scales[i];
}
float QuantSegment::min(size_t i) const {
  return half_scales ? f16_to_float(mins16[i]) : mins[i];
}

namespace {

// Halves for `v` if every value is exactly one (and finite), else empty.
std::vector<uint16_t> exact_halves(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    h[i] = float_to_f16(v[i]);
    if (!std::isfinite(v[i]) || f16_to_float(h[i]) != v[i] ||
        std::signbit(v[i]) != ((h[i] >> 15) != 0))
      return {};
  }
  return h;
}

void store_halves_if_exact(QuantSegment& s) {
  if (s.e8m0_scales) return;  // 1 byte a scale already
  auto sc = exact_halves(s.scales);
  if (sc.size() != s.scales.size()) return;
  auto mn = exact_halves(s.mins);
  if (mn.size() != s.mins.size()) return;
  s.half_scales = true;
  s.scales16 = std::move(sc);
  s.mins16 = std::move(mn);
  // Freed, not cleared: `= {}` would keep the fp32 capacity (a quarter of a Q4_0 matrix).
  std::vector<float>().swap(s.scales);
  std::vector<float>().swap(s.mins);
}

}  // namespace

size_t QuantMatrix::bytes() const {
  size_t b = 0;
  for (const auto& s : segments) b += s.bytes();
  return b;
}

QuantSegment repack_gguf(BlockFormat f, const uint8_t* blocks, size_t rows, size_t cols,
                         const int32_t* row_order, std::string_view tensor) {
  QuantSegment s;
  s.rows = rows;
  s.cols = cols;
  const FormatInfo& fi = info(f);
  s.layout = fi.layout;
  s.group = fi.group;
  s.zero = fi.zero;
  s.has_min = fi.has_min;
  if (f == BlockFormat::mxfp4)
    std::copy(std::begin(kMxfp4Values), std::end(kMxfp4Values), s.codebook.begin());
  else if (f == BlockFormat::iq4_nl || f == BlockFormat::iq4_xs)
    std::copy(std::begin(kIq4Values), std::end(kIq4Values), s.codebook.begin());
  s.qs.resize(rows * s.row_bytes());
  s.e8m0_scales = f == BlockFormat::mxfp4;
  if (s.e8m0_scales)
    s.scales8.resize(rows * (cols / s.group));
  else
    s.scales.resize(rows * (cols / s.group));
  if (s.has_min) s.mins.resize(rows * (cols / s.group));
  const size_t src_row = cols / block_elems(f) * block_bytes(f);
  for (size_t r = 0; r < rows; ++r) {
    const size_t from = row_order ? static_cast<size_t>(row_order[r]) : r;
    repack_row(f, blocks + from * src_row, cols, s, r, from,
               tensor.empty() ? std::string_view("GGUF blocks") : tensor);
  }
  store_halves_if_exact(s);
  return s;
}

size_t repacked_bytes(BlockFormat f, size_t rows, size_t cols) {
  const FormatInfo& fi = info(f);
  // The formats whose block scale (and min) is an IEEE half: store_halves_if_exact keeps them so.
  const bool halves = f == BlockFormat::q4_0 || f == BlockFormat::q4_1 || f == BlockFormat::q5_0 ||
                      f == BlockFormat::q5_1 || f == BlockFormat::q8_0;
  const size_t groups = rows * (cols / fi.group) * (fi.has_min ? 2 : 1);
  return rows * (cols / 32) * layout_block_bytes(fi.layout) + groups * (halves ? 2 : 4);
}

void quantize_blocks(BlockFormat f, const float* x, size_t rows, size_t cols, uint8_t* out) {
  check(f == BlockFormat::q8_0 || f == BlockFormat::q4_0,
        "quantizing at setup supports q8_0 and q4_0, not " + std::string(block_format_name(f)));
  check(cols % 32 == 0,
        "quantizing at setup needs rows of a multiple of 32 elements, got " + std::to_string(cols));
  const size_t nb = cols / 32, bb = block_bytes(f);
  for (size_t i = 0; i < rows * nb; ++i) {
    const float* v = x + i * 32;
    uint8_t* blk = out + i * bb;
    if (f == BlockFormat::q8_0) {  // ggml quantize_row_q8_0_ref
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t h = float_to_f16(d);
      std::memcpy(blk, &h, 2);
      for (int j = 0; j < 32; ++j)
        blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id)));
    } else {  // ggml quantize_row_q4_0_ref
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(v[j]) > amax) {
          amax = std::fabs(v[j]);
          max = v[j];
        }
      const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t h = float_to_f16(d);
      std::memcpy(blk, &h, 2);
      for (int j = 0; j < 16; ++j) {
        const int q0 = std::min(15, static_cast<int>(v[j] * id + 8.5f));
        const int q1 = std::min(15, static_cast<int>(v[j + 16] * id + 8.5f));
        blk[2 + j] = static_cast<uint8_t>(q0 | q1 << 4);
      }
    }
  }
}

QuantSegment quantize_rows(BlockFormat f, const float* x, size_t rows, size_t cols) {
  std::vector<uint8_t> blocks(rows * (cols / 32) * block_bytes(f));
  quantize_blocks(f, x, rows, cols, blocks.data());
  return repack_gguf(f, blocks.data(), rows, cols);
}

void append_segment(QuantMatrix& m, QuantSegment s) {
  if (m.segments.empty()) m.cols = s.cols;
  check(s.cols == m.cols, "quantized matrix parts differ in row length (" + std::to_string(s.cols) +
                              " vs " + std::to_string(m.cols) + ")");
  m.rows += s.rows;
  m.segments.push_back(std::move(s));
}

void dequant_row(const QuantMatrix& m, size_t r, float* out) {
  for (const QuantSegment& s : m.segments) {
    if (r >= s.rows) {
      r -= s.rows;
      continue;
    }
    const uint8_t* qs = s.qs.data() + r * s.row_bytes();
    const size_t g0 = r * (s.cols / s.group);  // first scale of the row
    if (s.layout == QuantLayout::i8) {
      for (size_t c = 0; c < s.cols; ++c) {
        const float v = static_cast<float>(static_cast<int8_t>(qs[c])) * s.scale(g0 + c / s.group);
        out[c] = s.has_min ? v + s.min(g0 + c / s.group) : v;
      }
      return;
    }
    const size_t bb = layout_block_bytes(s.layout);
    for (size_t c = 0; c < s.cols; ++c) {
      const size_t b = c / 32, j = c % 32;
      const int q = s.value(qs + b * bb, j);
      const float v = s.scale(g0 + b) * static_cast<float>(q);
      out[c] = s.has_min ? v + s.min(g0 + b) : v;
    }
    return;
  }
}

}  // namespace edgellm::kernels
