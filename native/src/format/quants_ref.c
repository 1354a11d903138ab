/* quants_ref.c - the scalar reference kernels: quantize, dequantize and dot product per type.
 *
 * The quantizers write the same bytes as ggml's reference quantizers (quantize_row_*_ref), so a
 * file written here is the file llama.cpp would write; the dequantizers compute the same floats
 * as ggml's dequantize_row_*. Byte-for-byte agreement depends on the exact float operations and
 * their order, so expressions below keep ggml's grouping (a*b*c is (a*b)*c, sums run in index
 * order), and this file is compiled with -ffp-contract=off: a fused multiply-add rounds once
 * where ggml rounds twice.
 *
 * The dot products are plain and exact in integers; they only have to agree with a float64 dot
 * of the dequantized weights and activations within the stated error budgets (tests).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "iq_grids.h"
#include "types.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define CLAMP(v, lo, hi) MAX((lo), MIN((hi), (v)))

/* Scales below this are "all zero" to ggml's K-quant searches. */
#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even. Adding 1.5 * 2^23 leaves the integer in the low mantissa bits;
 * valid for |v| < 2^22. ggml rounds this way (not roundf, which breaks ties away from zero), and
 * also out of range, where the result is meaningless but must still match. */
static inline int nearest_int(float v) {
    const float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof(bits));
    return (bits & 0x007fffff) - 0x00400000;
}

/* Float to int, truncating, for ggml's (int8_t)/(uint8_t) casts of a level. In range it is the
 * plain cast. A nan or huge value (from a block whose scale overflowed or underflowed) would make
 * the cast undefined; here it gives what x86 gives, INT32_MIN, whose low byte is 0. */
static inline int32_t trunc_int(float v) {
    return v > -2147483648.0f && v < 2147483648.0f ? (int32_t)v : INT32_MIN;
}

/* ---------------------------------------------------------------------------------------------
 * F32, F16, BF16: conversions; the dots take F32 activations and accumulate in double.
 * ------------------------------------------------------------------------------------------- */

void rm_f32_to_float(const void * src, float * dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
void rm_f32_from_float(const float * src, void * dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void rm_f32_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const float * a = w;
    const float * x = x_q;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (double)a[i] * x[i];
    *out = (float)sum;
}

void rm_f16_to_float(const void * src, float * dst, int64_t n) {
    const rm_fp16 * h = src;
    for (int64_t i = 0; i < n; ++i) dst[i] = rm_fp16_to_fp32(h[i]);
}

void rm_f16_from_float(const float * src, void * dst, int64_t n) {
    rm_fp16 * h = dst;
    for (int64_t i = 0; i < n; ++i) h[i] = rm_fp32_to_fp16(src[i]);
}

void rm_f16_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_fp16 * a = w;
    const float * x = x_q;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (double)rm_fp16_to_fp32(a[i]) * x[i];
    *out = (float)sum;
}

void rm_bf16_to_float(const void * src, float * dst, int64_t n) {
    const rm_bf16 * h = src;
    for (int64_t i = 0; i < n; ++i) dst[i] = rm_bf16_to_fp32(h[i]);
}

void rm_bf16_from_float(const float * src, void * dst, int64_t n) {
    rm_bf16 * h = dst;
    for (int64_t i = 0; i < n; ++i) h[i] = rm_fp32_to_bf16(src[i]);
}

void rm_bf16_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_bf16 * a = w;
    const float * x = x_q;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (double)rm_bf16_to_fp32(a[i]) * x[i];
    *out = (float)sum;
}

/* ---------------------------------------------------------------------------------------------
 * 32-element blocks. The "_0" types are symmetric: d maps the element of largest magnitude (with
 * its sign) to the most negative level. The "_1" types are affine: min .. max spread over the levels.
 * The float-to-int conversions truncate after adding 0.5 (ggml's choice); keep them.
 * ------------------------------------------------------------------------------------------- */

/* The first element of largest magnitude, with its sign. */
static float signed_absmax(const float * x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; ++j) {
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    }
    return max;
}

static void min_max(const float * x, int n, float * min, float * max) {
    *min = 3.402823466e38f;
    *max = -3.402823466e38f;
    for (int j = 0; j < n; ++j) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* 5-bit types: bit 4 of element j goes to bit j of qh, the low nibbles pair j with j + 16. */
static void pack_5bit(const uint8_t q[RM_QK], uint8_t qs[RM_QK / 2], uint8_t qh_bytes[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < RM_QK / 2; ++j) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + RM_QK / 2] & 0x0F) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + RM_QK / 2] >> 4) << (j + RM_QK / 2);
    }
    memcpy(qh_bytes, &qh, 4);  /* little-endian in the file */
}

static void unpack_5bit(const uint8_t qs[RM_QK / 2], const uint8_t qh_bytes[4], int q[RM_QK]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < RM_QK / 2; ++j) {
        q[j]             = (qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
        q[j + RM_QK / 2] = (qs[j] >> 4)   | (int)(((qh >> (j + RM_QK / 2)) & 1) << 4);
    }
}

static void unpack_4bit(const uint8_t qs[RM_QK / 2], int q[RM_QK]) {
    for (int j = 0; j < RM_QK / 2; ++j) {
        q[j]             = qs[j] & 0x0F;
        q[j + RM_QK / 2] = qs[j] >> 4;
    }
}

void rm_q4_0_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q4_0 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        const float d  = signed_absmax(x, RM_QK) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = rm_fp32_to_fp16(d);
        uint8_t q[RM_QK];
        for (int j = 0; j < RM_QK; ++j) q[j] = (uint8_t)MIN(15, (int8_t)trunc_int(x[j] * id + 8.5f));
        for (int j = 0; j < RM_QK / 2; ++j) y[i].qs[j] = (uint8_t)(q[j] | (q[j + RM_QK / 2] << 4));
    }
}

