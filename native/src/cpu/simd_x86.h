/* simd_x86.h - internal: helpers and kernels shared by the AVX2 and AVX-512 kernel files.
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c, so each instruction set compiles them with its
 * own flags. The K-quant kernels add their int16 pair products, weighted by the sub-block scales,
 * into int32 lanes with RM_KQ_ACC(acc, p, s), which the including file defines: vpmaddwd and an
 * add with AVX2, one vpdpwssd with AVX-512 VNNI. */
#ifndef RM_CPU_SIMD_X86_H
#define RM_CPU_SIMD_X86_H

#include <immintrin.h>

#include "iq_grids.h"
#include "iq_grid_x86.h"
#include "transpose_x86.h"

#include "dispatch.h"
#include <math.h>
#include <stddef.h>
#include <string.h>

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

static inline float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
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

/* ---- attention (rm_attn_scores_fn, rm_attn_values_fn): 256-bit, d a multiple of 8 ----------- */

/* Eight vectors -> the vector of their eight sums. */
static inline __m256 sums8_ps(const __m256 a[8]) {
    const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/* Eight positions at a time: q is loaded once for all eight, and their eight sums come out of
 * one reduction. */
static inline void attn_scores_x86(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale,
                                   float * s) {
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) {
            acc[j] = _mm256_setzero_ps();
        }
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int j = 0; j < 8; j++) {
                acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (p + j) * stride + i), acc[j]);
            }
        }
        _mm256_storeu_ps(s + p, _mm256_mul_ps(_mm256_set1_ps(scale), sums8_ps(acc)));
    }
    for (; p < n; p++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i += 8) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + p * stride + i), acc);
        }
        s[p] = scale * hsum_ps(acc);
    }
}

/* Up to 64 output floats held in registers while every position passes. */
static inline void attn_values_x86(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                                   int accumulate) {
    for (int64_t i0 = 0; i0 < d; i0 += 64) {
        const int w = (int) ((d - i0 < 64 ? d - i0 : 64) / 8);
        __m256 acc[8];
        for (int j = 0; j < 8; j++) {
            acc[j] = accumulate && j < w ? _mm256_loadu_ps(out + i0 + 8 * j) : _mm256_setzero_ps();
        }
        if (w == 8) {
            for (int64_t p = 0; p < n; p++) {
                const __m256 sp = _mm256_set1_ps(s[p]);
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < 8; j++) {
                    acc[j] = _mm256_fmadd_ps(sp, _mm256_loadu_ps(vp + 8 * j), acc[j]);
                }
            }
        } else {
            for (int64_t p = 0; p < n; p++) {
                const __m256 sp = _mm256_set1_ps(s[p]);
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < w; j++) {
                    acc[j] = _mm256_fmadd_ps(sp, _mm256_loadu_ps(vp + 8 * j), acc[j]);
                }
            }
        }
        for (int j = 0; j < w; j++) {
            _mm256_storeu_ps(out + i0 + 8 * j, acc[j]);
        }
    }
}

/* exp(x) for x <= 0 in eight lanes, to about 2 ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 in two
 * parts), exp(r) by its Taylor polynomial to r^7, and 2^n put into the exponent bits. Below
 * -86 (about 4e-38, near the end of the normal floats) it gives 0; a NaN stays NaN. */
static inline __m256 exp_neg_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-86.0f);
    const __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);   /* NaN in x passes */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_andnot_ps(zero, y);
}

/* rm_exp_sum_fn: eight at a time (the tail through the same step, masked), the lanes' sums added
 * at the end. */
static float exp_sum_x86(float * x, int64_t n, float m) {
    const __m256 m8 = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_neg_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m8));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        float t[8];
        const int64_t k = n - i;
        for (int64_t j = 0; j < 8; j++) {
            t[j] = j < k ? x[i + j] - m : -INFINITY;
        }
        const __m256 e = exp_neg_ps(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        acc = _mm256_add_ps(acc, e);
        for (int64_t j = 0; j < k; j++) {
            x[i + j] = t[j];
        }
    }
    return hsum_ps(acc);
}

/* rm_max_fn: eight lanes at a time (vmaxps keeps its second operand where the first is a NaN),
 * the rest one by one. */
static float max_x86(const float * x, int64_t n, float m) {
    __m256 acc = _mm256_set1_ps(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++) {
        m = lanes[j] > m ? lanes[j] : m;
    }
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* The table entries (each kernel-set file has its own copy, built with its flags); a row length
 * that is not a multiple of 8 goes to the reference. */
static void attn_scores(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale, float * s) {
    if (d % 8) {
        rm_cpu_attn_scores_ref(d, n, q, k, stride, scale, s);
        return;
    }
    attn_scores_x86(d, n, q, k, stride, scale, s);
}

static void attn_values(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                        int accumulate) {
    if (d % 8) {
        rm_cpu_attn_values_ref(d, n, s, v, stride, out, accumulate);
        return;
    }
    attn_values_x86(d, n, s, v, stride, out, accumulate);
}

/* Several query rows at once (rm_attn_scores_rows_fn): four positions of up to three rows at a
 * time (RM_ATTN_ROWS_AT_ONCE, the rows ops.c passes together; twelve sums, the rows' three chunks
 * of query and a key in the sixteen registers), each key's 8 floats loaded once for all; a
 * position's four sums come out of the tree sums8_ps takes for it ((0+1)+(2+3)) + ((4+5)+(6+7))
 * of its lanes, and a partial last group is filled out with its first position's key: a score is
 * the same floats whatever n and the other rows. */
RM_INLINE void scores4_rows_x86(int64_t d, const int nr, const float * const q[], const float * const kp[4], float scale,
                                float * const s[3]) {
    __m256 acc[3][4];
    for (int r = 0; r < nr; r++) {
        for (int j = 0; j < 4; j++) {
            acc[r][j] = _mm256_setzero_ps();
        }
    }
    for (int64_t i = 0; i < d; i += 8) {
        __m256 qv[3];
        for (int r = 0; r < nr; r++) {
            qv[r] = _mm256_loadu_ps(q[r] + i);
        }
        for (int j = 0; j < 4; j++) {
            __m256 kv = _mm256_loadu_ps(kp[j] + i);
            __asm__("" : "+x"(kv));   /* loaded once for the rows, not folded into each */
            for (int r = 0; r < nr; r++) {
                acc[r][j] = _mm256_fmadd_ps(qv[r], kv, acc[r][j]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[r][0], acc[r][1]), _mm256_hadd_ps(acc[r][2], acc[r][3]));
        const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s[r], _mm_mul_ps(_mm_set1_ps(scale), sum));
    }
}

RM_INLINE void scores_rows_x86(int64_t d, int64_t n, const int nr, const float * const q[], const float * k,
                               int64_t stride, float scale, float * s, int64_t s_stride) {
    for (int64_t p = 0; p < n; p += 4) {
        const float * kp[4];
        float part[3][4];
        float * out[3];
        for (int j = 0; j < 4; j++) {
            kp[j] = k + (p + j < n ? p + j : p) * stride;
        }
        for (int r = 0; r < nr; r++) {
            out[r] = p + 4 <= n ? s + r * s_stride + p : part[r];
        }
        scores4_rows_x86(d, nr, q, kp, scale, out);
        for (int r = 0; p + 4 > n && r < nr; r++) {
            memcpy(s + r * s_stride + p, part[r], sizeof(float) * (size_t) (n - p));
        }
    }
}

static void attn_scores_rows(int64_t d, int64_t n, int nr, const float * const q[], const float * k, int64_t stride,
                             float scale, float * s, int64_t s_stride) {
    if (d % 8) {
        rm_cpu_attn_scores_rows_ref(d, n, nr, q, k, stride, scale, s, s_stride);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += 3) {   /* a copy per count, the row loops unrolled */
        switch (nr - r0 < 3 ? nr - r0 : 3) {
        case 3: scores_rows_x86(d, n, 3, q + r0, k, stride, scale, s + r0 * s_stride, s_stride); break;
        case 2: scores_rows_x86(d, n, 2, q + r0, k, stride, scale, s + r0 * s_stride, s_stride); break;
        default: scores_rows_x86(d, n, 1, q + r0, k, stride, scale, s + r0 * s_stride, s_stride); break;
        }
    }
}

/* Up to three output rows at a time, 32 floats each in registers while every position passes
 * (twelve sums, the rows' three weights and a value in the sixteen registers): each value's floats
 * loaded once for all the rows; each row's arithmetic is attn_values_x86's. */
RM_INLINE void values32_rows_x86(int64_t n, const int nr, const float * s, int64_t s_stride, const float * v,
                                 int64_t stride, float * const out[3], int64_t i0) {
    __m256 acc[3][4];
    for (int r = 0; r < nr; r++) {
        for (int j = 0; j < 4; j++) {
            acc[r][j] = _mm256_loadu_ps(out[r] + i0 + 8 * j);
        }
    }
    for (int64_t p = 0; p < n; p++) {
        __m256 sp[3];
        for (int r = 0; r < nr; r++) {
            sp[r] = _mm256_set1_ps(s[r * s_stride + p]);
        }
        const float * vp = v + p * stride + i0;
        for (int j = 0; j < 4; j++) {
            __m256 vv = _mm256_loadu_ps(vp + 8 * j);
            __asm__("" : "+x"(vv));   /* loaded once for the rows, not folded into each */
            for (int r = 0; r < nr; r++) {
                acc[r][j] = _mm256_fmadd_ps(sp[r], vv, acc[r][j]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int j = 0; j < 4; j++) {
            _mm256_storeu_ps(out[r] + i0 + 8 * j, acc[r][j]);
        }
    }
}

static void attn_values_rows(int64_t d, int64_t n, int nr, const float * s, int64_t s_stride, const float * v,
                             int64_t stride, float * const out[]) {
    if (d % 32) {
        for (int r = 0; r < nr; r++) {
            attn_values(d, n, s + r * s_stride, v, stride, out[r], 1);
        }
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += 3) {
        for (int64_t i0 = 0; i0 < d; i0 += 32) {
            switch (nr - r0 < 3 ? nr - r0 : 3) {
            case 3: values32_rows_x86(n, 3, s + r0 * s_stride, s_stride, v, stride, out + r0, i0); break;
            case 2: values32_rows_x86(n, 2, s + r0 * s_stride, s_stride, v, stride, out + r0, i0); break;
            default: values32_rows_x86(n, 1, s + r0 * s_stride, s_stride, v, stride, out + r0, i0); break;
            }
        }
    }
}

/* Scales of 16-element sub-blocks, for the shuffles below: the eight signed byte scales 8h..8h+7
 * of a vector of sixteen, as int16 in both 128-bit lanes. Kept in registers throughout: writing
 * them to a small array and reading them back as a vector would stall on store forwarding once
 * per super-block. */
static inline __m256i scales16_half(__m128i s8, int h) {
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
}

/* int16 lanes 0-7 = s[2g], lanes 8-15 = s[2g + 1] of scales16_half's eight: the scales of the two
 * 16-element sub-blocks that one 32-byte vector of levels spans. */
static inline __m256i scale_pair16(__m256i s16, int g) {
    return _mm256_shuffle_epi8(s16, _mm256_set_m128i(_mm_set1_epi16((short) (0x0100 + 0x0202 * (2 * g + 1))),
                                                     _mm_set1_epi16((short) (0x0100 + 0x0202 * (2 * g)))));
}

/* int16 lanes all = s[j], from a vector of 16 unsigned byte scales. */
static inline __m256i scale_all(__m128i s8, int j) {
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(s8, _mm_set1_epi8((char) j)));
}

/* int16 lanes all = s[j] (j < 8), from eight int16 scales held in both 128-bit lanes. */
static inline __m256i scale_bcast16(__m256i s16, int j) {
    return _mm256_shuffle_epi8(s16, _mm256_set1_epi16((short) (0x0100 + 0x0202 * j)));
}

/* sum_j s[j] * bsums[j] over the 16 sub-blocks of 16 (s as 16 int16), as eight int32 partial sums */
static inline __m256i bsums_madd16(const int16_t bsums[16], __m256i s16) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) bsums), s16);
}

