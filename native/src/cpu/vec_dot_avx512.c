/* vec_dot_avx512.c - AVX-512 (F, BW, VL, DQ, VNNI) kernels.
 *
 * What this set adds to the AVX2 one: 16-wide float dots for F32 and F16 weights, with masked
 * loads for the tail, and vpdpbusd (VNNI), which multiplies unsigned by signed bytes and adds
 * groups of four straight into int32 lanes, for the 32-element blocks. The 32-element blocks stay
 * 256 bits wide: a block is 32 bytes, and pairing two blocks in one 512-bit register costs as many
 * shuffles as it saves. Types without a kernel here use the AVX2 one (dispatch.c falls through).
 * Same contracts and error budgets as vec_dot_avx2.c.
 */
#if defined(RM_X86)

#include <immintrin.h>

#include "dispatch.h"

static inline float fp16(rm_fp16 h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i nibbles_lo_hi(const uint8_t * qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *) qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}

static void vec_dot_f32(int64_t n, float * out, const void * w, const void * x_q) {
    const float * a = w;
    const float * x = x_q;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int k = 0; k < 4; k++) {
            acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * k), _mm512_loadu_ps(x + i + 16 * k), acc[k]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16) ((1u << (n - i)) - 1);
        acc[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, x + i), acc[0]);
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

static void vec_dot_f16(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_fp16 * a = w;
    const float * x = x_q;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int k = 0; k < 4; k++) {
            const __m512 wk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (a + i + 16 * k)));
            acc[k] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(x + i + 16 * k), acc[k]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16) ((1u << (n - i)) - 1);
        const __m512 wk = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i));
        acc[0] = _mm512_fmadd_ps(wk, _mm512_maskz_loadu_ps(m, x + i), acc[0]);
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/* The 32-element kernels, written once for nc tokens (1 or 4) as in vec_dot_avx2.c: a weight
 * block is unpacked once for all tokens, and each token's result is bit for bit the one-token
 * kernel's. */
#define RM_INLINE static inline __attribute__((always_inline))

/* Q8_0: signed levels; the product goes through |w| and the sign moved onto x. */
RM_INLINE void block_q8_0(const void * w, int64_t i, const rm_block_q8_0 * x, __m256 * acc, __m256i * aw, __m256i * sw,
                          float * dw, int first) {
    if (first) {
        const rm_block_q8_0 * b = (const rm_block_q8_0 *) w + i;
        *sw = _mm256_loadu_si256((const __m256i *) b->qs);
        *aw = _mm256_sign_epi8(*sw, *sw);
        *dw = fp16(b->d);
    }
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), *aw,
                                          _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) x->qs), *sw));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(*dw * fp16(x->d)), _mm256_cvtepi32_ps(p), *acc);
}

/* Q4_0: unsigned levels 0..15 with an offset of 8: sum((q - 8) x) = sum(q x) - 8 sum(x), two
 * vpdpbusd with no sign juggling. */
RM_INLINE void block_q4_0(const void * w, int64_t i, const rm_block_q8_0 * x, __m256 * acc, __m256i * q, __m256i * unused,
                          float * dw, int first) {
    (void) unused;
    if (first) {
        const rm_block_q4_0 * b = (const rm_block_q4_0 *) w + i;
        *q = nibbles_lo_hi(b->qs);
        *dw = fp16(b->d);
    }
    const __m256i y = _mm256_loadu_si256((const __m256i *) x->qs);
    const __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), *q, y),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), y));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(*dw * fp16(x->d)), _mm256_cvtepi32_ps(p), *acc);
}

typedef void (*block_fn)(const void *, int64_t, const rm_block_q8_0 *, __m256 *, __m256i *, __m256i *, float *, int);

/* out[c] = dot(w, token c), tokens x_stride bytes apart; even and odd blocks in two chains. */
RM_INLINE void dot_32_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                            block_fn block) {
    const int64_t nb = n / RM_QK;
    __m256 acc0[4], acc1[4];
    for (int c = 0; c < nc; c++) {
        acc0[c] = _mm256_setzero_ps();
        acc1[c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i += 2) {
        __m256i u0, v0, u1, v1;
        float d0, d1;
        const int two = i + 1 < nb;
        for (int c = 0; c < nc; c++) {
            const rm_block_q8_0 * x = (const rm_block_q8_0 *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
            block(w, i, x, &acc0[c], &u0, &v0, &d0, c == 0);
            if (two) {
                block(w, i + 1, x + 1, &acc1[c], &u1, &v1, &d1, c == 0);
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(_mm256_add_ps(acc0[c], acc1[c]));
    }
}

static void vec_dot_q8_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, block_q8_0);
}

static void vec_dot_q8_0_x4(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride) {
    dot_32_multi(n, out, w, x_q, x_stride, 4, block_q8_0);
}

static void vec_dot_q4_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, block_q4_0);
}

static void vec_dot_q4_0_x4(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride) {
    dot_32_multi(n, out, w, x_q, x_stride, 4, block_q4_0);
}

const rm_cpu_kernels rm_cpu_kernels_avx512 = {
    .vec_dot = {
        [RM_TYPE_F32]  = vec_dot_f32,
        [RM_TYPE_F16]  = vec_dot_f16,
        [RM_TYPE_Q4_0] = vec_dot_q4_0,
        [RM_TYPE_Q8_0] = vec_dot_q8_0,
    },
    .vec_dot_x4 = {
        [RM_TYPE_Q4_0] = vec_dot_q4_0_x4,
        [RM_TYPE_Q8_0] = vec_dot_q8_0_x4,
    },
};

#endif /* RM_X86 */
