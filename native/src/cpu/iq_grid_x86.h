/* cpu/iq_grid_x86.h - one IQ2_XXS or IQ3_XXS sub-block's codebook levels in a 256-bit register:
 * shared by the AVX2/AVX-512 kernels (simd_x86.h) and the AMX tiles' packing (matmul_amx.c). */
#ifndef RM_IQ_GRID_X86_H
#define RM_IQ_GRID_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../iq_grids.h"
#include "../types.h"

enum { IQ_GRID_2XXS, IQ_GRID_3XXS };

/* Sub-block j of an IQ2_XXS or IQ3_XXS super-block: its codebook magnitudes (unsigned), each
 * entry loaded straight into its place in the vector, and *ss, the word of four 7-bit sign indices
 * with the 4-bit scale s on top. */
static inline __attribute__((always_inline)) __m256i iq_grid_mag(const uint8_t * qs, int j, uint32_t * ss, const int kind) {
    const uint8_t * q = qs + 8 * j;
    if (kind == IQ_GRID_2XXS) {   /* 4 index bytes, then the word */
        memcpy(ss, q + 4, 4);
        const __m128i g01 = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *) rm_iq2xxs_grid[q[0]])),
                                                          (const double *) rm_iq2xxs_grid[q[1]]));
        const __m128i g23 = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *) rm_iq2xxs_grid[q[2]])),
                                                          (const double *) rm_iq2xxs_grid[q[3]]));
        return _mm256_inserti128_si256(_mm256_castsi128_si256(g01), g23, 1);
    }
    /* 8 index bytes of qs; the words after all the indices */
    memcpy(ss, qs + RM_QK_K / 4 + 4 * j, 4);
    uint32_t g[8];
    for (int k = 0; k < 8; k++) memcpy(&g[k], rm_iq3xxs_grid[q[k]], 4);
    return _mm256_setr_epi32((int) g[0], (int) g[1], (int) g[2], (int) g[3], (int) g[4], (int) g[5], (int) g[6], (int) g[7]);
}

/* The signs of a sub-block as bits: bit 8k + l set where level l of entry group k (eight levels,
 * sign index k of the word) is negative. */
static inline uint32_t iq_grid_sign_bits(uint32_t ss) {
    return (uint32_t) rm_iq_ksigns[ss & 127] | (uint32_t) rm_iq_ksigns[(ss >> 7) & 127] << 8 |
           (uint32_t) rm_iq_ksigns[(ss >> 14) & 127] << 16 | (uint32_t) rm_iq_ksigns[(ss >> 21) & 127] << 24;
}

/* Sub-block j: its magnitudes, and each level's sign as +-1 bytes; *mul: 2s + 1. */
static inline __attribute__((always_inline)) __m256i iq_grid_sub(const uint8_t * qs, int j, __m256i * sgn, int * mul, const int kind) {
    const __m256i bits = _mm256_set1_epi64x((long long) 0x8040201008040201ULL), one = _mm256_set1_epi8(1);
    uint32_t ss;
    const __m256i mag = iq_grid_mag(qs, j, &ss, kind);
    const __m256i sb = _mm256_setr_epi64x(
        (long long) (rm_iq_ksigns[ss & 127] * 0x0101010101010101ULL),
        (long long) (rm_iq_ksigns[(ss >> 7) & 127] * 0x0101010101010101ULL),
        (long long) (rm_iq_ksigns[(ss >> 14) & 127] * 0x0101010101010101ULL),
        (long long) (rm_iq_ksigns[(ss >> 21) & 127] * 0x0101010101010101ULL));
    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(sb, bits), bits);   /* 0xff: this level is negative */
    *sgn = _mm256_or_si256(neg, one);
    *mul = (int) (2 * (ss >> 28) + 1);
    return mag;
}

#endif /* RM_IQ_GRID_X86_H */
