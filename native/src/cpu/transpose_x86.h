/* transpose_x86.h - internal: transposes of dwords in registers (8 x 8 in AVX2 ones, 16 x 16 in
 * AVX-512 ones), for the tile forms that lay out rows or tokens side by side (matmul_amx.c,
 * kq_rows_x86.h). */
#ifndef RM_CPU_TRANSPOSE_X86_H
#define RM_CPU_TRANSPOSE_X86_H

#include <immintrin.h>

/* r[j] := dword j of the eight r[c]: pairs, then quads within 128-bit lanes, then the lanes. */
static inline __attribute__((always_inline)) void transpose8_epi32(__m256i r[8]) {
    __m256i a[8], b[8];
    for (int k = 0; k < 8; k += 2) {
        a[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        a[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int g = 0; g < 2; g++) {   /* rows 4g..4g+3: b[4g + q] lane L holds their dword 4L + q */
        b[4 * g + 0] = _mm256_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 1] = _mm256_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 2] = _mm256_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        b[4 * g + 3] = _mm256_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int q = 0; q < 4; q++) {   /* lane L of b[4g + q] to lane g of r[4L + q] */
        r[q] = _mm256_permute2x128_si256(b[q], b[4 + q], 0x20);
        r[4 + q] = _mm256_permute2x128_si256(b[q], b[4 + q], 0x31);
    }
}

#if defined(__AVX512F__)
/* r[j] := dword j of the sixteen r[c] (a 16 x 16 transpose of dwords): pairs, then quads within
 * 128-bit lanes, then the lanes. */
static inline __attribute__((always_inline)) void transpose16_epi32(__m512i r[16]) {
    __m512i a[16], b[16];
    for (int k = 0; k < 16; k += 2) {
        a[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        a[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int g = 0; g < 4; g++) {   /* rows 4g..4g+3: b[4g + q] lane L holds their dword 4L + q */
        b[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int q = 0; q < 4; q++) {   /* lane L of b[4g + q] to lane g of r[4L + q] */
        const __m512i y0 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0x44), y1 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0xee);
        const __m512i y2 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0x44), y3 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0xee);
        r[q] = _mm512_shuffle_i32x4(y0, y2, 0x88);
        r[4 + q] = _mm512_shuffle_i32x4(y0, y2, 0xdd);
        r[8 + q] = _mm512_shuffle_i32x4(y1, y3, 0x88);
        r[12 + q] = _mm512_shuffle_i32x4(y1, y3, 0xdd);
    }
}

#endif

#endif