/* Eight vectors of int32 lanes -> the vector of their eight sums, in order. */
static inline __m256i block_sums8(const __m256i p[8]) {
    const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
    /* each 128-bit half holds four vectors' partial sums: add the halves */
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20), _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* ---- the float steps of a K-quant row (kq_sum) ----------------------------------------------
 *
 * Every K-quant kernel reduces super-block i to int32 lanes whose sum is its exact integer dot S_i
 * (sub-block dots weighted by their scales, less any constant offset of the levels), and for the
 * types with mins (Q2_K, Q4_K, Q5_K) lanes whose sum is M_i, the mins weighted by the activations'
 * sums; f_i = d_x d_w and g_i = d_x dmin_w are its float scales. The float steps are the same in
 * every set and every form (Q2_K to Q6_K, IQ4_XS, IQ2_XXS, IQ3_XXS): lane i mod 8 of one
 * accumulator takes super-block i, as two steps, acc = fma(f_i, float(S_i), acc), then
 * acc = fma(-g_i, float(M_i), acc); out = hsum_ps(acc). Only the integers S_i and M_i enter, so a
 * form that gets them another way (the AMX tiles, matmul_amx.c; the tiles of rows side by side,
 * kq_rows_x86.h) gives the same floats. Two ways to get there, by register room:
 *
 *   grouped (KQ_GROUPED in the AVX-512 set): a group's eight super-blocks' lanes are held, and
 *     their sums come out of one tree of horizontal adds (block_sums8).
 *   paired (KQ_PAIRED; every kernel of the AVX2 set, whose 16 registers do not hold eight
 *     super-blocks' lanes, and the AVX-512 set's one-token Q2_K and Q3_K): a super-block's S and
 *     M lanes are paired by a horizontal add as soon as it is done, and two super-blocks' pairs by
 *     another (as kq_run_grouped does for several tokens), so a group is four registers. Eight
 *     super-blocks' lanes held for block_sums8 do not fit beside those two kernels' unpacking
 *     (they spilled, and Q3_K ran at half speed). */
#define KQ_PAIRED 2
#ifdef RM_KQ_GROUPED
#define KQ_GROUPED 1
#else
#define KQ_GROUPED KQ_PAIRED
#endif
/* The super-blocks a kernel's loop takes at a time (unrolled): a group of kq_sum's. */
#define KQ_GROUP(grouped) 8

/* v with lane k set to x, and c + a b (c - a b) in lanes 0..cnt-1 only (the rest of c as it is):
 * masks in the AVX-512 set, blends in the AVX2 one. */
#ifdef RM_KQ_GROUPED
RM_INLINE __m256 kq_lane_set(__m256 v, int k, float x) {
    return _mm256_mask_broadcastss_ps(v, (__mmask8) (1u << k), _mm_set_ss(x));
}
RM_INLINE __m256 kq_fmadd_first(__m256 a, __m256 b, __m256 c, int cnt) {
    return _mm256_mask3_fmadd_ps(a, b, c, (__mmask8) ((1u << cnt) - 1));
}
RM_INLINE __m256 kq_fnmadd_first(__m256 a, __m256 b, __m256 c, int cnt) {
    return _mm256_mask3_fnmadd_ps(a, b, c, (__mmask8) ((1u << cnt) - 1));
}
#else
RM_INLINE __m256 kq_lane_set(__m256 v, int k, float x) {
    const __m256 b = _mm256_set1_ps(x);
    switch (k) {   /* a blend by a constant where k is one (the unrolled one-token kernels) */
    case 0: return _mm256_blend_ps(v, b, 0x01);
    case 1: return _mm256_blend_ps(v, b, 0x02);
    case 2: return _mm256_blend_ps(v, b, 0x04);
    case 3: return _mm256_blend_ps(v, b, 0x08);
    case 4: return _mm256_blend_ps(v, b, 0x10);
    case 5: return _mm256_blend_ps(v, b, 0x20);
    case 6: return _mm256_blend_ps(v, b, 0x40);
    default: return _mm256_blend_ps(v, b, 0x80);
    }
}
RM_INLINE __m256 kq_fmadd_first(__m256 a, __m256 b, __m256 c, int cnt) {
    const __m256i used = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), _mm256_castsi256_ps(used));
}
RM_INLINE __m256 kq_fnmadd_first(__m256 a, __m256 b, __m256 c, int cnt) {
    const __m256i used = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_blendv_ps(c, _mm256_fnmadd_ps(a, b, c), _mm256_castsi256_ps(used));
}
#endif

/* Four vectors h[p] = _mm256_hadd_epi32(v_2p, v_2p+1), where v_k holds, per 128-bit half, the pair
 * sums of super-block k's S lanes and of its M lanes ([s s m m], _mm256_hadd_epi32(S lanes, M
 * lanes)) -> the eight S and the eight M, in order. */