void rm_q4_0_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q4_0 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d);
        int q[RM_QK];
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)(q[j] - 8) * d;
    }
}

void rm_q4_0_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q4_0 * b = w;
    const rm_block_q8_0 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) sumi += (q[j] - 8) * a[i].qs[j];
        sum += (float)sumi * (rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

void rm_q4_1_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q4_1 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        float min, max;
        min_max(x, RM_QK, &min, &max);
        const float d  = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = rm_fp32_to_fp16(d);
        y[i].m = rm_fp32_to_fp16(min);
        uint8_t q[RM_QK];
        for (int j = 0; j < RM_QK; ++j) q[j] = (uint8_t)MIN(15, (int8_t)trunc_int((x[j] - min) * id + 0.5f));
        for (int j = 0; j < RM_QK / 2; ++j) y[i].qs[j] = (uint8_t)(q[j] | (q[j + RM_QK / 2] << 4));
    }
}

void rm_q4_1_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q4_1 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d), m = rm_fp16_to_fp32(b[i].m);
        int q[RM_QK];
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)q[j] * d + m;
    }
}

void rm_q4_1_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q4_1 * b = w;
    const rm_block_q8_1 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) sumi += q[j] * a[i].qs[j];
        /* sum((d q + m) x) = d dx sum(q qx) + m sum(x), and a.s holds sum(x) */
        sum += rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d) * (float)sumi
             + rm_fp16_to_fp32(b[i].m) * rm_fp16_to_fp32(a[i].s);
    }
    *out = sum;
}

void rm_q5_0_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q5_0 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        const float d  = signed_absmax(x, RM_QK) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = rm_fp32_to_fp16(d);
        uint8_t q[RM_QK];
        for (int j = 0; j < RM_QK; ++j) q[j] = (uint8_t)MIN(31, (int8_t)trunc_int(x[j] * id + 16.5f));
        pack_5bit(q, y[i].qs, y[i].qh);
    }
}

void rm_q5_0_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q5_0 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d);
        int q[RM_QK];
        unpack_5bit(b[i].qs, b[i].qh, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)(q[j] - 16) * d;
    }
}

void rm_q5_0_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q5_0 * b = w;
    const rm_block_q8_0 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_5bit(b[i].qs, b[i].qh, q);
        for (int j = 0; j < RM_QK; ++j) sumi += (q[j] - 16) * a[i].qs[j];
        sum += (float)sumi * (rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

void rm_q5_1_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q5_1 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        float min, max;
        min_max(x, RM_QK, &min, &max);
        const float d  = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = rm_fp32_to_fp16(d);
        y[i].m = rm_fp32_to_fp16(min);
        uint8_t q[RM_QK];
        for (int j = 0; j < RM_QK; ++j) q[j] = (uint8_t)trunc_int((x[j] - min) * id + 0.5f);  /* no clamp, as ggml */
        pack_5bit(q, y[i].qs, y[i].qh);
    }
}

void rm_q5_1_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q5_1 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d), m = rm_fp16_to_fp32(b[i].m);
        int q[RM_QK];
        unpack_5bit(b[i].qs, b[i].qh, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)q[j] * d + m;
    }
}

void rm_q5_1_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q5_1 * b = w;
    const rm_block_q8_1 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_5bit(b[i].qs, b[i].qh, q);
        for (int j = 0; j < RM_QK; ++j) sumi += q[j] * a[i].qs[j];
        sum += rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d) * (float)sumi
             + rm_fp16_to_fp32(b[i].m) * rm_fp16_to_fp32(a[i].s);
    }
    *out = sum;
}

/* Q8_0 and Q8_1 round with roundf (ties away from zero), as ggml does for these two. */
static float quantize_8bit(const float * x, int8_t qs[RM_QK]) {
    float amax = 0;
    for (int j = 0; j < RM_QK; ++j) amax = MAX(amax, fabsf(x[j]));
    const float d  = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < RM_QK; ++j) qs[j] = (int8_t)trunc_int(roundf(x[j] * id));
    return d;
}

void rm_q8_0_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q8_0 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) y[i].d = rm_fp32_to_fp16(quantize_8bit(x, y[i].qs));
}

void rm_q8_0_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q8_0 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)b[i].qs[j] * d;
    }
}

void rm_q8_0_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q8_0 * b = w;
    const rm_block_q8_0 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int sumi = 0;
        for (int j = 0; j < RM_QK; ++j) sumi += b[i].qs[j] * a[i].qs[j];
        sum += (float)sumi * (rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

void rm_q8_1_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q8_1 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        const float d = quantize_8bit(x, y[i].qs);
        int sum = 0;
        for (int j = 0; j < RM_QK; ++j) sum += y[i].qs[j];
        y[i].d = rm_fp32_to_fp16(d);
        y[i].s = rm_fp32_to_fp16((float)sum * d);
    }
}

void rm_q8_1_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q8_1 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d);
        for (int j = 0; j < RM_QK; ++j) y[j] = (float)b[i].qs[j] * d;
    }
}

