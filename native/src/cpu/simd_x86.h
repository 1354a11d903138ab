/* simd_x86.h - internal: helpers and kernels shared by the AVX2 and AVX-512 kernel files.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c, so each instruction set compiles them with its
 * own flags. The K-quant kernels add their int16 pair products, weighted by the sub-block scales,
 * into int32 lanes with RM_KQ_ACC(acc, p, s), which the including file defines: vpmaddwd and an
 * add with AVX2, one vpdpwssd with AVX-512 VNNI. */
#ifndef RM_CPU_SIMD_X86_H
#define RM_CPU_SIMD_X86_H

#include <immintrin.h>

#include "dispatch.h"
#include "kscales.h"

#ifndef RM_KQ_ACC
#error "define RM_KQ_ACC(acc, p, s) before including simd_x86.h"
#endif

#define RM_INLINE static inline __attribute__((always_inline))

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum_epi32_128(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

static inline int32_t hsum_epi32(__m256i v) {
    return hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

static inline float fp16(rm_fp16 h) { return _cvtsh_ss(h); }

/* The 32 nibbles of a 16-byte run as bytes: low nibbles first, then high ones (Q4_0's order). */
static inline __m256i nibbles_lo_hi(const uint8_t * qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *) qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}

/* int16 lanes 0-7 = s[j], lanes 8-15 = s[j + 1]: the scales of two 16-element sub-blocks that
 * one 32-byte vector of levels spans. */
static inline __m256i scale_pair(const int16_t * s, int j) {
    return _mm256_set_m128i(_mm_set1_epi16(s[j + 1]), _mm_set1_epi16(s[j]));
}

/* sum_j s[j] * bsums[j] over the 16 sub-blocks of 16, as int32. */
static inline int32_t bsums_dot16(const int16_t bsums[16], const int16_t s[16]) {
    const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) bsums), _mm256_loadu_si256((const __m256i *) s));
    return hsum_epi32(p);
}

/* ---------------------------------------------------------------------------------------------
 * K-quants written once for nc tokens (1 or 4): a super-block's levels and scales are unpacked
 * once for all tokens, and each token's result is bit for bit the one-token kernel's.
 * ------------------------------------------------------------------------------------------- */

/* Q4_K for nc tokens (1 or 4): the nibbles and scales of a super-block are unpacked once. */
RM_INLINE void dot_q4_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    const rm_block_q4_K * b = w;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
    float acc_m[4];
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm256_setzero_ps();
        acc_m[c] = 0.0f;
    }
    for (int64_t i = 0; i < n / RM_QK_K; i++) {
        uint8_t sc[8], mn[8];
        rm_unpack_scales_k4(b[i].scales, sc, mn);
        const rm_block_q8_K * a[4];
        __m256i sumi[4];
        for (int c = 0; c < nc; c++) {
            a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
            sumi[c] = _mm256_setzero_si256();
        }
        for (int p = 0; p < 4; p++) {  /* 32 bytes: sub-block 2p in the low nibbles, 2p + 1 in the high */
            const __m256i q = _mm256_loadu_si256((const __m256i *) (b[i].qs + 32 * p));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i s0 = _mm256_set1_epi16(sc[2 * p]), s1 = _mm256_set1_epi16(sc[2 * p + 1]);
            for (int c = 0; c < nc; c++) {
                const int8_t * y = a[c]->qs + 64 * p;
                const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *) y));
                const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *) (y + 32)));
                sumi[c] = RM_KQ_ACC(sumi[c], p0, s0);
                sumi[c] = RM_KQ_ACC(sumi[c], p1, s1);
            }
        }
        const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *) mn));
        const float dw = fp16(b[i].d), dmw = fp16(b[i].dmin);
        for (int c = 0; c < nc; c++) {
            /* mins: sum_j mn[j] * (bsums[2j] + bsums[2j + 1]) */
            const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *) a[c]->bsums),
                                              _mm_loadu_si128((const __m128i *) (a[c]->bsums + 8)));
            const int32_t summ = hsum_epi32_128(_mm_madd_epi16(bs, mins));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(a[c]->d * dw), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            acc_m[c] += a[c]->d * dmw * (float) summ;
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]) - acc_m[c];
    }
}

/* Q6_K for nc tokens (1 or 4): the levels of a super-block are unpacked once. */
RM_INLINE void dot_q6_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    const rm_block_q6_K * b = w;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2h = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n / RM_QK_K; i++) {
        int16_t sc[16];
        for (int j = 0; j < 16; j++) {
            sc[j] = b[i].scales[j];
        }
        const rm_block_q8_K * a[4];
        __m256i sumi[4];
        for (int c = 0; c < nc; c++) {
            a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
            sumi[c] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *) (b[i].ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *) (b[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *) (b[i].qh + 32 * h));
            /* levels + 32 in 0..63 of elements 128h + 32g + l: 4 low bits, then 2 from qh bits 2g */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2h));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2h));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2h));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2h));
            for (int g = 0; g < 4; g++) {
                const __m256i s = scale_pair(sc, 8 * h + 2 * g);
                for (int c = 0; c < nc; c++) {
                    const __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *) (a[c]->qs + 128 * h + 32 * g)));
                    sumi[c] = RM_KQ_ACC(sumi[c], p, s);
                }
            }
        }
        const float dw = fp16(b[i].d);
        for (int c = 0; c < nc; c++) {
            const int32_t offset = 32 * bsums_dot16(a[c]->bsums, sc);
            const __m256i t = _mm256_sub_epi32(sumi[c], _mm256_setr_epi32(offset, 0, 0, 0, 0, 0, 0, 0));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(a[c]->d * dw), _mm256_cvtepi32_ps(t), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

#endif
