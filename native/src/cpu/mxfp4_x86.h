/* mxfp4_x86.h - internal: MXFP4 weights against Q8_0 activations, for the AVX2 and AVX-512 sets.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c after simd_x86.h, so each set compiles it with
 * its own flags; with AVX-512 VNNI (RM_KQ_512) a block's byte products go into int32 lanes in one
 * vpdpbusd, with AVX2 in vpmaddubsw and vpmaddwd. A block's 32 nibbles become their doubled E2M1
 * levels (-12..12) in one byte shuffle of rm_mxfp4_values; the integer dot is exact, the block
 * then takes d_w d_x as the reference does, so results differ from rm_mxfp4_vec_dot only in the
 * order of the float sums (tests/test_kernels.py states the budget). Every token of a call keeps
 * the one-token kernel's accumulators and order: batched results equal single ones bit for bit. */
#ifndef RM_CPU_MXFP4_X86_H
#define RM_CPU_MXFP4_X86_H

/* Block i's 32 signed levels and its scale d (half the E8M0 scale). */
RM_INLINE __m256i levels_mxfp4(const void * w, int64_t i, float * d) {
    const rm_block_mxfp4 * b = (const rm_block_mxfp4 *) w + i;
    *d = rm_e8m0_to_fp32_half(b->e);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) rm_mxfp4_values));
    return _mm256_shuffle_epi8(table, nibbles_lo_hi(b->qs));
}

/* The eight int32 lanes of w . x for one block: |w| times x with w's signs. */
RM_INLINE __m256i mxfp4_block_lanes(__m256i q, const rm_block_q8_0 * x) {
    const __m256i aq = _mm256_sign_epi8(q, q);
    const __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) x->qs), q);
#ifdef RM_KQ_512
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, sx);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sx), _mm256_set1_epi16(1));
#endif
}

/* out[c] = dot(w, token c) for nc tokens (1 to 4), tokens x_stride bytes apart; even and odd
 * blocks in two chains. The activation scales come from x_info when given (the same floats). */
RM_INLINE void dot_mxfp4_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                               const float * x_info, int64_t x_info_stride) {
    const int64_t nb = n / RM_QK;
    __m256 acc[2][4];
    for (int c = 0; c < nc; c++) {
        acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        float dw;
        const __m256i q = levels_mxfp4(w, i, &dw);
        for (int c = 0; c < nc; c++) {
            const rm_block_q8_0 * x = (const rm_block_q8_0 *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
            const float dx = x_info ? x_info[c * x_info_stride + i] : fp16(x->d);
            const __m256 s = _mm256_cvtepi32_ps(mxfp4_block_lanes(q, x));
            acc[i & 1][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), s, acc[i & 1][c]);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(_mm256_add_ps(acc[0][c], acc[1][c]));
    }
}

static void vec_dot_mxfp4(int64_t n, float * out, const void * w, const void * x_q) {
    dot_mxfp4_multi(n, out, w, x_q, 0, 1, NULL, 0);
}

/* 1 to 8 tokens: groups of four (more would spill the sixteen AVX2 registers), then the rest. */
static void vec_dot_mxfp4_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                                const float * x_info, int64_t x_info_stride) {
    for (int c0 = 0; c0 < nc; c0 += 4) {
        const int m = nc - c0 < 4 ? nc - c0 : 4;
        const void * xc = (const uint8_t *) x_q + (uint64_t) c0 * x_stride;
        const float * ic = x_info ? x_info + c0 * x_info_stride : NULL;
        if (m == 4) {
            dot_mxfp4_multi(n, out + c0, w, xc, x_stride, 4, ic, x_info_stride);
        } else {
            for (int c = 0; c < m; c++) {
                dot_mxfp4_multi(n, out + c0 + c, w, (const uint8_t *) xc + (uint64_t) c * x_stride, x_stride, 1,
                                ic ? ic + c * x_info_stride : NULL, x_info_stride);
            }
        }
    }
}

#endif