/* Q8_1 is an activation type; its dot against itself is here to keep the table uniform. */
void rm_q8_1_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q8_1 * b = w;
    const rm_block_q8_1 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int sumi = 0;
        for (int j = 0; j < RM_QK; ++j) sumi += b[i].qs[j] * a[i].qs[j];
        sum += (float)sumi * (rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

/* ---------------------------------------------------------------------------------------------
 * K-quants: super-blocks of 256 with per-sub-block scales that are themselves quantized against
 * one fp16 scale (and for the affine types one fp16 min scale). Each quantizer (1) fits every
 * sub-block alone, (2) quantizes the sub-block scales, (3) requantizes the elements against the
 * scales as stored, then packs. Sub-blocks whose stored scale is 0 keep the levels of step 1.
 * ------------------------------------------------------------------------------------------- */

/* Affine fit for Q2_K/Q4_K/Q5_K: x[i] ~ scale * L[i] - min with L[i] in 0..nmax and min >= 0.
 * Tries nstep + 1 scales (nmax + rmin + rdelta * is) / (max - min) around the plain one; for
 * each rounding, solves weighted least squares for (scale, min) and keeps the best weighted
 * error (squared, or absolute with use_mad). Returns the scale; *neg_min gets the min. */
static float fit_affine(int n, int nmax, const float * x, const float * w, uint8_t * L, float * neg_min,
                        float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)CLAMP(nearest_int(iscale * (x[i] - min)), 0, nmax);
        const float diff = scale * L[i] + min - x[i];
        best_err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    uint8_t Lt[32];
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = CLAMP(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Lt[i] = (uint8_t)l;
            sum_l  += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min   = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float diff = this_scale * Lt[i] + this_min - x[i];
            err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (err < best_err) {
            memcpy(L, Lt, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* The element of largest magnitude, with its sign; 0 when the group is (numerically) all zero. */
static float group_signed_max(const float * x, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; ++i) {
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    }
    return amax < GROUP_MAX_EPS ? 0.0f : max;
}

/* Symmetric fit for Q6_K: x[i] ~ scale * (L[i] - nmax), L[i] in 0..2*nmax-1, weights x^2.
 * Tries 19 scales around -nmax/max and keeps the one whose least-squares scale explains the
 * most weighted energy (sumlx^2 / suml2). */
static float fit_symmetric(int n, int nmax, const float * x, int8_t * L) {
    const float max = group_signed_max(x, n);
    if (max == 0) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx = 0, suml2 = 0;
    float iscale = -nmax / max;
    for (int i = 0; i < n; ++i) {
        const int l = CLAMP(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = CLAMP(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + CLAMP(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit for Q3_K: start from rounding at -nmax/max, then up to 5 sweeps of coordinate
 * descent moving one level at a time while that raises sumlx^2 / suml2 (weights x^2). */
static float fit_symmetric_descent(int n, int nmax, const float * x, int8_t * L) {
    const float max = group_signed_max(x, n);
    if (max == 0) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = CLAMP(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int new_l = CLAMP(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (new_l == L[i]) continue;
            slx += w * x[i] * new_l;
            sl2 += w * new_l * new_l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)new_l;
                sumlx = slx;
                suml2 = sl2;
                ++n_changed;
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Q2_K and Q3_K store 2-bit fields: qs[32*h + l] holds element 128*h + 32*g + l at bits 2g. */
static void pack_2bit(const uint8_t L[RM_QK_K], uint8_t qs[RM_QK_K / 4]) {
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t * e = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
        }
}

static uint8_t get_2bit(const uint8_t qs[RM_QK_K / 4], int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* Q4_K/Q5_K: eight 6-bit scales and mins in 12 bytes. Bytes 0-3 hold scales 0-3, bytes 4-7
 * mins 0-3, bytes 8-11 the low nibbles of scale and min 4-7; the high 2 bits of scale and min
 * 4-7 sit in the top 2 bits of bytes 0-3 and 4-7. */
static void pack_scale_min_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t q[12]) {
    for (int j = 0; j < 4; ++j) {
        q[j]     = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

static void unpack_scale_min_k4(const uint8_t q[12], int j, uint8_t * sc, uint8_t * mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4)  | ((q[j] >> 6) << 4));
    }
}

/* Q3_K: sixteen 6-bit scales (stored + 32) in 12 bytes: low nibbles of 0-7 in bytes 0-7, of
 * 8-15 in the high nibbles of bytes 0-7; the high 2 bits of scale j at byte 8 + j%4, bit 2*(j/4). */
static void pack_scales_q3_K(const int ls[16], uint8_t q[12]) {
    memset(q, 0, 12);
    for (int j = 0; j < 16; ++j) {
        q[j % 8] |= (uint8_t)((ls[j] & 0xF) << (j < 8 ? 0 : 4));
        q[8 + j % 4] |= (uint8_t)((ls[j] >> 4) << (2 * (j / 4)));
    }
}

static int get_scale_q3_K(const uint8_t q[12], int j) {
    const int lo = (q[j % 8] >> (j < 8 ? 0 : 4)) & 0xF;
    const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

void rm_q2_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q2_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        uint8_t L[RM_QK_K];
        float scales[16], mins[16], w[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) w[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* 4-bit sub-block scales (low nibble) and mins (high nibble) */
        memset(y[i].scales, 0, 16);
        y[i].d = rm_fp32_to_fp16(max_scale > 0 ? max_scale / 15 : 0.0f);
        y[i].dmin = rm_fp32_to_fp16(max_min > 0 ? max_min / 15 : 0.0f);
        if (max_scale > 0) {
            const float iscale = 15 / max_scale;
            for (int j = 0; j < 16; ++j) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        }
        if (max_min > 0) {
            const float iscale = 15 / max_min;
            for (int j = 0; j < 16; ++j) y[i].scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = rm_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = rm_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (uint8_t)CLAMP(nearest_int((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

static void unpack_q2_K(const rm_block_q2_K * b, int q[RM_QK_K]) {
    for (int e = 0; e < RM_QK_K; ++e) q[e] = get_2bit(b->qs, e);
}

void rm_q2_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q2_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K) {
        const float d = rm_fp16_to_fp32(b[i].d), dmin = rm_fp16_to_fp32(b[i].dmin);
        int q[RM_QK_K];
        unpack_q2_K(&b[i], q);
        for (int j = 0; j < 16; ++j) {
            const float dl = d * (b[i].scales[j] & 0xF), ml = dmin * (b[i].scales[j] >> 4);
            for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * (float)q[16 * j + l] - ml;
        }
    }
}

void rm_q2_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q2_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int q[RM_QK_K], sumi = 0, summ = 0;
        unpack_q2_K(&b[i], q);
        for (int j = 0; j < 16; ++j) {
            int dot = 0;
            for (int l = 0; l < 16; ++l) dot += q[16 * j + l] * a[i].qs[16 * j + l];
            sumi += (b[i].scales[j] & 0xF) * dot;
            summ += (b[i].scales[j] >> 4) * a[i].bsums[j];
        }
        sum += a[i].d * (rm_fp16_to_fp32(b[i].d) * (float)sumi - rm_fp16_to_fp32(b[i].dmin) * (float)summ);
    }
    *out = sum;
}

void rm_q3_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q3_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        int8_t L[RM_QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_symmetric_descent(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) { amax = fabsf(scales[j]); max_scale = scales[j]; }
        }
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            int ls[16];
            /* the int8_t narrowing is ggml's; it only matters for non-finite scales */
            for (int j = 0; j < 16; ++j) ls[j] = CLAMP((int8_t)nearest_int(iscale * scales[j]), -32, 31) + 32;
            pack_scales_q3_K(ls, y[i].scales);
            y[i].d = rm_fp32_to_fp16(1 / iscale);
        } else {
            memset(y[i].scales, 0, 12);
            y[i].d = rm_fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = rm_fp16_to_fp32(y[i].d) * (float)get_scale_q3_K(y[i].scales, j);
            if (!d) continue;
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(CLAMP(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* levels 0..7: the high bit of element e goes to hmask[e % 32] bit e / 32 */
        uint8_t low[RM_QK_K];
        memset(y[i].hmask, 0, sizeof(y[i].hmask));
        for (int e = 0; e < RM_QK_K; ++e) {
            if (L[e] > 3) y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            low[e] = (uint8_t)(L[e] & 3);
        }
        pack_2bit(low, y[i].qs);
    }
}

static void unpack_q3_K(const rm_block_q3_K * b, int q[RM_QK_K]) {
    for (int e = 0; e < RM_QK_K; ++e) {
        const int high = (b->hmask[e % 32] >> (e / 32)) & 1;
        q[e] = get_2bit(b->qs, e) - (high ? 0 : 4);
    }
}

void rm_q3_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q3_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K) {
        const float d = rm_fp16_to_fp32(b[i].d);
        int q[RM_QK_K];
        unpack_q3_K(&b[i], q);
        for (int j = 0; j < 16; ++j) {
            const float dl = d * (float)get_scale_q3_K(b[i].scales, j);
            for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * (float)q[16 * j + l];
        }
    }
}

void rm_q3_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q3_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int q[RM_QK_K], sumi = 0;
        unpack_q3_K(&b[i], q);
        for (int j = 0; j < 16; ++j) {
            int dot = 0;
            for (int l = 0; l < 16; ++l) dot += q[16 * j + l] * a[i].qs[16 * j + l];
            sumi += get_scale_q3_K(b[i].scales, j) * dot;
        }
        sum += a[i].d * rm_fp16_to_fp32(b[i].d) * (float)sumi;
    }
    *out = sum;
}

/* Q4_K and Q5_K share everything but the number of levels (nmax) and the search range. */
static void quantize_k4(const float * x, int nmax, float rmin, int nstep, rm_fp16 * d_out, rm_fp16 * dmin_out,
                        uint8_t scales_out[12], uint8_t L[RM_QK_K]) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        const float * xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) w[l] = av_x + fabsf(xj[l]);
        scales[j] = fit_affine(32, nmax, xj, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min   = max_min   > 0 ? 63.f / max_min   : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
        ls[j] = MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));  /* the uint8_t wrap is ggml's */
        lm[j] = MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
    }
    pack_scale_min_k4(ls, lm, scales_out);
    *d_out = rm_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = rm_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        unpack_scale_min_k4(scales_out, j, &sc, &m);
        const float d = rm_fp16_to_fp32(*d_out) * sc;
        if (!d) continue;
        const float dm = rm_fp16_to_fp32(*dmin_out) * m;
        for (int l = 0; l < 32; ++l) L[32 * j + l] = (uint8_t)CLAMP(nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

/* Element 64*p + l is in the low nibble of qs[32*p + l], element 64*p + 32 + l in the high one. */
static int k4_nibble(const uint8_t qs[RM_QK_K / 2], int e) {
    const uint8_t byte = qs[32 * (e / 64) + e % 32];
    return (e % 64) < 32 ? byte & 0xF : byte >> 4;
}

void rm_q4_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q4_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        uint8_t L[RM_QK_K];
        quantize_k4(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int p = 0; p < 4; ++p)
            for (int l = 0; l < 32; ++l) y[i].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
    }
}

static void unpack_q4_K(const rm_block_q4_K * b, int q[RM_QK_K]) {
    for (int e = 0; e < RM_QK_K; ++e) q[e] = k4_nibble(b->qs, e);
}

void rm_q4_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q4_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K) {
        const float d = rm_fp16_to_fp32(b[i].d), dmin = rm_fp16_to_fp32(b[i].dmin);
        int q[RM_QK_K];
        unpack_q4_K(&b[i], q);
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, m;
            unpack_scale_min_k4(b[i].scales, j, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * (float)q[32 * j + l] - ml;
        }
    }
}

