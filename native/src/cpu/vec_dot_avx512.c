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

/* Eight int32 sums of four products of signed bytes a[k] * b[k] (b in [-127, 127]). */
static inline __m256i dot_i8(__m256i a, __m256i b) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
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

static void vec_dot_q8_0(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q8_0 * b = w;
    const rm_block_q8_0 * a = x_q;
    const int64_t nb = n / RM_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i p0 = dot_i8(_mm256_loadu_si256((const __m256i *) b[i].qs), _mm256_loadu_si256((const __m256i *) a[i].qs));
        const __m256i p1 = dot_i8(_mm256_loadu_si256((const __m256i *) b[i + 1].qs), _mm256_loadu_si256((const __m256i *) a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i].d) * fp16(a[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i + 1].d) * fp16(a[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    if (i < nb) {
        const __m256i p = dot_i8(_mm256_loadu_si256((const __m256i *) b[i].qs), _mm256_loadu_si256((const __m256i *) a[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i].d) * fp16(a[i].d)), _mm256_cvtepi32_ps(p), acc0);
    }
    *out = hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* Q4_0 levels are unsigned 0..15 with an offset of 8: sum((q - 8) y) = sum(q y) - 8 sum(y), two
 * vpdpbusd with no sign juggling. */
static void vec_dot_q4_0(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q4_0 * b = w;
    const rm_block_q8_0 * a = x_q;
    const int64_t nb = n / RM_QK;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i y0 = _mm256_loadu_si256((const __m256i *) a[i].qs);
        const __m256i y1 = _mm256_loadu_si256((const __m256i *) a[i + 1].qs);
        const __m256i p0 = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles_lo_hi(b[i].qs), y0),
                                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, y0));
        const __m256i p1 = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles_lo_hi(b[i + 1].qs), y1),
                                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, y1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i].d) * fp16(a[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i + 1].d) * fp16(a[i + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    if (i < nb) {
        const __m256i y = _mm256_loadu_si256((const __m256i *) a[i].qs);
        const __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles_lo_hi(b[i].qs), y),
                                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, y));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(b[i].d) * fp16(a[i].d)), _mm256_cvtepi32_ps(p), acc0);
    }
    *out = hsum_ps(_mm256_add_ps(acc0, acc1));
}

const rm_cpu_kernels rm_cpu_kernels_avx512 = {
    .vec_dot = {
        [RM_TYPE_F32]  = vec_dot_f32,
        [RM_TYPE_F16]  = vec_dot_f16,
        [RM_TYPE_Q4_0] = vec_dot_q4_0,
        [RM_TYPE_Q8_0] = vec_dot_q8_0,
    },
};

#endif /* RM_X86 */
