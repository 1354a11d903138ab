/* vec_dot_avx2.c - AVX2 + FMA + F16C kernels: dot products of one weight row with one row of
 * activations, and the activation quantizers.
 *
 * Every kernel computes what its reference twin in quants_ref.c computes. The integer parts are
 * exact; only the float summation order differs (lanes, then a horizontal sum), so results agree
 * with the reference to float rounding (tests/test_kernels.py states the budget). The
 * quantizers are byte-identical to the reference: they use the same float operations in the same
 * order, and convert to bytes the way the reference's casts do.
 *
 * Integer products use vpmaddubsw, which multiplies unsigned bytes by signed bytes into pairs of
 * int16 sums. The activations from our quantizers lie in [-127, 127], the unsigned weight levels
 * in [0, 63], so no pair sum comes near saturation; signed weights (Q8_0, Q4_0 less 8) go in as
 * their magnitude with their sign moved onto the activation. The helpers and the K-quant
 * kernels live in simd_x86.h, shared with the AVX-512 set.
 */
#if defined(RM_X86)

#include <immintrin.h>

/* pair products times scales, added into int32 lanes */
#define RM_KQ_ACC(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#include "simd_x86.h"
#include "gdn_x86.h"
#include "block32_x86.h"
#include "kq_rows_x86.h"

/* ---------------------------------------------------------------------------------------------
 * F32 and F16 weights against F32 activations (n is any positive count)
 * ------------------------------------------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float * out, const void * w, const void * x_q) {
    const float * a = w;
    const float * x = x_q;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; k++) {
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc[0]);
    }
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) {
        sum += a[i] * x[i];
    }
    *out = sum;
}

static void vec_dot_f16(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_fp16 * a = w;
    const float * x = x_q;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; k++) {
            const __m256 wk = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (a + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x + i + 8 * k), acc[k]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (a + i))), _mm256_loadu_ps(x + i), acc[0]);
    }
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) {
        sum += fp16(a[i]) * x[i];
    }
    *out = sum;
}

static void axpy(int64_t n, float a, const float * x, float * y) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* ---------------------------------------------------------------------------------------------
 * 32-element blocks against Q8_0
 * ------------------------------------------------------------------------------------------- */

/* The 32-element kernels below are written once for nc tokens (1 or 4) and instantiated for
 * both: with four tokens each weight block is unpacked and its scale converted once, and every
 * token keeps the accumulators and order of the one-token kernel, so results are identical bit
 * for bit whichever way a token is computed. The float steps are the AVX-512 set's (and so its
 * floats): blocks in groups of eight, block k of a group in lane k, its exact integer dot
 * (block_sums8 of the eight blocks' lanes) times d_w d_x added by one multiply-add; the blocks
 * past the last group one by one, lane by lane. The tile form below repeats them. */

/* Lanes of one block's integer dot: |w| . (x with w's signs), in int16 pairs then int32 lanes. */
RM_INLINE __m256i block_dot_s8(__m256i w, __m256i aw, const rm_block_q8_0 * x) {
    const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) x->qs), w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Signed levels of block i: Q8_0 as stored, Q4_0 as its nibbles less 8. */
RM_INLINE __m256i levels_q8_0(const void * w, int64_t i) {
    return _mm256_loadu_si256((const __m256i *) ((const rm_block_q8_0 *) w + i)->qs);
}

RM_INLINE __m256i levels_q4_0(const void * w, int64_t i) {
    return _mm256_sub_epi8(nibbles_lo_hi(((const rm_block_q4_0 *) w + i)->qs), _mm256_set1_epi8(8));
}

/* out[c] = dot(w, token c), tokens x_stride bytes apart. The activation scales come from x_info
 * when given (the same floats, converted once). */