/* Shared by Q4_K and Q5_K once the levels are unpacked. */
static float dot_k4_block(const int q[RM_QK_K], const uint8_t scales[12], rm_fp16 d, rm_fp16 dmin,
                          const rm_block_q8_K * a) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        unpack_scale_min_k4(scales, j, &sc, &m);
        int dot = 0;
        for (int l = 0; l < 32; ++l) dot += q[32 * j + l] * a->qs[32 * j + l];
        sumi += sc * dot;
        summ += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    return a->d * (rm_fp16_to_fp32(d) * (float)sumi - rm_fp16_to_fp32(dmin) * (float)summ);
}

void rm_q4_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q4_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int q[RM_QK_K];
        unpack_q4_K(&b[i], q);
        sum += dot_k4_block(q, b[i].scales, b[i].d, b[i].dmin, &a[i]);
    }
    *out = sum;
}

void rm_q5_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q5_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        uint8_t L[RM_QK_K];
        quantize_k4(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int p = 0; p < 4; ++p)
            for (int l = 0; l < 32; ++l) {
                const uint8_t lo = L[64 * p + l], hi = L[64 * p + 32 + l];
                y[i].qs[32 * p + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
            }
    }
}

static void unpack_q5_K(const rm_block_q5_K * b, int q[RM_QK_K]) {
    for (int e = 0; e < RM_QK_K; ++e) {
        const int bit = 2 * (e / 64) + (e % 64) / 32;
        q[e] = k4_nibble(b->qs, e) | (((b->qh[e % 32] >> bit) & 1) << 4);
    }
}

