// Quantized decode GEMV (kernels/quant.h) per weight format, in GB/s of the
// bytes the repacked layout streams: "hot" repeats one matrix that fits in L2
// (the kernel's instruction throughput), "dram" cycles through distinct copies
// (> 192 MB together, as decode streams a model larger than the LLC). hot well
// above dram means the format is memory-bound on this machine; hot near dram
// means the unpack/convert instructions are the limit.
//
// --rows times batched decode's matmul_rows (n independent tokens) instead of
// one n-token matmul; --int8 quantizes the activations (VNNI) instead of fp32;
// --bf16 times the fast config's decode (avx512::quant_gemv_bf16: u4, u5 and c4
// formats on bf16 x, the others fp32); --as-i8 expands the c4 formats (IQ4_NL,
// IQ4_XS, MXFP4) into the int8 layout they used to be repacked into, for
// comparison. Each line also gives the bytes streamed per weight and, from
// DRAM, the weights per second (Gw/s: GB/s over bytes per weight, what decode
// speed follows).
// --cpu-clock times the one-thread passes by the thread's CPU time instead of
// the wall clock (on a machine shared with other jobs, time spent descheduled
// is not the kernel's; a thread stalled on memory still counts).
//
// --shape keeps the shapes whose name contains the given text (e.g. qwen2.5).
//
//   quant_gemv_bench [--threads N] [--n TOKENS] [--format Q4_1|...] [--shape TEXT] [--reps R]
//                    [--rows] [--int8 | --bf16] [--as-i8] [--cpu-clock]
#include <time.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "edgellm/bf16.h"
#include "edgellm/roofline.h"
#include "edgellm/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

using namespace edgellm;
using namespace edgellm::kernels;
using Clock = std::chrono::steady_clock;