static inline void kq_split_sums4(const __m256i h[4], __m256i * S, __m256i * M) {
    /* h[p] per half: [S_2p M_2p S_2p+1 M_2p+1]; the S (even) and M (odd) places gathered */
    const __m256 h01 = _mm256_castsi256_ps(h[0]), h23 = _mm256_castsi256_ps(h[1]);
    const __m256 h45 = _mm256_castsi256_ps(h[2]), h67 = _mm256_castsi256_ps(h[3]);
    const __m256i s03 = _mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256i m03 = _mm256_castps_si256(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256i s47 = _mm256_castps_si256(_mm256_shuffle_ps(h45, h67, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256i m47 = _mm256_castps_si256(_mm256_shuffle_ps(h45, h67, _MM_SHUFFLE(3, 1, 3, 1)));
    /* each half holds its own part of every sum: add the halves */
    *S = _mm256_add_epi32(_mm256_permute2x128_si256(s03, s47, 0x20), _mm256_permute2x128_si256(s03, s47, 0x31));
    *M = _mm256_add_epi32(_mm256_permute2x128_si256(m03, m47, 0x20), _mm256_permute2x128_si256(m03, m47, 0x31));
}


typedef struct kq_sum {
    __m256 acc;
    __m256i s[8], m[8];   /* the current group of eight super-blocks' lanes (paired: h in s[0..3], s[4] the last) */
    __m256 f, g;          /* and their scales */
} kq_sum;

/* Each function takes `grouped`, a constant: 1 for the grouped way above (the AVX-512 set's
 * one-token kernels for Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ3_XXS), KQ_PAIRED for the paired
 * one (the rest). */
RM_INLINE void kq_sum_init(const int grouped, kq_sum * q) {
    (void) grouped;
    q->acc = _mm256_setzero_ps();
}

/* A group starts: its places cleared (each with a constant index, so none of them needs memory;
 * paired: s[4] too, which only a group of odd count reads after setting it). */
RM_INLINE void kq_sum_begin(const int grouped, kq_sum * q) {
    for (int j = 0; j < (grouped == KQ_PAIRED ? 5 : 8); j++) {
        q->s[j] = q->m[j] = _mm256_setzero_si256();
    }
    q->f = q->g = _mm256_setzero_ps();
}

/* Super-block k of the current group (the kernels walk groups of eight, k = 0..7, unrolled: k is a
 * constant, and the group's lanes stay in registers): the lanes of S (sumi) and, with mins, of M
 * (mb). */
RM_INLINE void kq_sum_add(const int grouped, kq_sum * q, int k, __m256i sumi, __m256i mb, float f, float g,
                          const int mins) {
    if (grouped == KQ_PAIRED) {   /* per half [S_k M_k], then [S_k-1 M_k-1 S_k M_k] (kq_split_sums4) */
        q->f = kq_lane_set(q->f, k, f);
        if (mins) {
            q->g = kq_lane_set(q->g, k, g);
        }
        const __m256i v = _mm256_hadd_epi32(sumi, mins ? mb : sumi);
        if (k % 2) {
            q->s[k / 2] = _mm256_hadd_epi32(q->s[4], v);
        } else {
            q->s[4] = v;   /* a group that ends here pairs it with zeros (kq_sum_flush) */
        }
        return;
    }
    q->s[k] = sumi;   /* grouped */
    q->f = kq_lane_set(q->f, k, f);
    if (mins) {
        q->m[k] = mb;
        q->g = kq_lane_set(q->g, k, g);
    }
}

/* The group is complete with its first cnt super-blocks (1 to 8): lanes 0..cnt-1 take them. */
RM_INLINE void kq_sum_flush(const int grouped, kq_sum * q, int cnt, const int mins) {
    if (grouped == KQ_PAIRED) {
        switch (cnt) {   /* an odd count: the last one alone (constant places, kept in registers) */
        case 1: q->s[0] = _mm256_hadd_epi32(q->s[4], _mm256_setzero_si256()); break;
        case 3: q->s[1] = _mm256_hadd_epi32(q->s[4], _mm256_setzero_si256()); break;
        case 5: q->s[2] = _mm256_hadd_epi32(q->s[4], _mm256_setzero_si256()); break;
        case 7: q->s[3] = _mm256_hadd_epi32(q->s[4], _mm256_setzero_si256()); break;
        default: break;
        }
        __m256i S, M;
        kq_split_sums4(q->s, &S, &M);
        q->acc = kq_fmadd_first(q->f, _mm256_cvtepi32_ps(S), q->acc, cnt);
        if (mins) {
            q->acc = kq_fnmadd_first(q->g, _mm256_cvtepi32_ps(M), q->acc, cnt);
        }
        return;
    }
    q->acc = kq_fmadd_first(q->f, _mm256_cvtepi32_ps(block_sums8(q->s)), q->acc, cnt);
    if (mins) {
        q->acc = kq_fnmadd_first(q->g, _mm256_cvtepi32_ps(block_sums8(q->m)), q->acc, cnt);
    }
}

RM_INLINE float kq_sum_out(const int grouped, const kq_sum * q, const int mins) {
    (void) grouped;
    (void) mins;
    return hsum_ps(q->acc);
}

/* Q3_K: the sixteen 6-bit scales, stored + 32, as signed bytes. Low nibbles of 0-7 in bytes 0-7,
 * of 8-15 in their high nibbles; the top 2 bits of scale j sit in byte 8 + j % 4 at bit 2 (j / 4).
 * As 32-bit words u0, u1, u2 of the 12 bytes, word k of the result is (u_{k%2} >> 4 * (k / 2)) & 0x0f..
 * | ((u2 >> 2k) & 0x03..) << 4, made in vector lanes. Reads the 16 bytes that end with the block's
 * d: the last two of qs, the scales, d (all the block's own). */
static inline __m128i scales_q3_K(const rm_block_q3_K * b) {
    const __m128i v = _mm_loadu_si128((const __m128i *) (b->scales + 12 + sizeof(rm_fp16) - 16));
    const int at = 16 - 12 - (int) sizeof(rm_fp16);   /* where the scales start in v */
    const __m128i u0101 = _mm_shuffle_epi8(v, _mm_setr_epi8(at, at + 1, at + 2, at + 3, at + 4, at + 5, at + 6, at + 7,
                                                            at, at + 1, at + 2, at + 3, at + 4, at + 5, at + 6, at + 7));
    const __m128i u2 = _mm_shuffle_epi8(v, _mm_setr_epi8(at + 8, at + 9, at + 10, at + 11, at + 8, at + 9, at + 10, at + 11,
                                                         at + 8, at + 9, at + 10, at + 11, at + 8, at + 9, at + 10, at + 11));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(u0101, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(u2, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(0x03));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}

/* Q4_K / Q5_K: eight 6-bit scales (bytes 0-7 of the result) and mins (bytes 8-15) from 12 bytes.
 * Bytes 0-3 hold scales 0-3 and bytes 4-7 mins 0-3 (low 6 bits); bytes 8-11 the low nibbles of
 * scale (low) and min (high) 4-7, whose top 2 bits are the top 2 bits of bytes 0-3 and 4-7. As
 * 32-bit words u0, u1, u2, the result's words are u0 & 0x3f.., (u2 & 0x0f..) | (u0 >> 6 & 3..) << 4,
 * u1 & 0x3f.., (u2 >> 4 & 0x0f..) | (u1 >> 6 & 3..) << 4, made in vector lanes. Reads 16 bytes:
 * the 4 after the scales are the block's own (levels or high bits) and are not used. */
static inline __m128i scales_k4(const uint8_t q[12]) {
    const __m128i v = _mm_loadu_si128((const __m128i *) q);
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* ---- levels of 32-element chunks, as unsigned bytes (the type's offset added) ------------- */

/* Q3_K, elements 128h + 32g + l: two low bits of qs byte 32h + l at bit 2g, plus 4 where the
 * high bit (hmask bit 4h + g of byte l) is set: q + 4 in 0..7. */
static inline __m256i levels_q3_K(__m256i q, __m256i hm, int h, int g) {
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), _mm256_set1_epi8(3));
#ifdef RM_KQ_GROUPED
    /* the AVX-512 set: hmask shifted so that bit 4h + g of each byte lands on bit 2 (a 16-bit shift
     * of at most 5 right or 2 left moves no other byte's bit there), put in with one vpternlog:
     * low | (hi & 4) */
    const int e = 4 * h + g - 2;
    const __m256i hi = e < 0 ? _mm256_slli_epi16(hm, -e) : _mm256_srli_epi16(hm, e);
    return _mm256_ternarylogic_epi32(low, hi, _mm256_set1_epi8(4), 0xf8);
#else
    const int e = 4 * h + g - 2;   /* as above, the bit put in with a mask and an or */
    const __m256i hi = e < 0 ? _mm256_slli_epi16(hm, -e) : _mm256_srli_epi16(hm, e);
    return _mm256_or_si256(low, _mm256_and_si256(hi, _mm256_set1_epi8(4)));
#endif
}

/* Q4_K / Q5_K, elements 64p + l (lo) and 64p + 32 + l (hi): the nibbles of qs byte 32p + l, and
 * for Q5_K the fifth bit, qh bit 2p (lo) or 2p + 1 (hi) of byte l. */
static inline void levels_k4(const uint8_t * qs, __m256i qh, int p, int five, __m256i * lo, __m256i * hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    const __m256i q = _mm256_loadu_si256((const __m256i *) (qs + 32 * p));
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (five) {
        const __m256i h = _mm256_srli_epi16(qh, 2 * p);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
    }
}

/* Q6_K, elements 128h + 32g + l for g = 0..3: levels + 32 in 0..63, the 4 low bits from ql, the
 * 2 high ones from qh bits 2g. */
static inline void levels_q6_K(const rm_block_q6_K * b, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2h = _mm256_set1_epi8(0x30);
    const __m256i ql0 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *) (b->qh + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2h));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2h));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2h));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2h));
}