void rm_q5_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q5_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K) {
        const float d = rm_fp16_to_fp32(b[i].d), dmin = rm_fp16_to_fp32(b[i].dmin);
        int q[RM_QK_K];
        unpack_q5_K(&b[i], q);
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, m;
            unpack_scale_min_k4(b[i].scales, j, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * (float)q[32 * j + l] - ml;
        }
    }
}

void rm_q5_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q5_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int q[RM_QK_K];
        unpack_q5_K(&b[i], q);
        sum += dot_k4_block(q, b[i].scales, b[i].d, b[i].dmin, &a[i]);
    }
    *out = sum;
}

void rm_q6_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q6_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        int8_t L[RM_QK_K];
        float scales[16];
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) { max_abs_scale = fabsf(scales[j]); max_scale = scales[j]; }
        }
        memset(&y[i], 0, sizeof(y[i]));
        if (max_abs_scale < GROUP_MAX_EPS) continue;  /* an all-zero block */
        const float iscale = -128.f / max_scale;
        y[i].d = rm_fp32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; ++j) y[i].scales[j] = (int8_t)MIN(127, nearest_int(iscale * scales[j]));
        for (int j = 0; j < 16; ++j) {
            const float d = rm_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; ++l) L[16 * j + l] = (int8_t)(CLAMP(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
        }
        /* element 128*h + 32*g + l: low nibble in ql[64*h + 32*(g%2) + l] (g >= 2 in the high
         * nibble), high 2 bits in qh[32*h + l] at bits 2g */
        for (int e = 0; e < RM_QK_K; ++e) {
            const int h = e / 128, g = (e % 128) / 32, l = e % 32;
            y[i].ql[64 * h + 32 * (g % 2) + l] |= (uint8_t)((L[e] & 0xF) << (g < 2 ? 0 : 4));
            y[i].qh[32 * h + l] |= (uint8_t)((L[e] >> 4) << (2 * g));
        }
    }
}

static void unpack_q6_K(const rm_block_q6_K * b, int q[RM_QK_K]) {
    for (int e = 0; e < RM_QK_K; ++e) {
        const int h = e / 128, g = (e % 128) / 32, l = e % 32;
        const int lo = (b->ql[64 * h + 32 * (g % 2) + l] >> (g < 2 ? 0 : 4)) & 0xF;
        const int hi = (b->qh[32 * h + l] >> (2 * g)) & 3;
        q[e] = (lo | (hi << 4)) - 32;
    }
}

void rm_q6_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q6_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K) {
        const float d = rm_fp16_to_fp32(b[i].d);
        int q[RM_QK_K];
        unpack_q6_K(&b[i], q);
        for (int e = 0; e < RM_QK_K; ++e) y[e] = d * (float)b[i].scales[e / 16] * (float)q[e];
    }
}

void rm_q6_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q6_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int q[RM_QK_K], sumi = 0;
        unpack_q6_K(&b[i], q);
        for (int j = 0; j < 16; ++j) {
            int dot = 0;
            for (int l = 0; l < 16; ++l) dot += q[16 * j + l] * a[i].qs[16 * j + l];
            sumi += b[i].scales[j] * dot;
        }
        sum += a[i].d * rm_fp16_to_fp32(b[i].d) * (float)sumi;
    }
    *out = sum;
}

/* Q8_K: one float scale per 256, levels -127..127 (ggml's choice over -128, so that SIMD dots
 * can negate freely), rounded with nearest_int; bsums feed the K-quants' min terms. */
void rm_q8_K_from_float(const float * x, void * dst, int64_t n) {
    rm_block_q8_K * y = dst;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, x += RM_QK_K) {
        float amax = 0, max = 0;
        for (int e = 0; e < RM_QK_K; ++e) {
            if (fabsf(x[e]) > amax) { amax = fabsf(x[e]); max = x[e]; }
        }
        memset(&y[i], 0, sizeof(y[i]));
        if (!amax) continue;
        const float iscale = -127.f / max;
        for (int e = 0; e < RM_QK_K; ++e) y[i].qs[e] = (int8_t)MIN(127, nearest_int(iscale * x[e]));
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void rm_q8_K_to_float(const void * src, float * y, int64_t n) {
    const rm_block_q8_K * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, y += RM_QK_K)
        for (int e = 0; e < RM_QK_K; ++e) y[e] = b[i].d * (float)b[i].qs[e];
}

void rm_q8_K_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_q8_K * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i) {
        int sumi = 0;
        for (int e = 0; e < RM_QK_K; ++e) sumi += b[i].qs[e] * a[i].qs[e];
        sum += b[i].d * a[i].d * (float)sumi;
    }
    *out = sum;
}