RM_INLINE void dot_32_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                            const float * x_info, int64_t x_info_stride, __m256i (*levels)(const void *, int64_t)) {
    const int64_t nb = n / RM_QK;
    const size_t wblock = levels == levels_q8_0 ? sizeof(rm_block_q8_0) : sizeof(rm_block_q4_0);
    /* with the activations' level sums (x_info), Q4_0 skips the signs: 3 of a block's 10 operations */
    const int nibbles_way = x_info && levels == levels_q4_0;
    const uint8_t * wb = w;
    const rm_block_q8_0 * x[RM_MULTI_MAX];
    __m256 acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        x[c] = (const rm_block_q8_0 *) ((const uint8_t *) x_q + (uint64_t) c * x_stride);
        acc[c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        if (nc == 1) {
            rm_stream_ahead(wb + (uint64_t) i * wblock, (int) (8 * wblock));
        }
        const __m256 dw = scales8(wb + (uint64_t) i * wblock, wblock);   /* d is each block's first field */
        __m256i q[8], aq[8];
        for (int k = 0; k < 8; k++) {
            if (nibbles_way) {   /* Q4_0's nibbles as they are */
                q[k] = aq[k] = nibbles_lo_hi(((const rm_block_q4_0 *) w + i + k)->qs);
            } else {
                q[k] = levels(w, i + k);
                aq[k] = _mm256_sign_epi8(q[k], q[k]);
            }
        }
        for (int c = 0; c < nc; c++) {
            __m256i p[8];
            for (int k = 0; k < 8; k++) {
                p[k] = nibbles_way ? _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *) x[c][i + k].qs)),
                                                       _mm256_set1_epi16(1))
                                   : block_dot_s8(q[k], aq[k], x[c] + i + k);
            }
            __m256 sums = _mm256_cvtepi32_ps(block_sums8(p));
            if (nibbles_way) {   /* less 8 sum(x): small integers, exact in float, the value the signed way gives */
                sums = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), _mm256_loadu_ps(x_info + c * x_info_stride + nb + i), sums);
            }
            const __m256 dx = x_info ? _mm256_loadu_ps(x_info + c * x_info_stride + i)
                                     : scales8((const uint8_t *) (x[c] + i), sizeof(rm_block_q8_0));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), sums, acc[c]);
        }
    }
    for (; i < nb; i++) {  /* the last few blocks, one by one */
        const __m256i q = levels(w, i), aq = _mm256_sign_epi8(q, q);
        rm_fp16 h;
        memcpy(&h, wb + (uint64_t) i * wblock, 2);
        const float dw = fp16(h);
        for (int c = 0; c < nc; c++) {
            const float dx = x_info ? x_info[c * x_info_stride + i] : fp16(x[c][i].d);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(block_dot_s8(q, aq, x[c] + i)), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

static void vec_dot_q8_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, NULL, 0, levels_q8_0);
}

static void vec_dot_q4_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, NULL, 0, levels_q4_0);
}

static void vec_dot_q8_0_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                               const float * x_info, int64_t x_info_stride) {
    if (nc == 8) {  /* with 16 registers, eight tokens would spill: two calls of four */
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, levels_q8_0);
        dot_32_multi(n, out + 4, w, (const uint8_t *) x_q + 4 * x_stride, x_stride, 4,
                     x_info ? x_info + 4 * x_info_stride : NULL, x_info_stride, levels_q8_0);
    } else if (nc == 4) {
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, levels_q8_0);
    } else {  /* one to three tokens, one at a time */
        for (int c = 0; c < nc; c++) {
            dot_32_multi(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1,
                         x_info ? x_info + c * x_info_stride : NULL, x_info_stride, levels_q8_0);
        }
    }
}

static void vec_dot_q4_0_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                               const float * x_info, int64_t x_info_stride) {
    if (nc == 8) {  /* with 16 registers, eight tokens would spill: two calls of four */
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, levels_q4_0);
        dot_32_multi(n, out + 4, w, (const uint8_t *) x_q + 4 * x_stride, x_stride, 4,
                     x_info ? x_info + 4 * x_info_stride : NULL, x_info_stride, levels_q4_0);
    } else if (nc == 4) {
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, levels_q4_0);
    } else {  /* one to three tokens, one at a time */
        for (int c = 0; c < nc; c++) {
            dot_32_multi(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1,
                         x_info ? x_info + c * x_info_stride : NULL, x_info_stride, levels_q4_0);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Activation quantizers, byte-identical to rm_q8_0_from_float and rm_q8_K_from_float
 * ------------------------------------------------------------------------------------------- */

/* max(|v|, m) per lane; a nan |v| leaves m, as the reference's `m < |v| ? |v| : m` does. */
static inline __m256 max_abs(__m256 v, __m256 m) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), m);
}

/* roundf: ties away from zero. The fraction v - trunc(v) is exact, so the test is too. */
static inline __m256 round_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
    return _mm256_add_ps(t, step);
}