/* ---------------------------------------------------------------------------------------------
 * K-quants against Q8_K, one token at a time: the kernels take nc tokens but are called with one
 * (vec_dot, and vec_dot_multi for a single token); several tokens go to the prefill form below.
 * Each super-block sums its integer products, weighted by the sub-block scales, in int32 lanes;
 * the constant parts of the levels (Q2_K/Q4_K mins, the -4 of Q3_K, the -32 of Q6_K) come out
 * through the activations' per-16 sums (bsums), as one small dot. The float steps that follow
 * (and the mins, which carry a float scale of their own) are kq_sum's, above. One skeleton
 * (kq_dot) walks the super-blocks in kq_sum's groups of eight for every type; a type gives only
 * its step on one super-block (kq_step_*: unpacking its levels and scales, interleaved with the
 * products so that they stay in registers).
 * ------------------------------------------------------------------------------------------- */

/* What a type's step leaves for super-block i and token c: the int32 lanes whose sum is the exact
 * integer dot S (sub-block dots weighted by their scales, less the levels' constant offset), the
 * lanes whose sum is M (the mins weighted by the activations' sums; types with mins only), and
 * their float scales f = d_x d_w and g = d_x dmin_w (kq_sum's). */
typedef struct {
    __m256i s, m;
    float   f, g;
} kq_step;

/* A type's step: super-block i of row w against the nc tokens' super-blocks a[c]. */
typedef void (*kq_step_fn)(const void * w, int64_t i, const rm_block_q8_K * const * a, int nc, kq_step * r);

/* A step's products go into KQ_CHAINS accumulators a token, added at its end: in the AVX-512 set
 * each vpdpwssd waits for the one before in its chain, and a single chain held a token to one
 * product every 4 cycles (the Q4_K kernel at 29 G weights/s a thread, its latency bound). The
 * int32 lanes are the same sums either way. The AVX2 set's chains are vpaddd (one cycle), and its
 * 16 registers have no room for more. */
#ifdef RM_KQ_GROUPED
#define KQ_CHAINS 2
#else
#define KQ_CHAINS 1
#endif

RM_INLINE void kq_chains_zero(__m256i t[][KQ_CHAINS], const int nc) {
    for (int c = 0; c < nc; c++) {
        for (int k = 0; k < KQ_CHAINS; k++) {
            t[c][k] = _mm256_setzero_si256();
        }
    }
}

RM_INLINE __m256i kq_chains_sum(const __m256i * t) { return KQ_CHAINS == 2 ? _mm256_add_epi32(t[0], t[1]) : t[0]; }

/* The end of a step for the types whose levels carry a constant offset (Q3_K's 4, Q6_K's 32 =
 * 1 << shift) and no mins: the chains' lanes less the offset times the scale-weighted bsums, lane by
 * lane (only the lanes' sum enters). */
RM_INLINE void kq_step_offset_end(__m256i t[][KQ_CHAINS], const rm_block_q8_K * const * a, const int nc, __m128i sc,
                                  const int shift, float dw, kq_step * r) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
    for (int c = 0; c < nc; c++) {
        r[c].s = r[c].m = _mm256_sub_epi32(kq_chains_sum(t[c]), _mm256_slli_epi32(bsums_madd16(a[c]->bsums, sc16), shift));
        r[c].f = a[c]->d * dw;
        r[c].g = 0.0f;
    }
}

/* The one skeleton of the one-token kernels (called with one token; several go to the prefill
 * form below): the super-blocks in kq_sum's groups, each streamed ahead, taken by the type's step
 * and added by kq_sum_add. `grouped`: KQ_GROUPED or KQ_PAIRED (kq_sum's, by register room);
 * `mins`: whether the type has mins (M lanes and g). */
RM_INLINE void kq_dot(int64_t n, float * out, const void * w, const size_t bsize, const void * x_q, uint64_t x_stride,
                      const int nc, const int grouped, const int mins, const kq_step_fn step) {
    const int64_t nb = n / RM_QK_K;
    kq_sum acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        kq_sum_init(grouped, &acc[c]);
    }
    for (int64_t i0 = 0; i0 < nb; i0 += KQ_GROUP(grouped)) {   /* kq_sum's groups */
        const int cnt = nb - i0 < KQ_GROUP(grouped) ? (int) (nb - i0) : KQ_GROUP(grouped);
        for (int c = 0; c < nc; c++) {
            kq_sum_begin(grouped, &acc[c]);
        }
#pragma GCC unroll 8
        for (int k = 0; k < KQ_GROUP(grouped); k++) {
            if (k >= cnt) {
                break;
            }
            const int64_t i = i0 + k;
            if (nc == 1) {
                rm_stream_ahead((const uint8_t *) w + (size_t) i * bsize, (int) bsize);
            }
            const rm_block_q8_K * a[RM_MULTI_MAX];
            for (int c = 0; c < nc; c++) {
                a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
            }
            kq_step r[RM_MULTI_MAX];
            step(w, i, a, nc, r);
            for (int c = 0; c < nc; c++) {
                kq_sum_add(grouped, &acc[c], k, r[c].s, r[c].m, r[c].f, r[c].g, mins);
            }
        }
        for (int c = 0; c < nc; c++) {
            kq_sum_flush(grouped, &acc[c], cnt, mins);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = kq_sum_out(grouped, &acc[c], mins);
    }
}

/* Q2_K: levels 0..3 times scales, less dmin times the mins (via bsums). */
RM_INLINE void kq_step_q2_K(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r) {
    const rm_block_q2_K * b = (const rm_block_q2_K *) w + i;
    const __m128i raw = _mm_loadu_si128((const __m128i *) b->scales);
    const __m128i sc = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
    const __m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
    __m256i t[RM_MULTI_MAX][KQ_CHAINS];
    kq_chains_zero(t, nc);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b->qs + 32 * h));
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            const __m256i l = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), _mm256_set1_epi8(3));
            const __m256i s = scale_pair16(s16, g);
            for (int c = 0; c < nc; c++) {
                const __m256i p = _mm256_maddubs_epi16(l, _mm256_loadu_si256((const __m256i *) (a[c]->qs + 128 * h + 32 * g)));
                t[c][g % KQ_CHAINS] = RM_KQ_ACC(t[c][g % KQ_CHAINS], p, s);
            }
        }
    }
    const float dw = fp16(b->d), dmw = fp16(b->dmin);
    for (int c = 0; c < nc; c++) {
        r[c].s = kq_chains_sum(t[c]);
        r[c].m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) a[c]->bsums), mn);
        r[c].f = a[c]->d * dw;
        r[c].g = a[c]->d * dmw;
    }
}