/* ---------------------------------------------------------------------------------------------
 * MXFP4: 32 E2M1 levels and one E8M0 exponent per block.
 * ------------------------------------------------------------------------------------------- */

/* The level nearest x / d; ties go to the lower index (so +0 before -0), as ggml's search does. */
static int mxfp4_best_index(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)rm_mxfp4_values[0] * d - x);
    for (int k = 1; k < 16; ++k) {
        const float err = fabsf((float)rm_mxfp4_values[k] * d - x);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return best;
}

/* The exponent puts the block's largest magnitude among the top levels: e = floor(log2(amax)) - 2
 * + 127, so amax / 2^(e - 127) lies in [4, 8) and the largest level, 6, stands for it or near it.
 * ggml computes it with log2f and casts the float to uint8_t; out of that range (amax below 2^-125
 * or inf) the cast is undefined, and here it takes the low byte of what x86 gives, as numpy does. */
void rm_mxfp4_from_float(const float * x, void * dst, int64_t n) {
    rm_block_mxfp4 * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        float amax = 0;   /* a nan element is skipped, as in ggml */
        for (int j = 0; j < RM_QK; ++j)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0 ? (uint8_t)trunc_int(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = rm_e8m0_to_fp32_half(e);
        y[i].e = e;
        for (int j = 0; j < RM_QK / 2; ++j)
            y[i].qs[j] = (uint8_t)(mxfp4_best_index(x[j], d) | (mxfp4_best_index(x[j + RM_QK / 2], d) << 4));
    }
}

void rm_mxfp4_to_float(const void * src, float * y, int64_t n) {
    const rm_block_mxfp4 * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_e8m0_to_fp32_half(b[i].e);
        int q[RM_QK];
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = d * (float)rm_mxfp4_values[q[j]];
    }
}

void rm_mxfp4_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_mxfp4 * b = w;
    const rm_block_q8_0 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) sumi += rm_mxfp4_values[q[j]] * a[i].qs[j];
        sum += (float)sumi * (rm_e8m0_to_fp32_half(b[i].e) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

/* ---------------------------------------------------------------------------------------------
 * The IQ types: levels from codebooks (iq_grids.h, generated from gguf-py); IQ4_NL's quantizer
 * here, IQ2_XXS's and IQ3_XXS's in quants_iq.c.
 * ------------------------------------------------------------------------------------------- */

/* The indices of IQ4_NL's levels nearest id * x[j] for a block: the count of the midpoints
 * between adjacent levels that the value lies above (a tie goes to the lower level), a loop the
 * compiler vectorizes over the block. */
static void iq4nl_nearest(const float * x, float id, int q[RM_QK]) {
    for (int j = 0; j < RM_QK; ++j) q[j] = 0;
    for (int k = 0; k < 15; ++k) {
        const float mid = 0.5f * (float)(rm_iq4nl_values[k] + rm_iq4nl_values[k + 1]);
        for (int j = 0; j < RM_QK; ++j) q[j] += id * x[j] > mid;
    }
}

/* IQ4_NL: for a block of 32, x ~ d * levels[q]. The scale is searched: each trial inverse scale
 * maps the element of largest magnitude onto one of the levels near the table's ends, every
 * element takes its nearest level, and the least-squares d of that choice, B / A (A = sum w q^2,
 * B = sum w x q), scores B^2 / A, the error it removes; the best trial's d is stored (fp16) and
 * the levels chosen again at that d. Weights w: the importance of the element's column times
 * sqrt(mean square + x^2) with one, else x^2 (the large elements matter most to a dot product).
 * As a KV cache type it is quantized one row at a time (IQ4NL_TRIALS trials each side). */
#define IQ4NL_TRIALS 7

void rm_iq4_nl_quantize(const float * x, void * dst, int64_t n, const float * imp) {
    rm_block_iq4_nl * y = dst;
    for (int64_t i = 0; i < n / RM_QK; ++i, x += RM_QK) {
        float w[RM_QK], amax = 0.0f, max = 0.0f, ms = 0.0f;
        for (int j = 0; j < RM_QK; ++j) ms += x[j] * x[j];
        ms *= 2.0f / RM_QK;
        for (int j = 0; j < RM_QK; ++j) {
            w[j] = imp ? imp[i * RM_QK + j] * sqrtf(ms + x[j] * x[j]) : x[j] * x[j];
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = 0.0f;
        if (amax > 1e-15f) {
            float best = -1.0f;
            for (int t = -IQ4NL_TRIALS; t <= IQ4NL_TRIALS; ++t) {   /* t = 0: max onto the lowest level */
                int l[RM_QK];
                iq4nl_nearest(x, (float)(t + rm_iq4nl_values[0]) / max, l);
                float a = 0.0f, b = 0.0f;
                for (int j = 0; j < RM_QK; ++j) {
                    const float q = (float)rm_iq4nl_values[l[j]];
                    a += w[j] * q * q;
                    b += w[j] * q * x[j];
                }
                if (a > 0.0f && b * b > best * a) {
                    best = b * b / a;
                    d = b / a;
                }
            }
        }
        y[i].d = rm_fp32_to_fp16(d);
        const float dh = rm_fp16_to_fp32(y[i].d), id = dh != 0.0f ? 1.0f / dh : 0.0f;
        int q[RM_QK];
        iq4nl_nearest(x, id, q);
        for (int j = 0; j < RM_QK / 2; ++j) y[i].qs[j] = (uint8_t)(q[j] | (q[j + RM_QK / 2] << 4));
    }
}

void rm_iq4_nl_from_float(const float * x, void * dst, int64_t n) { rm_iq4_nl_quantize(x, dst, n, NULL); }

/* IQ4_NL: Q4_0's layout with a non-linear level table in place of q - 8. */
void rm_iq4_nl_to_float(const void * src, float * y, int64_t n) {
    const rm_block_iq4_nl * b = src;
    for (int64_t i = 0; i < n / RM_QK; ++i, y += RM_QK) {
        const float d = rm_fp16_to_fp32(b[i].d);
        int q[RM_QK];
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) y[j] = d * (float)rm_iq4nl_values[q[j]];
    }
}

void rm_iq4_nl_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_block_iq4_nl * b = w;
    const rm_block_q8_0 * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK; ++i) {
        int q[RM_QK], sumi = 0;
        unpack_4bit(b[i].qs, q);
        for (int j = 0; j < RM_QK; ++j) sumi += rm_iq4nl_values[q[j]] * a[i].qs[j];
        sum += (float)sumi * (rm_fp16_to_fp32(b[i].d) * rm_fp16_to_fp32(a[i].d));
    }
    *out = sum;
}