/* The low bytes of 32 int32 (a C cast to int8_t of each), in order. */
static inline __m256i low_bytes(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i ff = _mm256_set1_epi32(0xff);
    const __m256i s01 = _mm256_packus_epi32(_mm256_and_si256(i0, ff), _mm256_and_si256(i1, ff));
    const __m256i s23 = _mm256_packus_epi32(_mm256_and_si256(i2, ff), _mm256_and_si256(i3, ff));
    /* the packs work within 128-bit halves: undo the interleave of 4-byte groups */
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(s01, s23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quantize_q8_0(const float * x, void * dst, int64_t n) {
    rm_block_q8_0 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; i++, x += RM_QK) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            amax = max_abs(v[k], amax);
        }
        const float d = hmax_ps(amax) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = rm_fp32_to_fp16(d);
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            /* out of range or nan, vcvttps2dq gives INT32_MIN, as the reference's trunc_int does */
            q[k] = _mm256_cvttps_epi32(round_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id))));
        }
        _mm256_storeu_si256((__m256i *) y[i].qs, low_bytes(q[0], q[1], q[2], q[3]));
    }
}

static void quantize_q8_K(const float * x, void * dst, int64_t n) {
    rm_block_q8_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; i++, x += RM_QK_K) {
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) {
            amax = max_abs(_mm256_loadu_ps(x + 8 * k), amax);
        }
        const float am = hmax_ps(amax);
        memset(&y[i], 0, sizeof(y[i]));
        if (!am) {
            continue;
        }
        /* the first element of that magnitude gives the sign */
        float max = 0;
        for (int k = 0; k < 32; k++) {
            const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + 8 * k));
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(am), _CMP_EQ_OQ));
            if (hit) {
                max = x[8 * k + __builtin_ctz((unsigned) hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        for (int k = 0; k < 8; k++) {
            __m256i q[4];
            for (int c = 0; c < 4; c++) {
                /* nearest_int: the integer sits in the low mantissa bits of v + 1.5 * 2^23 */
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * k + 8 * c)), magic);
                const __m256i r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(0x007fffff)),
                                                   _mm256_set1_epi32(0x00400000));
                q[c] = _mm256_min_epi32(r, _mm256_set1_epi32(127));
            }
            const __m256i bytes = low_bytes(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *) (y[i].qs + 32 * k), bytes);
            /* bsums of the two 16-byte halves */
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes), _mm256_set1_epi16(1));
            y[i].bsums[2 * k] = (int16_t) hsum_epi32_128(_mm256_castsi256_si128(s4));
            y[i].bsums[2 * k + 1] = (int16_t) hsum_epi32_128(_mm256_extracti128_si256(s4, 1));
        }
        y[i].d = 1 / iscale;
    }
}

/* F16 to float eight at a time: vcvtph2ps converts exactly, as rm_fp16_to_fp32 does (but for a
 * signaling NaN, which comes out quiet; rm_fp32_to_fp16 writes quiet ones only). */
static void f16_to_float(const void * src, float * dst, int64_t n) {
    const rm_fp16 * h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i))));
    }
    for (; i < n; i++) {
        dst[i] = rm_fp16_to_fp32(h[i]);
    }
}

/* IQ4_NL rows as floats (a KV cache of that type): each nibble's level by a table shuffle, made a
 * float and times the block's scale, the reference's one multiply: its floats. */
static void iq4_nl_to_float(const void * src, float * dst, int64_t n) {
    const rm_block_iq4_nl * b = src;
    const __m128i table = _mm_loadu_si128((const __m128i *) rm_iq4nl_values), m4 = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / RM_QK; ++i, dst += RM_QK) {
        const __m256 d = _mm256_set1_ps(rm_fp16_to_fp32(b[i].d));
        const __m128i qs = _mm_loadu_si128((const __m128i *) b[i].qs);
        const __m128i lv[2] = {_mm_shuffle_epi8(table, _mm_and_si128(qs, m4)),                       /* elements 0..15 */
                               _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), m4))};   /* 16..31 */
        for (int h = 0; h < 2; h++) {
            const __m256i a = _mm256_cvtepi8_epi32(lv[h]), c = _mm256_cvtepi8_epi32(_mm_srli_si128(lv[h], 8));
            _mm256_storeu_ps(dst + 16 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(a)));
            _mm256_storeu_ps(dst + 16 * h + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(c)));
        }
    }
}