/* Q3_K: levels taken as q + 4 in 0..7, the 4 taken back through bsums. */
RM_INLINE void kq_step_q3_K(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r) {
    const rm_block_q3_K * b = (const rm_block_q3_K *) w + i;
    const __m128i sc = scales_q3_K(b);
    __m256i t[RM_MULTI_MAX][KQ_CHAINS];
    kq_chains_zero(t, nc);
    const __m256i hm = _mm256_loadu_si256((const __m256i *) b->hmask);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b->qs + 32 * h));
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            const __m256i l = levels_q3_K(q, hm, h, g);
            const __m256i s = scale_pair16(s16, g);
            for (int c = 0; c < nc; c++) {
                const __m256i p = _mm256_maddubs_epi16(l, _mm256_loadu_si256((const __m256i *) (a[c]->qs + 128 * h + 32 * g)));
                t[c][g % KQ_CHAINS] = RM_KQ_ACC(t[c][g % KQ_CHAINS], p, s);
            }
        }
    }
    kq_step_offset_end(t, a, nc, sc, 2, fp16(b->d), r);
}

/* The end of a Q4_K / Q5_K step (the S lanes set): the mins, each twice as int16 (min j covers the
 * 16-sums 2j and 2j + 1), one madd against a token's sixteen bsums giving eight min-weighted sums,
 * and the float scales. sm: scales_k4's bytes. */
RM_INLINE void kq_step_k4_end(const rm_block_q4_K * b, __m128i sm, const rm_block_q8_K * const * a, const int nc,
                              kq_step * r) {
    const __m128i mins8 = _mm_unpackhi_epi64(sm, sm);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));
    const float dw = fp16(b->d), dmw = fp16(b->dmin);
    for (int c = 0; c < nc; c++) {
        r[c].m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) a[c]->bsums), mins);
        r[c].f = a[c]->d * dw;
        r[c].g = a[c]->d * dmw;
    }
}

/* Q4_K and Q5_K: the levels and scales of a super-block are unpacked once. The two types differ
 * only in where the fields lie and in Q5_K's fifth bit: qh bit 2p of byte l is the top bit of
 * element 64p + l, bit 2p + 1 that of element 64p + 32 + l. */
RM_INLINE void kq_step_k4(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r,
                          const int five) {
    const size_t bsize = five ? sizeof(rm_block_q5_K) : sizeof(rm_block_q4_K);
    const size_t qs_at = five ? offsetof(rm_block_q5_K, qs) : offsetof(rm_block_q4_K, qs);
    /* d, dmin and scales lie at the same offsets in both blocks */
    const rm_block_q4_K * b = (const rm_block_q4_K *) ((const uint8_t *) w + (size_t) i * bsize);
    const uint8_t * qs = (const uint8_t *) b + qs_at;
    const __m256i qh = five ? _mm256_loadu_si256((const __m256i *) ((const rm_block_q5_K *) b)->qh) : _mm256_setzero_si256();
    const __m128i sm = scales_k4(b->scales);    /* 8 scales, then 8 mins */
    __m256i t[RM_MULTI_MAX][KQ_CHAINS];
    kq_chains_zero(t, nc);
    /* the eight scales as int16 in both 128-bit lanes: one in-lane shuffle then gives a
     * sub-block's scale in all sixteen lanes */
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    for (int p = 0; p < 4; p++) {  /* 32 bytes: sub-block 2p in the low nibbles, 2p + 1 in the high */
        __m256i lo, hi;
        levels_k4(qs, qh, p, five, &lo, &hi);
        const __m256i s0 = scale_bcast16(s16, 2 * p), s1 = scale_bcast16(s16, 2 * p + 1);
        for (int c = 0; c < nc; c++) {
            const int8_t * y = a[c]->qs + 64 * p;
            const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *) y));
            const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *) (y + 32)));
            t[c][0] = RM_KQ_ACC(t[c][0], p0, s0);
            t[c][KQ_CHAINS - 1] = RM_KQ_ACC(t[c][KQ_CHAINS - 1], p1, s1);
        }
    }
    for (int c = 0; c < nc; c++) {
        r[c].s = kq_chains_sum(t[c]);
    }
    kq_step_k4_end(b, sm, a, nc, r);
}

RM_INLINE void kq_step_q4_K(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r) {
    kq_step_k4(w, i, a, nc, r, 0);
}

RM_INLINE void kq_step_q5_K(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r) {
    kq_step_k4(w, i, a, nc, r, 1);
}

/* Q6_K: levels taken as q + 32 in 0..63, the 32 taken back through bsums. */
RM_INLINE void kq_step_q6_K(const void * w, int64_t i, const rm_block_q8_K * const * a, const int nc, kq_step * r) {
    const rm_block_q6_K * b = (const rm_block_q6_K *) w + i;
    const __m128i sc = _mm_loadu_si128((const __m128i *) b->scales);
    __m256i t[RM_MULTI_MAX][KQ_CHAINS];
    kq_chains_zero(t, nc);
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        levels_q6_K(b, h, q);
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            const __m256i s = scale_pair16(s16, g);
            for (int c = 0; c < nc; c++) {
                const __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *) (a[c]->qs + 128 * h + 32 * g)));
                t[c][g % KQ_CHAINS] = RM_KQ_ACC(t[c][g % KQ_CHAINS], p, s);
            }
        }
    }
    kq_step_offset_end(t, a, nc, sc, 5, fp16(b->d), r);
}

/* The types' kernels for nc tokens (called with 1). Q2_K and Q3_K take kq_sum's paired form in
 * both sets (their unpacking leaves no room for eight super-blocks' lanes). */
RM_INLINE void dot_q2_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    kq_dot(n, out, w, sizeof(rm_block_q2_K), x_q, x_stride, nc, KQ_PAIRED, 1, kq_step_q2_K);
}

RM_INLINE void dot_q3_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    kq_dot(n, out, w, sizeof(rm_block_q3_K), x_q, x_stride, nc, KQ_PAIRED, 0, kq_step_q3_K);
}

RM_INLINE void dot_q4_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    kq_dot(n, out, w, sizeof(rm_block_q4_K), x_q, x_stride, nc, KQ_GROUPED, 1, kq_step_q4_K);
}

RM_INLINE void dot_q5_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    kq_dot(n, out, w, sizeof(rm_block_q5_K), x_q, x_stride, nc, KQ_GROUPED, 1, kq_step_q5_K);
}

RM_INLINE void dot_q6_K_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    kq_dot(n, out, w, sizeof(rm_block_q6_K), x_q, x_stride, nc, KQ_GROUPED, 0, kq_step_q6_K);
}

/* Bit b of every byte of v moved to bit 4 (16-bit shifts: b <= 7 brings no other byte's bit). */
RM_INLINE __m256i bit_to4_256(__m256i v, const int b) {
    return b < 4 ? _mm256_slli_epi16(v, 4 - b) : b > 4 ? _mm256_srli_epi16(v, b - 4) : v;
}

/* The K-quant tiles' activations (rm_packed_kernels.act_bytes, transpose_act): the tokens' Q8_K rows
 * as they are. */
static inline uint64_t kq_act_bytes(int64_t n) { return (uint64_t) (n / RM_QK_K) * sizeof(rm_block_q8_K); }
static inline void kq_copy_act(int64_t n, const void * x_q, void * x_t) { memcpy(x_t, x_q, (size_t) kq_act_bytes(n)); }

/* ---------------------------------------------------------------------------------------------
 * The prefill form of the K-quants: each super-block unpacked once, for every token of the call
 * (2 to 8), into 32-element chunks of unsigned levels with their scales as int16 lanes. All five
 * types then share one loop of multiply-adds, and a level costs its unpacking once per row and
 * tile of tokens instead of once per four tokens. Each token's int32 lanes hold the same sums as
 * in the one-token kernels above (lane j of chunk k's products, whatever the order), and the float
 * steps are the same, so results are bit for bit the one-token kernel's.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    __m256i q[8];   /* chunk k: levels of elements 32k .. 32k + 31 */
    __m256i s[8];   /* chunk k: the scale of each int16 pair product (one, or two 16-element sub-blocks) */
    __m256i bw;     /* int16 weights of a token's sixteen bsums: the offsets' scales, or the mins */
    __m128i sc16;   /* the scale of each 16-element sub-block as a signed byte (the row-tile form) */
    float d, dmin;
} kq_unpacked;