/* The super-block IQ types all come down to one form: x[e] = d * mul[e / 16] * step * lv[e], with
 * mul and lv integers (lv the signed codebook level, mul the sub-block's scale) and step a power of
 * two per type. Each type's decoder only unpacks its bits into that form; one to_float and one dot
 * serve them all. The dot stays in integers up to the block's last multiply.
 *
 * gguf-py's float order, for the byte-exact dequantize: it computes the sub-block scale first
 * (d * (0.5 + s) * 0.25 for IQ2_XXS, d * (1 + 2s) for IQ3_S, ...) and multiplies the level last.
 * (d * mul) * step is that same float: the scale is mul * step exactly ((0.5 + s) * 0.25 is
 * (2s + 1) * 0.125), and scaling by a power of two commutes with rounding (fp16 scales never
 * underflow a float32). The IQ1 types' level g + delta (delta = +-1/8) is lv / 8 with
 * lv = 8g +- 1, exact too. */
typedef float (*iq_decode_fn)(const void * block, int mul[RM_QK_K / 16], int lv[RM_QK_K]);

static void iq_to_float(iq_decode_fn decode, size_t block_bytes, float step, const void * src, float * y, int64_t n) {
    const uint8_t * b = src;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, b += block_bytes, y += RM_QK_K) {
        int mul[RM_QK_K / 16], lv[RM_QK_K];
        const float d = decode(b, mul, lv);
        for (int e = 0; e < RM_QK_K; ++e) y[e] = d * (float)mul[e / 16] * step * (float)lv[e];
    }
}

static void iq_vec_dot(iq_decode_fn decode, size_t block_bytes, float step, int64_t n, float * out,
                       const void * w, const void * x_q) {
    const uint8_t * b = w;
    const rm_block_q8_K * a = x_q;
    float sum = 0;
    for (int64_t i = 0; i < n / RM_QK_K; ++i, b += block_bytes) {
        int mul[RM_QK_K / 16], lv[RM_QK_K], sumi = 0;
        const float d = decode(b, mul, lv);
        for (int j = 0; j < RM_QK_K / 16; ++j) {
            int dot = 0;
            for (int l = 0; l < 16; ++l) dot += lv[16 * j + l] * a[i].qs[16 * j + l];
            sumi += mul[j] * dot;
        }
        sum += a[i].d * d * (float)sumi * step;
    }
    *out = sum;
}

static uint32_t load_u32(const uint8_t * p) { uint32_t v; memcpy(&v, p, sizeof(v)); return v; }

/* Group of 8 levels from a grid entry, signed by a bit mask (bit j set: element j negative). */
static void signed_group(const uint8_t grid[8], uint8_t signs, int lv[8]) {
    for (int j = 0; j < 8; ++j) lv[j] = (signs >> j) & 1 ? -grid[j] : grid[j];
}

/* IQ4_XS: mul the 6-bit scale less 32, lv the non-linear level */
static float decode_iq4_xs(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq4_xs * b = block;
    for (int j = 0; j < RM_QK_K / 32; ++j) {
        const int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF, hi = (b->scales_h >> (2 * j)) & 3;
        mul[2 * j] = mul[2 * j + 1] = (lo | (hi << 4)) - 32;
        int q[32];
        unpack_4bit(b->qs + 16 * j, q);
        for (int l = 0; l < 32; ++l) lv[32 * j + l] = rm_iq4nl_values[q[l]];
    }
    return rm_fp16_to_fp32(b->d);
}

/* IQ2_XXS and IQ3_XXS: per 32 a word of 4 x 7 sign bits (rm_iq_ksigns) and a 4-bit scale s on
 * top; mul = 2s + 1. IQ2_XXS's indices are the 4 bytes before the word, IQ3_XXS's 8 bytes of qs. */
static float decode_iq2_xxs(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq2_xxs * b = block;
    const uint8_t * q = (const uint8_t *)b->qs;
    for (int j = 0; j < RM_QK_K / 32; ++j, q += 8) {
        const uint32_t ss = load_u32(q + 4);
        mul[2 * j] = mul[2 * j + 1] = (int)(2 * (ss >> 28) + 1);
        for (int g = 0; g < 4; ++g) signed_group(rm_iq2xxs_grid[q[g]], rm_iq_ksigns[(ss >> (7 * g)) & 127], lv + 32 * j + 8 * g);
    }
    return rm_fp16_to_fp32(b->d);
}

static float decode_iq3_xxs(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq3_xxs * b = block;
    for (int j = 0; j < RM_QK_K / 32; ++j) {
        const uint32_t ss = load_u32(b->qs + RM_QK_K / 4 + 4 * j);
        mul[2 * j] = mul[2 * j + 1] = (int)(2 * (ss >> 28) + 1);
        for (int g = 0; g < 4; ++g) {
            uint8_t grid[8];   /* two entries of 4 */
            memcpy(grid, rm_iq3xxs_grid[b->qs[8 * j + 2 * g]], 4);
            memcpy(grid + 4, rm_iq3xxs_grid[b->qs[8 * j + 2 * g + 1]], 4);
            signed_group(grid, rm_iq_ksigns[(ss >> (7 * g)) & 127], lv + 32 * j + 8 * g);
        }
    }
    return rm_fp16_to_fp32(b->d);
}