/* ---- Q4_0 and MXFP4 rows stored in groups from load (block32_x86.h's layout) ----------------
 *
 * The one-token kernel on stored rows: a group's levels (Q4_0's nibbles, MXFP4's table levels
 * plus 12) come out of a shift, two masks (and for MXFP4 two table shuffles) per 64, and the eight
 * blocks' integer dots out of vpmaddubsw on T_j against the tokens' transposed activations
 * (grouped_transpose_act), four T_j's pairs added in int16 (at most 4 x 2 x 24 x 127) before one
 * vpmaddwd: no horizontal adds. The integers are those of the file layout's kernels (dot_32_multi's
 * and dot_b32's offset ways), the float steps their operations in their order, and MXFP4's blocks
 * past the last group dot_b32's own (read from the stored row, which keeps them as the file does):
 * the file layout's floats bit for bit. Many tokens take the tiles (kq_rows_x86.h), which read the
 * stored groups too; there is no packed prefill form in this set. */
RM_INLINE void dot_stored_nc(int64_t n, float * out, const void * stored, const void * x_t, uint64_t xt_stride,
                             const int nc, const float * x_info, int64_t x_info_stride, const int mxfp4) {
    const int64_t nb = n / RM_QK;
    const size_t gbytes = 8 * (mxfp4 ? sizeof(rm_block_mxfp4) : sizeof(rm_block_q4_0)), sbytes = mxfp4 ? 8 : 16;
    const float offset = mxfp4 ? b32_offset_of(B32_MXFP4) : 8.0f;
    const uint8_t * g = stored;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(   /* MXFP4's levels plus 12, by index */
        _mm_add_epi8(_mm_loadu_si128((const __m128i *) rm_mxfp4_values), _mm_set1_epi8(12)));
    __m256 acc[4];
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, g += gbytes) {
        if (nc == 1) {
            rm_stream_ahead(g, (int) gbytes);
        }
        const __m256 dw = mxfp4 ? e8m0_half8(g, 1) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) g));
        __m256i t[8];
        for (int m = 0; m < 4; m++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *) (g + sbytes + 32 * m));
            t[2 * m] = _mm256_and_si256(v, m4);
            t[2 * m + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (mxfp4) {
                t[2 * m] = _mm256_shuffle_epi8(table, t[2 * m]);
                t[2 * m + 1] = _mm256_shuffle_epi8(table, t[2 * m + 1]);
            }
        }
        const uint8_t * xg = (const uint8_t *) x_t + (uint64_t) (i / 8) * 256;
        for (int c = 0; c < nc; c++) {
            const uint8_t * xc = xg + (uint64_t) c * xt_stride;
            __m256i s = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) {
                __m256i p = _mm256_maddubs_epi16(t[4 * h], _mm256_loadu_si256((const __m256i *) (xc + 128 * h)));
                for (int j = 1; j < 4; j++) {
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(t[4 * h + j],
                                                                 _mm256_loadu_si256((const __m256i *) (xc + 128 * h + 32 * j))));
                }
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
            }
            const float * xi = x_info + c * x_info_stride;
            const __m256 sums = _mm256_fnmadd_ps(_mm256_set1_ps(offset), _mm256_loadu_ps(xi + nb + i), _mm256_cvtepi32_ps(s));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(xi + i)), sums, acc[c]);
        }
    }
    const uint8_t * xt = (const uint8_t *) x_t + (uint64_t) (i / 8) * 256;
    for (; i < nb; i++, xt += 32) {   /* MXFP4's blocks past the groups, as dot_b32 takes them (Q4_0: none) */
        const __m256i q = b32_levels(stored, i, B32_MXFP4), aq = _mm256_sign_epi8(q, q);
        const float dw = b32_scale(stored, i, B32_MXFP4);
        for (int c = 0; c < nc; c++) {
            const __m256 s = _mm256_cvtepi32_ps(b32_block_dot(q, aq, (const int8_t *) (xt + (uint64_t) c * xt_stride), B32_MXFP4));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x_info[c * x_info_stride + i]), s, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

/* four tokens, then one at a time, as the file layout's kernels take them */
#define RM_STORED_KERNELS(type, mxfp4, bsize, scale_bytes)                                                          \
    static void dot_stored_##type(int64_t n, int nc, float * out, const void * stored, const void * x_t,           \
                                  uint64_t xt_stride, const float * x_info, int64_t x_info_stride) {               \
        for (int c = 0; c < nc;) {                                                                                 \
            const uint8_t * xc = (const uint8_t *) x_t + (uint64_t) c * xt_stride;                                 \
            if (nc - c >= 4) {                                                                                     \
                dot_stored_nc(n, out + c, stored, xc, xt_stride, 4, x_info + c * x_info_stride, x_info_stride, mxfp4); \
                c += 4;                                                                                            \
            } else {                                                                                               \
                dot_stored_nc(n, out + c, stored, xc, xt_stride, 1, x_info + c * x_info_stride, x_info_stride, mxfp4); \
                c += 1;                                                                                            \
            }                                                                                                      \
        }                                                                                                          \
    }                                                                                                              \
    static void repack_row_##type(int64_t n, const void * w, void * stored) {                                      \
        b32_repack_row(n, w, stored, bsize, scale_bytes);                                                          \
    }