static inline void unpack_q2_K(const void * w, int64_t i, kq_unpacked * u) {
    const rm_block_q2_K * b = (const rm_block_q2_K *) w + i;
    const __m128i raw = _mm_loadu_si128((const __m128i *) b->scales);
    const __m128i sc = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b->qs + 32 * h));
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            u->q[4 * h + g] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), _mm256_set1_epi8(3));
            u->s[4 * h + g] = scale_pair16(s16, g);
        }
    }
    u->bw = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
    u->sc16 = sc;
    u->d = fp16(b->d);
    u->dmin = fp16(b->dmin);
}

static inline void unpack_q3_K(const void * w, int64_t i, kq_unpacked * u) {
    const rm_block_q3_K * b = (const rm_block_q3_K *) w + i;
    const __m128i sc = scales_q3_K(b);
    const __m256i hm = _mm256_loadu_si256((const __m256i *) b->hmask);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b->qs + 32 * h));
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            u->q[4 * h + g] = levels_q3_K(q, hm, h, g);
            u->s[4 * h + g] = scale_pair16(s16, g);
        }
    }
    u->bw = _mm256_cvtepi8_epi16(sc);
    u->sc16 = sc;
    u->d = fp16(b->d);
}

static inline void unpack_k4(const void * w, int64_t i, kq_unpacked * u, const int five) {
    const size_t bsize = five ? sizeof(rm_block_q5_K) : sizeof(rm_block_q4_K);
    const rm_block_q4_K * b = (const rm_block_q4_K *) ((const uint8_t *) w + (size_t) i * bsize);
    const uint8_t * qs = (const uint8_t *) b + (five ? offsetof(rm_block_q5_K, qs) : offsetof(rm_block_q4_K, qs));
    const __m256i qh = five ? _mm256_loadu_si256((const __m256i *) ((const rm_block_q5_K *) b)->qh) : _mm256_setzero_si256();
    const __m128i sm = scales_k4(b->scales);
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    for (int p = 0; p < 4; p++) {
        levels_k4(qs, qh, p, five, &u->q[2 * p], &u->q[2 * p + 1]);
        u->s[2 * p] = scale_bcast16(s16, 2 * p);
        u->s[2 * p + 1] = scale_bcast16(s16, 2 * p + 1);
    }
    const __m128i mins8 = _mm_unpackhi_epi64(sm, sm);
    u->bw = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));
    u->sc16 = _mm_unpacklo_epi8(sm, sm);   /* 0..63: the same as signed bytes */
    u->d = fp16(b->d);
    u->dmin = fp16(b->dmin);
}

static inline void unpack_q4_K(const void * w, int64_t i, kq_unpacked * u) { unpack_k4(w, i, u, 0); }
static inline void unpack_q5_K(const void * w, int64_t i, kq_unpacked * u) { unpack_k4(w, i, u, 1); }

static inline void unpack_q6_K(const void * w, int64_t i, kq_unpacked * u) {
    const rm_block_q6_K * b = (const rm_block_q6_K *) w + i;
    const __m128i sc = _mm_loadu_si128((const __m128i *) b->scales);
    for (int h = 0; h < 2; h++) {
        levels_q6_K(b, h, &u->q[4 * h]);
        const __m256i s16 = scales16_half(sc, h);
        for (int g = 0; g < 4; g++) {
            u->s[4 * h + g] = scale_pair16(s16, g);
        }
    }
    u->bw = _mm256_cvtepi8_epi16(sc);
    u->sc16 = sc;
    u->d = fp16(b->d);
}

/* m tokens' (1 to 4) products with super-block i (lane k of the current group), unpacked in u,
 * into their kq_sum (paired). off_mul > 0: the levels carry a constant offset, (bsums . bw) *
 * off_mul (Q3_K: 4, Q6_K: 32); 0: bw are mins, with the block's dmin (Q2_K, Q4_K, Q5_K). */
RM_INLINE void kq_tokens4(const kq_unpacked * u, const void * x_q, uint64_t x_stride, int64_t i, int k, kq_sum acc[4],
                          const int off_mul, const int m) {
    const rm_block_q8_K * a[4];
    __m256i sumi[4];
    for (int c = 0; c < m; c++) {
        a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
        sumi[c] = _mm256_setzero_si256();
    }
    /* unrolled by two, not more: further unrolled, the compiler reorders the sums into trees that
     * spill registers */
#pragma GCC unroll 2
    for (int k = 0; k < 8; k++) {
        for (int c = 0; c < m; c++) {
            const __m256i p = _mm256_maddubs_epi16(u->q[k], _mm256_loadu_si256((const __m256i *) (a[c]->qs + 32 * k)));
            sumi[c] = RM_KQ_ACC(sumi[c], p, u->s[k]);
        }
    }
    for (int c = 0; c < m; c++) {
        const __m256i mb = bsums_madd16(a[c]->bsums, u->bw);
        if (off_mul) {   /* times 4 or 32: a shift; only the lanes' sum enters */
            const __m256i t = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(mb, off_mul == 4 ? 2 : 5));
            kq_sum_add(KQ_PAIRED, &acc[c], k, t, t, a[c]->d * u->d, 0.0f, 0);
        } else {
            kq_sum_add(KQ_PAIRED, &acc[c], k, sumi[c], mb, a[c]->d * u->d, a[c]->d * u->dmin, 1);
        }
    }
}

/* nc tokens (2 to 8) against super-blocks unpacked by `unpack`. A run of up to KQ_RUN super-blocks
 * (eight: one group of kq_sum's) is unpacked into L1, then each group of up to four tokens passes
 * over the whole run (four tokens' sums fit the 16 registers of AVX2; eight would spill). Each
 * token still takes the super-blocks in order, with kq_sum's steps, so its floats are the
 * one-token kernel's. */
#define KQ_RUN 8

#ifdef RM_KQ_GROUPED
/* Grouped steps for nt tokens (1 to 4: they share each chunk's unpacked levels and scales) against
 * a run of cnt super-blocks unpacked in u (one group of kq_sum's); a[t]: token t's block of the
 * run's first super-block. The one-token kernels' integers (offsets taken off lane by lane, as
 * only the lanes' sum enters), then kq_sum's steps. A super-block's S and M lanes are paired by a
 * horizontal add, and two super-blocks' pairs by another, so a token's group is four registers. */
RM_INLINE void kq_run_grouped(const kq_unpacked * u, int cnt, const rm_block_q8_K * const a[4], const int nt,
                              const int off_mul, __m256 acc[4]) {
    __m256i h[4][4], prev[4];
    __m256 f[4], g[4];
    for (int t = 0; t < nt; t++) {
        f[t] = g[t] = _mm256_setzero_ps();
        prev[t] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            h[t][p] = _mm256_setzero_si256();
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        if (k >= cnt) {
            break;
        }
        /* chunks 2p and 2p + 1 side by side in 512-bit registers (the levels, scales and
         * activations of the two lie next to each other in memory): half the multiplies of
         * 256-bit steps. Lane l of the low half sums the even chunks' lane l, of the high half
         * the odd ones'; their sum is the one-token kernels' lane l, the same integer. */
        __m512i wide[4];
        for (int t = 0; t < nt; t++) {
            wide[t] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 4; p++) {
            const __m512i q2 = _mm512_loadu_si512((const void *) &u[k].q[2 * p]);
            const __m512i s2 = _mm512_loadu_si512((const void *) &u[k].s[2 * p]);
            for (int t = 0; t < nt; t++) {
                const __m512i x = _mm512_loadu_si512((const void *) (a[t][k].qs + 64 * p));
                wide[t] = _mm512_dpwssd_epi32(wide[t], _mm512_maddubs_epi16(q2, x), s2);
            }
        }
        __m256i sumi[4];
        for (int t = 0; t < nt; t++) {
            sumi[t] = _mm256_add_epi32(_mm512_castsi512_si256(wide[t]), _mm512_extracti64x4_epi64(wide[t], 1));
        }
        for (int t = 0; t < nt; t++) {
            const __m256i bm = bsums_madd16(a[t][k].bsums, u[k].bw);
            const __mmask8 bit = (__mmask8) (1u << k);
            f[t] = _mm256_mask_broadcastss_ps(f[t], bit, _mm_set_ss(a[t][k].d * u[k].d));
            __m256i v;
            if (off_mul) {   /* times 4 or 32: a shift; S alone, its lanes summed in M's places too */
                const __m256i sv = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(bm, off_mul == 4 ? 2 : 5));
                v = _mm256_hadd_epi32(sv, sv);
            } else {
                v = _mm256_hadd_epi32(sumi[t], bm);
                g[t] = _mm256_mask_broadcastss_ps(g[t], bit, _mm_set_ss(a[t][k].d * u[k].dmin));
            }
            if (k % 2) {
                h[t][k / 2] = _mm256_hadd_epi32(prev[t], v);
            } else if (k == cnt - 1) {
                h[t][k / 2] = _mm256_hadd_epi32(v, _mm256_setzero_si256());   /* the run ends here */
            } else {
                prev[t] = v;
            }
        }
    }
    const __mmask8 used = (__mmask8) ((1u << cnt) - 1);
    for (int t = 0; t < nt; t++) {
        __m256i S, M;
        kq_split_sums4(h[t], &S, &M);
        acc[t] = _mm256_mask3_fmadd_ps(f[t], _mm256_cvtepi32_ps(S), acc[t], used);
        if (!off_mul) {
            acc[t] = _mm256_mask3_fnmadd_ps(g[t], _mm256_cvtepi32_ps(M), acc[t], used);
        }
    }
}
#endif

