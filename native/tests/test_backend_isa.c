/* test_backend_isa.c - the kernel set chosen for a CPU (rm_isa_preferred, cpu/dispatch.c): the best
 * set by the CPU's flags, except on CPU families where a lower set was measured faster (none of the
 * CPUs measured so far). */
#include <stdio.h>

#include "cpu/dispatch.h"
#include "expect.h"

static void expect_choice(const char * vendor, uint32_t family, uint32_t model, rm_isa best, rm_isa want,
                          int has_why) {
    const char * why = (const char *) 1;
    const rm_isa got = rm_isa_preferred(vendor, family, model, best, &why);
    EXPECT(got == want && (why != NULL) == has_why, "%s family %#x model %#x, best %s: got %s (%s), want %s",
           vendor, family, model, rm_isa_name(best), rm_isa_name(got), why ? why : "no reason", rm_isa_name(want));
}

int main(void) {
    /* AMD Zen 4 (EPYC 9004, Ryzen 7000: family 19h, models 10h-1Fh, 60h-7Fh): avx512, measured
     * faster than avx2 since the tile forms (dispatch.c) */
    expect_choice("AuthenticAMD", 0x19, 0x11, RM_ISA_AVX512, RM_ISA_AVX512, 0);
    expect_choice("AuthenticAMD", 0x19, 0x61, RM_ISA_AVX512, RM_ISA_AVX512, 0);
    /* Zen 3 has no AVX-512: its best stays */
    expect_choice("AuthenticAMD", 0x19, 0x01, RM_ISA_AVX2, RM_ISA_AVX2, 0);
    /* Zen 5 (family 1Ah): full-width 512-bit units, avx512 */
    expect_choice("AuthenticAMD", 0x1a, 0x02, RM_ISA_AVX512, RM_ISA_AVX512, 0);
    /* Intel: the best by flags (Sapphire Rapids with AMX, Ice Lake with AVX-512, Alder Lake AVX2) */
    expect_choice("GenuineIntel", 0x6, 0x8f, RM_ISA_AMX, RM_ISA_AMX, 0);
    expect_choice("GenuineIntel", 0x6, 0x6a, RM_ISA_AVX512, RM_ISA_AVX512, 0);
    expect_choice("GenuineIntel", 0x6, 0x97, RM_ISA_AVX2, RM_ISA_AVX2, 0);
    expect_choice("", 0, 0, RM_ISA_SCALAR, RM_ISA_SCALAR, 0);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