/* IQ2_XS: per 8 a uint16, 9 bits of index and 7 sign bits; a 4-bit scale per 16, mul = 2s + 1 */
static float decode_iq2_xs(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq2_xs * b = block;
    for (int k = 0; k < RM_QK_K / 16; ++k) mul[k] = 2 * ((b->scales[k / 2] >> (4 * (k % 2))) & 0xF) + 1;
    for (int g = 0; g < RM_QK_K / 8; ++g)
        signed_group(rm_iq2xs_grid[b->qs[g] & 511], rm_iq_ksigns[b->qs[g] >> 9], lv + 8 * g);
    return rm_fp16_to_fp32(b->d);
}

/* IQ2_S: per 8 a 10-bit index (a byte of qs, 2 bits of qh) and a byte of plain sign bits */
static float decode_iq2_s(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq2_s * b = block;
    for (int k = 0; k < RM_QK_K / 16; ++k) mul[k] = 2 * ((b->scales[k / 2] >> (4 * (k % 2))) & 0xF) + 1;
    for (int g = 0; g < RM_QK_K / 8; ++g) {
        const int idx = b->qs[g] | (((b->qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
        signed_group(rm_iq2s_grid[idx], b->signs[g], lv + 8 * g);
    }
    return rm_fp16_to_fp32(b->d);
}

/* IQ3_S: per 4 a 9-bit index (a byte of qs, a bit of qh); a sign bit per element; a 4-bit scale
 * per 32, mul = 2s + 1 */
static float decode_iq3_s(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq3_s * b = block;
    for (int k = 0; k < RM_QK_K / 16; ++k) mul[k] = 2 * ((b->scales[k / 4] >> (4 * ((k / 2) % 2))) & 0xF) + 1;
    for (int g = 0; g < RM_QK_K / 8; ++g) {
        uint8_t grid[8];
        for (int h = 0; h < 2; ++h) {
            const int q = 2 * g + h, idx = b->qs[q] | (((b->qh[q / 8] >> (q % 8)) & 1) << 8);
            memcpy(grid + 4 * h, rm_iq3s_grid[idx], 4);
        }
        signed_group(grid, b->signs[g], lv + 8 * g);
    }
    return rm_fp16_to_fp32(b->d);
}

/* IQ1_S and IQ1_M: levels -1, 0, 1 shifted by delta = +-1/8 (a set sign bit means -1/8), so
 * lv = 8 * level + (+-1); per 8 an 11-bit index. */
static void iq1_group(int idx, int neg_delta, int lv[8]) {
    for (int j = 0; j < 8; ++j) lv[j] = 8 * rm_iq1s_grid[idx][j] + (neg_delta ? -1 : 1);
}

/* IQ1_S: per 32 a uint16 of qh: 4 x 3 index bits, a 3-bit scale s (mul = 2s + 1), the delta sign */
static float decode_iq1_s(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq1_s * b = block;
    for (int j = 0; j < RM_QK_K / 32; ++j) {
        const int qh = b->qh[j];
        mul[2 * j] = mul[2 * j + 1] = 2 * ((qh >> 12) & 7) + 1;
        for (int g = 0; g < 4; ++g) iq1_group(b->qs[4 * j + g] | (((qh >> (3 * g)) & 7) << 8), qh & 0x8000, lv + 32 * j + 8 * g);
    }
    return rm_fp16_to_fp32(b->d);
}

/* IQ1_M: per 8 a nibble of qh (3 index bits, the delta sign); a 3-bit scale per 16; the fp16 d
 * is spread over the top nibbles of the four scale words */
static float decode_iq1_m(const void * block, int mul[16], int lv[RM_QK_K]) {
    const rm_block_iq1_m * b = block;
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof(sc));
    for (int k = 0; k < RM_QK_K / 16; ++k) mul[k] = 2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1;
    for (int g = 0; g < RM_QK_K / 8; ++g) {
        const int nib = (b->qh[g / 2] >> (4 * (g % 2))) & 0xF;
        iq1_group(b->qs[g] | ((nib & 7) << 8), nib & 8, lv + 8 * g);
    }
    const rm_fp16 d = (rm_fp16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    return rm_fp16_to_fp32(d);
}

/* step: the power of two that turns mul * lv into the value per unit of d */
#define IQ_KERNELS(t, step)                                                                       \
    void rm_##t##_to_float(const void * src, float * y, int64_t n) {                              \
        iq_to_float(decode_##t, sizeof(rm_block_##t), (step), src, y, n);                         \
    }                                                                                             \
    void rm_##t##_vec_dot(int64_t n, float * out, const void * w, const void * x_q) {             \
        iq_vec_dot(decode_##t, sizeof(rm_block_##t), (step), n, out, w, x_q);                     \
    }

IQ_KERNELS(iq4_xs, 1.0f)      /* d * (sc - 32) * value */
IQ_KERNELS(iq2_xxs, 0.125f)   /* d * (0.5 + s) * 0.25 = d * (2s + 1) / 8 */
IQ_KERNELS(iq3_xxs, 0.25f)    /* d * (0.5 + s) * 0.5 */
IQ_KERNELS(iq2_xs, 0.125f)
IQ_KERNELS(iq2_s, 0.125f)
IQ_KERNELS(iq3_s, 1.0f)       /* d * (1 + 2s) */
IQ_KERNELS(iq1_s, 0.125f)     /* d * (2s + 1) * (level + delta), level + delta = lv / 8 */
IQ_KERNELS(iq1_m, 0.125f)