RM_INLINE void dot_kq_unpacked(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                               void (*unpack)(const void *, int64_t, kq_unpacked *), const int off_mul, const int grouped) {
    const int64_t nb = n / RM_QK_K;
    kq_sum acc[RM_MULTI_MAX];
    kq_unpacked u[KQ_RUN];
    for (int c = 0; c < nc; c++) {
        kq_sum_init(grouped, &acc[c]);
    }
    for (int64_t i0 = 0; i0 < nb; i0 += KQ_RUN) {
        const int64_t i1 = i0 + KQ_RUN < nb ? i0 + KQ_RUN : nb;
        for (int64_t i = i0; i < i1; i++) {
            unpack(w, i, &u[i - i0]);
        }
#ifdef RM_KQ_GROUPED
        if (grouped) {   /* four tokens at a time */
            for (int c = 0; c < nc; c += 4) {
                const rm_block_q8_K * a[4];
                __m256 ac[4];
                const int m = nc - c < 4 ? nc - c : 4;
                for (int t = 0; t < m; t++) {
                    a[t] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) (c + t) * x_stride) + i0;
                    ac[t] = acc[c + t].acc;
                }
                if (m == 4) {
                    kq_run_grouped(u, (int) (i1 - i0), a, 4, off_mul, ac);
                } else if (m == 3) {
                    kq_run_grouped(u, (int) (i1 - i0), a, 3, off_mul, ac);
                } else if (m == 2) {
                    kq_run_grouped(u, (int) (i1 - i0), a, 2, off_mul, ac);
                } else {
                    kq_run_grouped(u, (int) (i1 - i0), a, 1, off_mul, ac);
                }
                for (int t = 0; t < m; t++) {
                    acc[c + t].acc = ac[t];
                }
            }
            continue;
        }
#endif
        for (int c0 = 0; c0 < nc; c0 += 4) {   /* the run is one group of kq_sum's */
            const int m = nc - c0 < 4 ? nc - c0 : 4;
            for (int c = c0; c < c0 + m; c++) {
                kq_sum_begin(KQ_PAIRED, &acc[c]);
            }
            for (int64_t i = i0; i < i1; i++) {
                kq_tokens4(&u[i - i0], (const uint8_t *) x_q + (uint64_t) c0 * x_stride, x_stride, i, (int) (i - i0),
                           acc + c0, off_mul, m);
            }
            for (int c = c0; c < c0 + m; c++) {
                kq_sum_flush(KQ_PAIRED, &acc[c], (int) (i1 - i0), off_mul == 0);
            }
        }
    }
    for (int c = 0; c < nc; c++) {   /* no super-block (n = 0): nothing was summed */
        out[c] = nb > 0 ? kq_sum_out(grouped, &acc[c], off_mul == 0) : 0.0f;
    }
}

/* The table entries of the K-quant kernels above: one token (vec_dot) and several (vec_dot_multi,
 * 1 to 8 tokens; the activation info is for Q8_0 activations and unused here). */
#define RM_KQ_ENTRY_POINTS(t, off_mul, grouped)                                                               \
    static void vec_dot_##t(int64_t n, float * out, const void * w, const void * x_q) {                  \
        dot_##t##_multi(n, out, w, x_q, 0, 1);                                                           \
    }                                                                                                    \
    static void vec_dot_##t##_multi(int64_t n, int nc, float * out, const void * w, const void * x_q,    \
                                    uint64_t x_stride, const float * x_info, int64_t x_info_stride) {    \
        (void) x_info;                                                                                   \
        (void) x_info_stride;                                                                            \
        if (nc == 8) {                                                                                   \
            dot_kq_unpacked(n, 8, out, w, x_q, x_stride, unpack_##t, off_mul, grouped);                         \
        } else if (nc == 4) {                                                                            \
            dot_kq_unpacked(n, 4, out, w, x_q, x_stride, unpack_##t, off_mul, grouped);                         \
        } else if (nc == 3) {                                                                            \
            dot_kq_unpacked(n, 3, out, w, x_q, x_stride, unpack_##t, off_mul, grouped);                         \
        } else if (nc == 2) {                                                                            \
            dot_kq_unpacked(n, 2, out, w, x_q, x_stride, unpack_##t, off_mul, grouped);                         \
        } else {                                                                                         \
            dot_##t##_multi(n, out, w, x_q, x_stride, 1);                                                \
        }                                                                                                \
    }

RM_KQ_ENTRY_POINTS(q2_K, 0, KQ_GROUPED)
RM_KQ_ENTRY_POINTS(q3_K, 4, KQ_GROUPED)
RM_KQ_ENTRY_POINTS(q4_K, 0, KQ_GROUPED)
RM_KQ_ENTRY_POINTS(q5_K, 0, KQ_GROUPED)
RM_KQ_ENTRY_POINTS(q6_K, 32, KQ_GROUPED)

/* ---------------------------------------------------------------------------------------------
 * IQ4_XS against Q8_K, for nc tokens: a sub-block's 32 indices (the low nibbles of 16 qs bytes, then
 * the high ones) look their levels up in the 16-entry table with one byte shuffle; |level| times
 * the activations signed like the level, in int16 pairs (at most 2 * 127 * 127, no saturation),
 * weighted by the sub-block's 6-bit scale less 32 into int32 lanes; one float multiply-add per
 * super-block. The same integers as quants_ref.c's; the floats are summed in eight lanes.
 * ------------------------------------------------------------------------------------------- */
RM_INLINE void dot_iq4_xs_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc) {
    const rm_block_iq4_xs * b = w;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) rm_iq4nl_values));
    const int64_t nb = n / RM_QK_K;
    kq_sum acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        kq_sum_init(KQ_GROUPED, &acc[c]);
    }
    for (int64_t i0 = 0; i0 < nb; i0 += KQ_GROUP(KQ_GROUPED)) {   /* kq_sum's groups */
        const int cnt = nb - i0 < KQ_GROUP(KQ_GROUPED) ? (int) (nb - i0) : KQ_GROUP(KQ_GROUPED);
        for (int c = 0; c < nc; c++) {
            kq_sum_begin(KQ_GROUPED, &acc[c]);
        }
#pragma GCC unroll 8
        for (int k = 0; k < KQ_GROUP(KQ_GROUPED); k++) {
            if (k >= cnt) {
                break;
            }
            const int64_t i = i0 + k;
            if (nc == 1) {
                rm_stream_ahead(&b[i], (int) sizeof(*b));
            }
            const rm_block_q8_K * a[RM_MULTI_MAX];
            __m256i sumi[RM_MULTI_MAX];
            for (int c = 0; c < nc; c++) {
                a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
                sumi[c] = _mm256_setzero_si256();
            }
#ifdef RM_KQ_GROUPED
            /* the AVX-512 set: the eight sub-blocks' scales less 32 made at once in vector lanes,
             * each in both 16-bit halves of mul[j], and broadcast from there */
            uint32_t mul[8];
            {
                uint32_t sl;
                memcpy(&sl, b[i].scales_l, 4);
                const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int) sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                                    _mm256_set1_epi32(0x0f));
                const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[i].scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                                    _mm256_set1_epi32(3));
                const __m256i m = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
                _mm256_storeu_si256((__m256i *) mul, iq_both_halves16(m));
            }
