/* cpu/iq_grid_x86.h - one IQ2_XXS or IQ3_XXS sub-block's codebook levels in a 256-bit register:
 * shared by the AVX2/AVX-512 kernels (simd_x86.h) and the AMX tiles' packing (matmul_amx.c). */
#ifndef RM_IQ_GRID_X86_H
#define RM_IQ_GRID_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "iq_grids.h"
#include "types.h"

enum { IQ_GRID_2XXS, IQ_GRID_3XXS };

/* Sub-block j of an IQ2_XXS or IQ3_XXS super-block: its word of four 7-bit sign indices with the
 * 4-bit scale s on top (IQ2_XXS: after the sub-block's 4 index bytes; IQ3_XXS: after all the
 * indices). */
static inline uint32_t iq_grid_word(const uint8_t * qs, int j, const int kind) {
    uint32_t ss;
    memcpy(&ss, kind == IQ_GRID_2XXS ? qs + 8 * j + 4 : qs + RM_QK_K / 4 + 4 * j, 4);
    return ss;
}

/* Sub-block j's codebook magnitudes (unsigned), each entry loaded straight into its place. */
static inline __attribute__((always_inline)) __m256i iq_grid_mag(const uint8_t * qs, int j, const int kind) {
    const uint8_t * q = qs + 8 * j;
    if (kind == IQ_GRID_2XXS) {   /* 4 index bytes */
        const __m128i g01 = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *) rm_iq2xxs_grid[q[0]])),
                                                          (const double *) rm_iq2xxs_grid[q[1]]));
        const __m128i g23 = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *) rm_iq2xxs_grid[q[2]])),
                                                          (const double *) rm_iq2xxs_grid[q[3]]));
        return _mm256_inserti128_si256(_mm256_castsi128_si256(g01), g23, 1);
    }
    /* 8 index bytes */
    uint32_t g[8];
    for (int k = 0; k < 8; k++) memcpy(&g[k], rm_iq3xxs_grid[q[k]], 4);
    return _mm256_setr_epi32((int) g[0], (int) g[1], (int) g[2], (int) g[3], (int) g[4], (int) g[5], (int) g[6], (int) g[7]);
}

/* Signed 16-bit values m (one per 32-bit lane) in both halves of their lane: a lane broadcast
 * from there is a vector of int16 m, for vpmaddwd / vpdpwssd. */
static inline __m256i iq_both_halves16(__m256i m) {
    return _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(m, 16));
}

#ifdef __AVX512VL__
/* The AVX-512 set, a super-block at a time: from the eight sub-blocks' words (dwords of ss), each
 * sub-block's four sign bytes (rm_iq_ksigns' bytes: the 7-bit index with its parity on top) in
 * signs[j], and its multiplier 2s + 1 in both 16-bit halves of mul[j]. */
static inline __attribute__((always_inline)) void iq_grid_words(__m256i ss, uint32_t signs[8], uint32_t mul[8]) {
    /* the four 7-bit fields of each word, one a byte (0xca: the first operand selects the second
     * where set, the third elsewhere; the top bit of each byte cleared last) */
    const __m256i f01 = _mm256_ternarylogic_epi32(_mm256_set1_epi32(0x000000ff), ss, _mm256_slli_epi32(ss, 1), 0xca);
    const __m256i f23 = _mm256_ternarylogic_epi32(_mm256_set1_epi32(0x00ff0000), _mm256_slli_epi32(ss, 2), _mm256_slli_epi32(ss, 3), 0xca);
    const __m256i w = _mm256_and_si256(_mm256_ternarylogic_epi32(_mm256_set1_epi32(0x0000ffff), f01, f23, 0xca),
                                       _mm256_set1_epi32(0x7f7f7f7f));
    /* each byte's parity to its bit 0 (shifts by 4, 2, 1 stay within the low nibble's reach) */
    __m256i p = _mm256_xor_si256(w, _mm256_srli_epi32(w, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    /* w | (parity << 7) */
    const __m256i sb = _mm256_ternarylogic_epi32(w, _mm256_slli_epi32(p, 7), _mm256_set1_epi32((int) 0x80808080u), 0xf8);
    _mm256_storeu_si256((__m256i *) signs, sb);
    const __m256i m = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(ss, 28), 1), _mm256_set1_epi32(1));
    _mm256_storeu_si256((__m256i *) mul, iq_both_halves16(m));
}

/* The eight words of a super-block's qs (IQ2_XXS: the odd dwords of its 64 bytes; IQ3_XXS: the 32
 * bytes after the indices). */
static inline __attribute__((always_inline)) __m256i iq_grid_ss(const uint8_t * qs, const int kind) {
    if (kind == IQ_GRID_2XXS) {
        return _mm256_permutex2var_epi32(_mm256_loadu_si256((const __m256i *) qs), _mm256_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15),
                                         _mm256_loadu_si256((const __m256i *) (qs + 32)));
    }
    return _mm256_loadu_si256((const __m256i *) (qs + RM_QK_K / 4));
}

#endif

/* Sub-block j: its magnitudes, and each level's sign as +-1 bytes; *mul: 2s + 1. */
static inline __attribute__((always_inline)) __m256i iq_grid_sub(const uint8_t * qs, int j, __m256i * sgn, int * mul, const int kind) {
    const __m256i bits = _mm256_set1_epi64x((long long) 0x8040201008040201ULL), one = _mm256_set1_epi8(1);
    const uint32_t ss = iq_grid_word(qs, j, kind);
    const __m256i mag = iq_grid_mag(qs, j, kind);
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
