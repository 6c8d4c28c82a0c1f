// Run-time detection of the ISA tiers. A tier needs three things: the CPU's
// instruction bits (cpuid), the OS saving the register state they use (XCR0,
// read with xgetbv), and for AMX the Linux per-process permission to use the
// tile data state (arch_prctl ARCH_REQ_XCOMP_PERM). A tier the CPU has but the
// OS denies is dropped with one line on stderr; the engine runs on the next.
//
// Compiled without ISA flags: cpuid and xgetbv are issued by inline asm.
#include <cstdio>

#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace edgellm::kernels {

namespace {

#if defined(__x86_64__)

struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (leaf > __get_cpuid_max(leaf & 0x80000000u, nullptr)) return r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool bit(unsigned reg, int b) {
  return (reg >> b) & 1u;
}

// XCR0: which register states the OS saves on a context switch.
unsigned long long xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// Linux refuses tile instructions (SIGILL) until the process asks for the
// XTILEDATA state; the request can be denied (e.g. by a sigaltstack too small).
bool request_amx_permission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// AVX-VNNI (VEX-encoded vpdpbusd on ymm): cpuid 7.1 eax bit 4, with the OS
// saving ymm state. An extension beside the tiers: the int8-activation
// quantized kernels use it where present (Zen 4, Sapphire Rapids, Alder Lake).
bool detect_avx_vnni() {
  const CpuidRegs l1 = cpuid(1, 0);
  if (!bit(l1.ecx, 27) || (xgetbv0() & 0x6) != 0x6) return false;
  return bit(cpuid(7, 1).eax, 4);
}

Isa detect() {
  const CpuidRegs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  if (!osxsave) return Isa::scalar;
  const unsigned long long xcr0 = xgetbv0();
  const CpuidRegs l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);

  const bool ymm_state = (xcr0 & 0x6) == 0x6;  // SSE + AVX
  const bool avx2 = ymm_state && bit(l1.ecx, 28) && bit(l1.ecx, 12) && bit(l1.ecx, 29) &&
                    bit(l7.ebx, 5);  // AVX, FMA, F16C, AVX2
  if (!avx2) return Isa::scalar;

  // AVX-512F/BW/VL and BF16 (vdpbf16ps: the prefill GEMM's instruction).
  const bool avx512_cpu = bit(l7.ebx, 16) && bit(l7.ebx, 30) && bit(l7.ebx, 31) && bit(l7s1.eax, 5);
  if (!avx512_cpu) return Isa::avx2;
  const bool zmm_state = (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!zmm_state) {
    std::fprintf(stderr, "edgellm: CPU has AVX-512 but the OS does not enable it; using avx2\n");
    return Isa::avx2;
  }

  const bool amx_cpu = bit(l7.edx, 24) && bit(l7.edx, 22);  // AMX-TILE, AMX-BF16
  if (!amx_cpu) return Isa::avx512;
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  if (!tile_state || !request_amx_permission()) {
    std::fprintf(stderr, "edgellm: CPU has AMX but the OS denied tile state; using avx512\n");
    return Isa::avx512;
  }
  return Isa::amx;
}

bool detect_amx_int8() {
  return bit(cpuid(7, 0).edx, 25);
}

#else

bool detect_amx_int8() {
  return false;
}
Isa detect() {
  return Isa::scalar;
}
bool detect_avx_vnni() {
  return false;
}

#endif

}  // namespace

Isa detect_isa() {
  static const Isa best = detect();
  return best;
}

bool has_amx_int8() {
  static const bool yes = detect_isa() == Isa::amx && detect_amx_int8();
  return yes;
}

bool has_avx_vnni() {
  static const bool yes = detect_isa() >= Isa::avx2 && detect_avx_vnni();
  return yes;
}

}  // namespace edgellm::kernels