namespace {

bool g_rows = false, g_bf16 = false, g_as_i8 = false, g_cpu_clock = false;

// Seconds on the wall clock, or on this thread's CPU clock (--cpu-clock).
double seconds(bool cpu) {
  if (!cpu) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A c4 segment as the int8 layout: each code replaced by its codebook value.
QuantSegment expanded_to_i8(QuantSegment s) {
  std::vector<uint8_t> q(s.rows * s.cols);
  for (size_t i = 0; i < s.rows * s.cols / 32; ++i)
    for (size_t j = 0; j < 32; ++j)
      q[i * 32 + j] = static_cast<uint8_t>(s.value(s.qs.data() + i * 16, j));
  s.layout = QuantLayout::i8;
  s.qs = std::move(q);
  if (s.e8m0_scales) {  // MXFP4's int8 repack kept its scales as halves (exact here)
    for (uint8_t e : s.scales8) s.scales16.push_back(float_to_f16(e8m0_half(e)));
    s.e8m0_scales = false;
    s.half_scales = true;
    s.scales8 = {};
  }
  return s;
}

QuantMatrix random_quant(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  std::vector<uint8_t> blocks(rows * cols / block_elems(f) * block_bytes(f));
  for (auto& b : blocks) b = static_cast<uint8_t>(rng() & 0x3b);  // keeps f16 scales finite
  if (f == BlockFormat::mxfp4)  // gpt-oss-like E8M0 half-scales 2^-10 .. 2^-3 (exact halves)
    for (size_t i = 0; i < blocks.size(); i += 17)
      blocks[i] = static_cast<uint8_t>(118 + rng() % 8);
  QuantMatrix m;
  QuantSegment s = repack_gguf(f, blocks.data(), rows, cols);
  append_segment(
      m, g_as_i8 && s.layout == QuantLayout::c4 ? expanded_to_i8(std::move(s)) : std::move(s));
  return m;
}

QuantPrecision g_precision = QuantPrecision::fp32;

// Median over `reps` timed passes (after one warm-up) of a pass over `ms`, in
// GB/s of the bytes the pass streams.
double gbytes_per_s(const std::vector<QuantMatrix>& ms, size_t n, ThreadPool& pool, int reps) {
  const size_t cols = ms[0].cols, rows = ms[0].rows;
  std::vector<float> x(n * cols), y(n * rows);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& e : x) e = dist(rng);
  // At least ~50 MB per timed pass, so the clock's resolution does not matter.
  const size_t inner = std::max<size_t>(1, (size_t{50} << 20) / (ms.size() * ms[0].bytes()));
  auto pass = [&] {
    for (size_t k = 0; k < inner; ++k)
      for (const auto& m : ms) {
        if (g_bf16)
          avx512::quant_gemv_bf16(m, x.data(), n, y.data(), pool);
        else if (g_rows)
          quant_matmul_rows(m, x.data(), n, y.data(), nullptr, pool, active_isa(), g_precision);
        else
          quant_matmul(m, x.data(), n, y.data(), nullptr, pool, active_isa(), g_precision);
      }
  };
  pass();
  std::vector<double> t(static_cast<size_t>(reps));
  const bool cpu = g_cpu_clock && pool.size() == 1;  // the pass runs on this thread
  for (auto& s : t) {
    const double t0 = seconds(cpu);
    pass();
    s = seconds(cpu) - t0;
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(inner * ms.size() * ms[0].bytes()) / t[t.size() / 2] / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 7;
  size_t n = 1;
  const char* only = nullptr;
  const char* shape_only = nullptr;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--threads") == 0 && has_value)
      threads = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--n") == 0 && has_value)
      n = static_cast<size_t>(std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--reps") == 0 && has_value)
      reps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--format") == 0 && has_value)
      only = argv[++i];
    else if (std::strcmp(argv[i], "--shape") == 0 && has_value)
      shape_only = argv[++i];
    else if (std::strcmp(argv[i], "--rows") == 0)
      g_rows = true;
    else if (std::strcmp(argv[i], "--int8") == 0)
      g_precision = QuantPrecision::int8;
    else if (std::strcmp(argv[i], "--bf16") == 0)
      g_bf16 = true;
    else if (std::strcmp(argv[i], "--as-i8") == 0)
      g_as_i8 = true;
    else if (std::strcmp(argv[i], "--cpu-clock") == 0)
      g_cpu_clock = true;
    else {
      std::fprintf(
          stderr,
          "usage: quant_gemv_bench [--threads N] [--n TOKENS] [--format Q4_1|...] "
          "[--shape SUBSTRING] [--reps R] [--rows] [--int8 | --bf16] [--as-i8] [--cpu-clock]\n");
      return 2;
    }
  }
  if (g_bf16 && (g_precision == QuantPrecision::int8 || active_isa() < Isa::avx512)) {
    std::fprintf(stderr, "quant_gemv_bench: --bf16 needs the avx512 tier and no --int8\n");
    return 2;
  }
  if (threads < 1 || reps < 1 || n < 1) {
    std::fprintf(stderr, "quant_gemv_bench: --threads, --n and --reps must be positive\n");
    return 2;
  }
  ThreadPool pool(threads), one(1);
  std::printf("isa %s, %s activations, n=%zu%s, %d threads (median of %d)\n",
              std::string(isa_name(active_isa())).c_str(),
              g_bf16                                ? "bf16 (u4, u5, c4)"
              : g_precision == QuantPrecision::int8 ? "int8"
                                                    : "fp32",
              n, g_rows ? " independent rows (batched decode)" : "", pool.size(), reps);
  if (g_cpu_clock) std::printf("1t columns timed by the thread CPU clock\n");
  const double ceil1 = edgellm::measure_read_bandwidth(size_t{512} << 20, 1);
  const double ceiln = edgellm::measure_read_bandwidth(size_t{512} << 20, pool.size());
  std::printf("ceiling  plain read bandwidth over 512 MB: 1t %.1f GB/s, %dt %.1f GB/s\n", ceil1,
              pool.size(), ceiln);
  struct Shape {
    const char* what;
    BlockFormat format;
    size_t rows, cols;
  };
  const Shape shapes[] = {{"gate_up smollm2", BlockFormat::q4_1, 3072, 576},
                          {"down smollm2", BlockFormat::q4_1, 576, 1536},
                          {"lm_head smollm2", BlockFormat::q8_0, 49152, 576},
                          {"qkv gemma3", BlockFormat::q5_0, 1536, 640},
                          {"gate_up gemma3", BlockFormat::q4_k, 4096, 640},
                          {"down gemma3", BlockFormat::q6_k, 640, 2048},
                          {"q gemma3", BlockFormat::q4_0, 1024, 640},
                          // The formats repacked to int8 (+ min): SmolLM2's down shape.
                          {"down smollm2", BlockFormat::q5_1, 576, 1536},
                          {"down smollm2", BlockFormat::q2_k, 576, 1536},
                          {"down smollm2", BlockFormat::q3_k, 576, 1536},
                          {"down smollm2", BlockFormat::q5_k, 576, 1536},
                          {"down smollm2", BlockFormat::iq4_nl, 576, 1536},
                          {"down smollm2", BlockFormat::iq4_xs, 576, 1536},
                          // gpt-oss-20b's experts: hidden 2880 x intermediate 2880.
                          {"expert gpt-oss", BlockFormat::mxfp4, 2880, 2880},
                          {"expert gpt-oss", BlockFormat::iq4_nl, 2880, 2880},
                          {"expert gpt-oss", BlockFormat::q4_0, 2880, 2880},
                          // Qwen2.5-1.5B and Qwen3-30B-A3B decode shapes (Q4_0 GGUFs):
                          // long rows (down), many rows (lm_head), small MoE experts.
                          {"gate_up qwen2.5", BlockFormat::q4_0, 17920, 1536},
                          {"qkv qwen2.5", BlockFormat::q4_0, 2048, 1536},
                          {"down qwen2.5", BlockFormat::q4_0, 1536, 8960},
                          {"lm_head qwen2.5", BlockFormat::q4_0, 151936, 1536},
                          {"exp gate_up q3moe", BlockFormat::q4_0, 1536, 2048},
                          {"exp down q3moe", BlockFormat::q4_0, 2048, 768},
                          {"qkv q3moe", BlockFormat::q4_0, 5120, 2048}};
  bool any = false;
  for (const Shape& s : shapes) {
    if (only && block_format_name(s.format) != only) continue;
    if (shape_only && std::strstr(s.what, shape_only) == nullptr) continue;
    any = true;
    std::mt19937 rng(0);
    std::vector<QuantMatrix> hot;
    hot.push_back(random_quant(s.format, s.rows, s.cols, rng));
    const size_t bytes = hot[0].bytes();
    // hot: a slice of the rows that fits in L2 beside x.
    const size_t hot_rows = std::min(s.rows, (size_t{768} << 10) / (bytes / s.rows)) / 4 * 4;
    hot[0] = random_quant(s.format, hot_rows, s.cols, rng);
    std::vector<QuantMatrix> cold;
    for (size_t total = 0; total < (size_t{192} << 20); total += bytes)
      cold.push_back(random_quant(s.format, s.rows, s.cols, rng));
    const double h1 = gbytes_per_s(hot, n, one, reps);
    const double d1 = gbytes_per_s(cold, n, one, reps);
    const double dn = gbytes_per_s(cold, n, pool, reps);
    const double per_weight = static_cast<double>(bytes) / static_cast<double>(s.rows * s.cols);
    std::printf(
        "%-16s %-6s %6zux%-5zu %5.3f B/w  hot 1t %6.1f GB/s   dram 1t %6.1f GB/s (%5.1f Gw/s)   "
        "dram %dt %6.1f GB/s (%5.1f Gw/s)   of read bw: 1t %3.0f%% %dt %3.0f%%\n",
        s.what, std::string(block_format_name(s.format)).c_str(), s.rows, s.cols, per_weight, h1,
        d1, d1 / per_weight, pool.size(), dn, dn / per_weight, 100 * d1 / ceil1, pool.size(),
        100 * dn / ceiln);
    std::fflush(stdout);
  }
  if (!any) {
    std::fprintf(stderr, "quant_gemv_bench: no shape matches --format %s --shape %s\n",
                 only ? only : "(any)", shape_only ? shape_only : "(any)");
    return 2;
  }
  return 0;
}