RM_STORED_KERNELS(q4_0, 0, sizeof(rm_block_q4_0), 2)
RM_STORED_KERNELS(mxfp4, 1, sizeof(rm_block_mxfp4), 1)

/* the stored form alone (no packed prefill form: packed_bytes, pack_row, dot, unpack_stored);
 * stored_tail: Q4_0's rows of whole groups only, as in the AVX-512 set (its AMX tiles read them) */
static const rm_packed_kernels packed_q4_0 = {NULL, grouped_act_bytes, NULL, grouped_transpose_act, NULL,
                                              repack_row_q4_0, NULL, dot_stored_q4_0, 0, NULL, NULL};
static const rm_packed_kernels packed_mxfp4 = {NULL, grouped_act_bytes, NULL, grouped_transpose_act, NULL,
                                               repack_row_mxfp4, NULL, dot_stored_mxfp4, 1, NULL, NULL};

/* The K-quants' tile form (kq_rows_x86.h), from this many tokens on (tools/bench_kernels.py). */
RM_ROWS_KQ(q2_K, rm_block_q2_K, 1, 0, 6)
RM_ROWS_KQ(q3_K, rm_block_q3_K, 1, 4, 6)
RM_ROWS_KQ(q4_K, rm_block_q4_K, 0, 0, 6)
RM_ROWS_KQ(q5_K, rm_block_q5_K, 0, 0, 6)
RM_ROWS_KQ(q6_K, rm_block_q6_K, 1, 32, 6)
RM_ROWS_KQ(iq4_xs, rm_block_iq4_xs, 0, 128, 6)
RM_ROWS_KQ(iq2_xxs, rm_block_iq2_xxs, 0, 128, 2)
RM_ROWS_KQ(iq3_xxs, rm_block_iq3_xxs, 0, 128, 2)
RM_ROWS_32(q4_0, R32_Q4_0, 6)
RM_ROWS_32(q8_0, R32_Q8_0, 6)
RM_ROWS_32(q5_0, R32_Q5_0, 6)
RM_ROWS_32(iq4_nl, R32_IQ4_NL, 6)
RM_ROWS_32(mxfp4, R32_MXFP4, 6)

RM_KS16_PACKED