#endif
            for (int j = 0; j < RM_QK_K / 32; j++) {   /* a sub-block's levels once, for every token */
#ifdef RM_KQ_GROUPED
                /* the 16 bytes in both halves, the high nibbles shifted down in the upper one */
                const __m256i q2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (b[i].qs + 16 * j)));
                const __m256i lv = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srlv_epi16(q2, _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0,
                                                                                                                  4, 4, 4, 4, 4, 4, 4, 4)),
                                                                                _mm256_set1_epi8(0x0f)));
                const __m256i s = _mm256_set1_epi32((int) mul[j]);
#else
                const __m128i q = _mm_loadu_si128((const __m128i *) (b[i].qs + 16 * j));
                const __m128i m4 = _mm_set1_epi8(0x0f);
                const __m256i lv = _mm256_shuffle_epi8(table, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                                                                _mm_and_si128(q, m4)));
                const int mul = (((b[i].scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((b[i].scales_h >> (2 * j)) & 3) << 4)) - 32;
                const __m256i s = _mm256_set1_epi16((short) mul);
#endif
                const __m256i alv = _mm256_sign_epi8(lv, lv);
                for (int c = 0; c < nc; c++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *) (a[c]->qs + 32 * j));
                    sumi[c] = RM_KQ_ACC(sumi[c], _mm256_maddubs_epi16(alv, _mm256_sign_epi8(x, lv)), s);
                }
            }
            const float dw = fp16(b[i].d);
            for (int c = 0; c < nc; c++) {
                kq_sum_add(KQ_GROUPED, &acc[c], k, sumi[c], sumi[c], a[c]->d * dw, 0.0f, 0);
            }
        }
        for (int c = 0; c < nc; c++) {
            kq_sum_flush(KQ_GROUPED, &acc[c], cnt, 0);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = kq_sum_out(KQ_GROUPED, &acc[c], 0);
    }
}

static void vec_dot_iq4_xs(int64_t n, float * out, const void * w, const void * x_q) {
    dot_iq4_xs_multi(n, out, w, x_q, 0, 1);
}

/* Several tokens: the same operations per token as vec_dot_iq4_xs, so the same floats. */
static void vec_dot_iq4_xs_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                                 const float * x_info, int64_t x_info_stride) {
    (void) x_info;
    (void) x_info_stride;
    if (nc == 8) {
        dot_iq4_xs_multi(n, out, w, x_q, x_stride, 8);
    } else if (nc == 4) {
        dot_iq4_xs_multi(n, out, w, x_q, x_stride, 4);
    } else {
        for (int c = 0; c < nc; c++) {
            dot_iq4_xs_multi(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1);
        }
    }
}

/* IQ2_XXS and IQ3_XXS against Q8_K, for nc tokens. Per sub-block of 32: the codebook magnitudes
 * (four 8-level IQ2_XXS entries, or eight 4-level IQ3_XXS ones), and a word of four 7-bit sign
 * indices (rm_iq_ksigns: one byte of signs per 8 levels) with the 4-bit scale s on top, mul =
 * 2s + 1. The signs go onto the activations (AVX2: each sign byte spread over its 8 lanes, bit j
 * of lane j tested, then vpsignb; AVX-512: a super-block's sign bytes and multipliers made at
 * once in vector lanes, iq_grid_words, a sub-block's four sign bytes then its mask for a masked
 * subtraction), the magnitudes stay unsigned for vpmaddubsw; the rest is vec_dot_iq4_xs's.
 * step: the power of two of the type's scale (quants_ref.c's IQ_KERNELS). */
/* The float steps are kq_sum's, f = d_x d_w step (so that the AMX tiles give the same floats). */
RM_INLINE void dot_iq_grid(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                            const int kind) {
    const size_t bsize = kind == IQ_GRID_2XXS ? sizeof(rm_block_iq2_xxs) : sizeof(rm_block_iq3_xxs);
    const float step = kind == IQ_GRID_2XXS ? 0.125f : 0.25f;
    const int64_t nb = n / RM_QK_K;
    kq_sum acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        kq_sum_init(KQ_GROUPED, &acc[c]);
    }
    for (int64_t i0 = 0; i0 < nb; i0 += KQ_GROUP(KQ_GROUPED)) {   /* kq_sum's groups */
        const int cnt = nb - i0 < KQ_GROUP(KQ_GROUPED) ? (int) (nb - i0) : KQ_GROUP(KQ_GROUPED);
        for (int c = 0; c < nc; c++) {
            kq_sum_begin(KQ_GROUPED, &acc[c]);
        }
#pragma GCC unroll 8
        for (int k = 0; k < KQ_GROUP(KQ_GROUPED); k++) {
            if (k >= cnt) {
                break;
            }
            const int64_t i = i0 + k;
            if (nc == 1) {
                rm_stream_ahead((const uint8_t *) w + (uint64_t) i * bsize, (int) bsize);
            }
            const uint8_t * blk = (const uint8_t *) w + (uint64_t) i * bsize;
            rm_fp16 d;
            memcpy(&d, blk, sizeof(d));
            const rm_block_q8_K * a[RM_MULTI_MAX];
            __m256i sumi[RM_MULTI_MAX];
            for (int c = 0; c < nc; c++) {
                a[c] = (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + i;
                sumi[c] = _mm256_setzero_si256();
            }
#ifdef RM_KQ_GROUPED
            uint32_t signs[8], mul[8];
            iq_grid_words(iq_grid_ss(blk + sizeof(rm_fp16), kind), signs, mul);
#endif
            for (int j = 0; j < RM_QK_K / 32; j++) {   /* a sub-block decoded once, for every token */
#ifdef RM_KQ_GROUPED
                /* the AVX-512 set: the signs as a mask, the activations of negative levels negated
                 * by a masked subtraction (the same bytes as vpsignb's) */
                const __m256i mag = iq_grid_mag(blk + sizeof(rm_fp16), j, kind);
                const __mmask32 neg = (__mmask32) signs[j];   /* bit 8k + l: bit l of sign byte k */
                const __m256i s = _mm256_set1_epi32((int) mul[j]);
                for (int c = 0; c < nc; c++) {
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *) (a[c]->qs + 32 * j));
                    const __m256i x = _mm256_mask_sub_epi8(x0, neg, _mm256_setzero_si256(), x0);
                    sumi[c] = RM_KQ_ACC(sumi[c], _mm256_maddubs_epi16(mag, x), s);
                }
#else
                __m256i sgn;
                int mul;
                const __m256i mag = iq_grid_sub(blk + sizeof(rm_fp16), j, &sgn, &mul, kind);
                const __m256i s = _mm256_set1_epi16((short) mul);
                for (int c = 0; c < nc; c++) {
                    const __m256i x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) (a[c]->qs + 32 * j)), sgn);
                    sumi[c] = RM_KQ_ACC(sumi[c], _mm256_maddubs_epi16(mag, x), s);
                }
#endif
            }
            const float dw = fp16(d);
            for (int c = 0; c < nc; c++) {
                kq_sum_add(KQ_GROUPED, &acc[c], k, sumi[c], sumi[c], a[c]->d * dw * step, 0.0f, 0);
            }
        }
        for (int c = 0; c < nc; c++) {
            kq_sum_flush(KQ_GROUPED, &acc[c], cnt, 0);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = kq_sum_out(KQ_GROUPED, &acc[c], 0);
    }
}

/* The table entries: one token, and several (the same operations per token, so the same floats) */
#define RM_IQ_GRID_ENTRY_POINTS(t, kind)                                                               \
    static void vec_dot_##t(int64_t n, float * out, const void * w, const void * x_q) {                  \
        dot_iq_grid(n, out, w, x_q, 0, 1, kind);                                                         \
    }                                                                                                    \
    static void vec_dot_##t##_multi(int64_t n, int nc, float * out, const void * w, const void * x_q,    \
                                    uint64_t x_stride, const float * x_info, int64_t x_info_stride) {    \
        (void) x_info;                                                                                   \
        (void) x_info_stride;                                                                            \
        if (nc == 8) {                                                                                   \
            dot_iq_grid(n, out, w, x_q, x_stride, 8, kind);                                              \
        } else if (nc == 4) {                                                                            \
            dot_iq_grid(n, out, w, x_q, x_stride, 4, kind);                                              \
        } else {                                                                                         \
            for (int c = 0; c < nc; c++) {                                                               \
                dot_iq_grid(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1, kind); \
            }                                                                                            \
        }                                                                                                \
    }

RM_IQ_GRID_ENTRY_POINTS(iq2_xxs, IQ_GRID_2XXS)
RM_IQ_GRID_ENTRY_POINTS(iq3_xxs, IQ_GRID_3XXS)

#endif