const rm_cpu_kernels rm_cpu_kernels_avx2 = {
    .vec_dot = {
        [RM_TYPE_F32]  = vec_dot_f32,
        [RM_TYPE_F16]  = vec_dot_f16,
        [RM_TYPE_Q4_0] = vec_dot_q4_0,
        [RM_TYPE_Q8_0] = vec_dot_q8_0,
        [RM_TYPE_Q2_K] = vec_dot_q2_K,
        [RM_TYPE_Q3_K] = vec_dot_q3_K,
        [RM_TYPE_Q4_K] = vec_dot_q4_K,
        [RM_TYPE_Q5_K] = vec_dot_q5_K,
        [RM_TYPE_Q6_K] = vec_dot_q6_K,
        [RM_TYPE_MXFP4] = vec_dot_mxfp4,
        [RM_TYPE_Q5_0] = vec_dot_q5_0,
        [RM_TYPE_Q4_1] = vec_dot_q4_1,
        [RM_TYPE_Q5_1] = vec_dot_q5_1,
        [RM_TYPE_IQ4_NL] = vec_dot_iq4_nl,
        [RM_TYPE_IQ4_XS] = vec_dot_iq4_xs,
        [RM_TYPE_IQ2_XXS] = vec_dot_iq2_xxs,
        [RM_TYPE_IQ3_XXS] = vec_dot_iq3_xxs,
    },
    .quantize = {
        [RM_TYPE_Q8_0] = quantize_q8_0,
        [RM_TYPE_Q8_K] = quantize_q8_K,
    },
    .dequantize = {
        [RM_TYPE_F16] = f16_to_float,
        [RM_TYPE_IQ4_NL] = iq4_nl_to_float,
    },
    .vec_dot_multi = {
        [RM_TYPE_Q4_0] = vec_dot_q4_0_multi,
        [RM_TYPE_Q8_0] = vec_dot_q8_0_multi,
        [RM_TYPE_Q2_K] = vec_dot_q2_K_multi,
        [RM_TYPE_Q3_K] = vec_dot_q3_K_multi,
        [RM_TYPE_Q4_K] = vec_dot_q4_K_multi,
        [RM_TYPE_Q5_K] = vec_dot_q5_K_multi,
        [RM_TYPE_Q6_K] = vec_dot_q6_K_multi,
        [RM_TYPE_IQ4_XS] = vec_dot_iq4_xs_multi,
        [RM_TYPE_IQ2_XXS] = vec_dot_iq2_xxs_multi,
        [RM_TYPE_IQ3_XXS] = vec_dot_iq3_xxs_multi,
        [RM_TYPE_MXFP4] = vec_dot_mxfp4_multi,
        [RM_TYPE_Q5_0] = vec_dot_q5_0_multi,
        [RM_TYPE_Q4_1] = vec_dot_q4_1_multi,
        [RM_TYPE_Q5_1] = vec_dot_q5_1_multi,
        [RM_TYPE_IQ4_NL] = vec_dot_iq4_nl_multi,
    },
    .axpy = axpy,
    .attn_scores = attn_scores,
    .attn_values = attn_values,
    .attn_scores_rows = attn_scores_rows,
    .attn_values_rows = attn_values_rows,
    .exp_sum = exp_sum_x86,
    .max_of = max_x86,
    .packed = {
        [RM_TYPE_Q4_K] = &packed_q4_K,
        [RM_TYPE_Q6_K] = &packed_q6_K,
        [RM_TYPE_Q4_0] = &packed_q4_0,
        [RM_TYPE_MXFP4] = &packed_mxfp4,
    },
    .tile = {
        [RM_TYPE_Q2_K] = &rows_q2_K,
        [RM_TYPE_Q3_K] = &rows_q3_K,
        [RM_TYPE_Q4_K] = &rows_q4_K,
        [RM_TYPE_Q5_K] = &rows_q5_K,
        [RM_TYPE_Q6_K] = &rows_q6_K,
        [RM_TYPE_IQ4_XS] = &rows_iq4_xs,
        [RM_TYPE_IQ2_XXS] = &rows_iq2_xxs,
        [RM_TYPE_IQ3_XXS] = &rows_iq3_xxs,
        [RM_TYPE_Q4_0] = &rows_q4_0,
        [RM_TYPE_Q8_0] = &rows_q8_0,
        [RM_TYPE_Q5_0] = &rows_q5_0,
        [RM_TYPE_IQ4_NL] = &rows_iq4_nl,
        [RM_TYPE_MXFP4] = &rows_mxfp4,
    },
    .gdn_rule = gdn_rule_x86,
    .gdn_conv = gdn_conv_x86,
    .streams = {
        [RM_TYPE_Q4_0] = 1, [RM_TYPE_Q8_0] = 1, [RM_TYPE_Q2_K] = 1, [RM_TYPE_Q3_K] = 1, [RM_TYPE_Q4_K] = 1,
        [RM_TYPE_Q5_K] = 1, [RM_TYPE_Q6_K] = 1, [RM_TYPE_MXFP4] = 1, [RM_TYPE_Q5_0] = 1, [RM_TYPE_Q4_1] = 1,
        [RM_TYPE_Q5_1] = 1, [RM_TYPE_IQ4_NL] = 1, [RM_TYPE_IQ4_XS] = 1, [RM_TYPE_IQ2_XXS] = 1, [RM_TYPE_IQ3_XXS] = 1,
    },
};

#endif /* RM_X86 */
