/* vec_dot_avx512.c - AVX-512 (F, BW, VL, DQ, VNNI) kernels.
 *
 * What this set adds to the AVX2 one: 16-wide float dots for F32 and F16 weights, with masked
 * loads for the tail, and vpdpbusd (VNNI), which multiplies unsigned by signed bytes and adds
 * groups of four straight into int32 lanes, for the 32-element blocks. The one-token 32-element
 * kernels stay 256 bits wide: a block is 32 bytes, and pairing two blocks in one 512-bit register
 * costs as many shuffles as it saves. Where data already lies 64 bytes together (the prefill
 * form's transposed groups) the products run 512 bits wide and the two halves' int32 lanes are
 * added at the end: the same integers, so the same results. The K-quants (and IQ4_XS) are
 * simd_x86.h's, 256 bits wide (Q4_K's levels paired into 512-bit registers ran at 0.75x of
 * these: the pairing's shuffles cost more than the wider products save), built here with vpdpwssd
 * (VNNI) for their scaled sums and with their float steps by groups of eight super-blocks
 * (kq_sum), the float contract the AMX tiles reproduce. Types without a kernel here use the AVX2
 * one (dispatch.c falls through). Same contracts and error budgets as vec_dot_avx2.c.
 */
#if defined(RM_X86)

#include <immintrin.h>
#include <string.h>

/* pair products times scales, added into int32 lanes in one instruction */
#define RM_KQ_ACC(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
/* the 32-element blocks' dots with vpdpbusd (block32_x86.h) */
#define RM_KQ_512 1
/* the K-quants' float steps by groups of eight super-blocks (kq_sum), which the AMX tiles repeat */
#define RM_KQ_GROUPED 1
#include "simd_x86.h"
#include "gdn_x86.h"
#include "block32_x86.h"
#include "kq_rows_x86.h"

static void vec_dot_f32(int64_t n, float * out, const void * w, const void * x_q) {
    const float * a = w;
    const float * x = x_q;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        rm_stream_ahead(a + i, 64 * sizeof(float));
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

/* vec_dot_f32 for nc tokens, four at a time against each 64 floats of the row: the row read once
 * for four, each token's sums taken in vec_dot_f32's order, so the same floats. */
static void vec_dot_f32_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                              const float * x_info, int64_t x_info_stride) {
    const float * a = w;
    for (int c0 = 0; c0 < nc; c0 += 4) {
        const int m4 = nc - c0 < 4 ? nc - c0 : 4;
        const float * x[4];
        __m512 acc[4][4];
        for (int c = 0; c < 4; c++) {
            x[c] = (const float *) ((const uint8_t *) x_q + (uint64_t) (c0 + (c < m4 ? c : 0)) * x_stride);
            for (int k = 0; k < 4; k++) {
                acc[c][k] = _mm512_setzero_ps();
            }
        }
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) {
            if (nc == 1) {
                rm_stream_ahead(a + i, 64 * sizeof(float));
            }
            for (int k = 0; k < 4; k++) {
                const __m512 ak = _mm512_loadu_ps(a + i + 16 * k);
                for (int c = 0; c < 4; c++) {
                    acc[c][k] = _mm512_fmadd_ps(ak, _mm512_loadu_ps(x[c] + i + 16 * k), acc[c][k]);
                }
            }
        }
        for (; i < n; i += 16) {
            const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16) ((1u << (n - i)) - 1);
            const __m512 ak = _mm512_maskz_loadu_ps(m, a + i);
            for (int c = 0; c < 4; c++) {
                acc[c][0] = _mm512_fmadd_ps(ak, _mm512_maskz_loadu_ps(m, x[c] + i), acc[c][0]);
            }
        }
        for (int c = 0; c < m4; c++) {
            out[c0 + c] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]),
                                                             _mm512_add_ps(acc[c][2], acc[c][3])));
        }
    }
    (void) x_info, (void) x_info_stride;
}

static void vec_dot_f16(int64_t n, float * out, const void * w, const void * x_q) {
    const rm_fp16 * a = w;
    const float * x = x_q;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        rm_stream_ahead(a + i, 64 * sizeof(rm_fp16));
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

/* The 32-element kernels (Q8_0, Q4_0 against Q8_0), written once for nc tokens (1, 4 or 8): a
 * weight block is unpacked once for all tokens, and each token's result is bit for bit the
 * one-token kernel's.
 *
 * Blocks go in groups of eight. Each block's integer dot is eight int32 lanes (vpdpbusd on |w|
 * and x signed like w); a tree of horizontal adds turns the eight blocks' lanes into one vector
 * of eight block sums, which then takes the eight scale products d_w d_x in one multiply-add.
 * Per block and token that leaves a sign, a vpdpbusd and about one add of the tree, instead of a
 * convert, a scale broadcast and a multiply-add per block. */
/* block_sums8 and scales8 are block32_x86.h's. */

/* Block i's levels, two ways: signed (Q8_0 as stored, Q4_0's nibbles less 8) for |w| . (x
 * signed like w), and unsigned (Q8_0 plus 128, Q4_0's nibbles) for vpdpbusd straight on x, the
 * offset times the block's activation sum then taken back. Q5_0, IQ4_NL and MXFP4 run here in
 * the prefill form only, with block32_x86.h's levels and scales: their other kernels are
 * block32_x86.h's, which this form matches bit for bit. */
enum { Q8_0_LEVELS, Q4_0_LEVELS, Q5_0_LEVELS, IQ4_NL_LEVELS, MXFP4_LEVELS };
static const size_t levels_block_bytes[] = {sizeof(rm_block_q8_0), sizeof(rm_block_q4_0), sizeof(rm_block_q5_0),
                                            sizeof(rm_block_iq4_nl), sizeof(rm_block_mxfp4)};
static const float levels_offset[] = {128.0f, 8.0f, 16.0f, 128.0f, 128.0f};
static const int levels_b32_kind[] = {-1, -1, B32_Q5_0, B32_IQ4_NL, B32_MXFP4};

RM_INLINE __m256i levels_unsigned(const void * w, int64_t i, const int kind) {
    if (kind == Q8_0_LEVELS) {
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) ((const rm_block_q8_0 *) w + i)->qs), _mm256_set1_epi8((char) 0x80));
    }
    if (kind == Q4_0_LEVELS) {
        return nibbles_lo_hi(((const rm_block_q4_0 *) w + i)->qs);
    }
    return b32_levels_unsigned(w, i, levels_b32_kind[kind]);
}

RM_INLINE __m256i levels_signed(const void * w, int64_t i, const int kind) {
    if (kind == Q8_0_LEVELS) {
        return _mm256_loadu_si256((const __m256i *) ((const rm_block_q8_0 *) w + i)->qs);
    }
    if (kind == Q4_0_LEVELS) {
        return _mm256_sub_epi8(nibbles_lo_hi(((const rm_block_q4_0 *) w + i)->qs), _mm256_set1_epi8(8));
    }
    return b32_levels(w, i, levels_b32_kind[kind]);
}

/* The scales of eight blocks from block i on, and of block i alone: fp16, or MXFP4's E8M0. */
RM_INLINE __m256 levels_scales8(const void * w, int64_t i, const int kind) {
    const uint8_t * g = (const uint8_t *) w + (uint64_t) i * levels_block_bytes[kind];
    return kind == MXFP4_LEVELS ? e8m0_half8(g, levels_block_bytes[kind]) : scales8(g, levels_block_bytes[kind]);
}

RM_INLINE float levels_scale(const void * w, int64_t i, const int kind) {
    if (kind == Q8_0_LEVELS || kind == Q4_0_LEVELS) {
        rm_fp16 h;
        memcpy(&h, (const uint8_t *) w + (uint64_t) i * levels_block_bytes[kind], 2);   /* d is the first field */
        return fp16(h);
    }
    return b32_scale(w, i, levels_b32_kind[kind]);
}

/* Lanes of one block's integer dot: |w| . (x with w's signs) */
RM_INLINE __m256i block_dot(__m256i w, __m256i aw, const rm_block_q8_0 * x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) x->qs), w));
}

/* out[c] = dot(w, token c) for nc tokens. With x_info (block scales and level sums of the
 * activations, rm_q8_0_act_info) a block's integer dot is one vpdpbusd on the unsigned levels,
 * less offset * sum(x); both ways give the same integers, and the floats that follow are the same
 * operations, so results do not depend on which way a token went. */
RM_INLINE void dot_32_multi(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                            const float * x_info, int64_t x_info_stride, const int kind) {
    const int64_t nb = n / RM_QK;
    const size_t wblock = levels_block_bytes[kind];
    const float offset = levels_offset[kind];
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
        if (x_info) {
            for (int k = 0; k < 8; k++) {
                q[k] = levels_unsigned(w, i + k, kind);
            }
        } else {
            for (int k = 0; k < 8; k++) {
                q[k] = levels_signed(w, i + k, kind);
                aq[k] = _mm256_sign_epi8(q[k], q[k]);
            }
        }
        for (int c = 0; c < nc; c++) {
            __m256i p[8];
            __m256 sums, dx;
            if (x_info) {
                const float * xi = x_info + c * x_info_stride;
                for (int k = 0; k < 8; k++) {
                    p[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[k], _mm256_loadu_si256((const __m256i *) x[c][i + k].qs));
                }
                /* small integers: exact in float, the same value the signed way gives */
                sums = _mm256_fnmadd_ps(_mm256_set1_ps(offset), _mm256_loadu_ps(xi + nb + i), _mm256_cvtepi32_ps(block_sums8(p)));
                dx = _mm256_loadu_ps(xi + i);
            } else {
                for (int k = 0; k < 8; k++) {
                    p[k] = block_dot(q[k], aq[k], x[c] + i + k);
                }
                sums = _mm256_cvtepi32_ps(block_sums8(p));
                dx = scales8((const uint8_t *) (x[c] + i), sizeof(rm_block_q8_0));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), sums, acc[c]);
        }
    }
    for (; i < nb; i++) {  /* the last few blocks, one by one */
        const __m256i q = levels_signed(w, i, kind), aq = _mm256_sign_epi8(q, q);
        rm_fp16 h;
        memcpy(&h, wb + (uint64_t) i * wblock, 2);
        const float dw = fp16(h);
        for (int c = 0; c < nc; c++) {
            const float dx = x_info ? x_info[c * x_info_stride + i] : fp16(x[c][i].d);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(block_dot(q, aq, x[c] + i)), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

static void vec_dot_q8_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, NULL, 0, Q8_0_LEVELS);
}

static void vec_dot_q4_0(int64_t n, float * out, const void * w, const void * x_q) {
    dot_32_multi(n, out, w, x_q, 0, 1, NULL, 0, Q4_0_LEVELS);
}

static void vec_dot_q8_0_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                               const float * x_info, int64_t x_info_stride) {
    if (nc == 8) {
        dot_32_multi(n, out, w, x_q, x_stride, 8, x_info, x_info_stride, Q8_0_LEVELS);
    } else if (nc == 4) {
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, Q8_0_LEVELS);
    } else {  /* one to three tokens, one at a time */
        for (int c = 0; c < nc; c++) {
            dot_32_multi(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1,
                         x_info ? x_info + c * x_info_stride : NULL, x_info_stride, Q8_0_LEVELS);
        }
    }
}

static void vec_dot_q4_0_multi(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                               const float * x_info, int64_t x_info_stride) {
    if (nc == 8) {
        dot_32_multi(n, out, w, x_q, x_stride, 8, x_info, x_info_stride, Q4_0_LEVELS);
    } else if (nc == 4) {
        dot_32_multi(n, out, w, x_q, x_stride, 4, x_info, x_info_stride, Q4_0_LEVELS);
    } else {  /* one to three tokens, one at a time */
        for (int c = 0; c < nc; c++) {
            dot_32_multi(n, out + c, w, (const uint8_t *) x_q + (uint64_t) c * x_stride, x_stride, 1,
                         x_info ? x_info + c * x_info_stride : NULL, x_info_stride, Q4_0_LEVELS);
        }
    }
}

/* ---- the prefill form of the 32-element kernels (rm_packed_kernels) ------------------------ *
 *
 * A packed group is the eight weight scales as floats and the eight T_j of block32_x86.h (288
 * bytes); the activations are grouped_transpose_act's. Blocks past the last whole group stay in the
 * raw row. */
#define PACK_GROUP_BYTES (8 * sizeof(float) + 8 * 32)

static uint64_t packed_bytes_32(int64_t n) { return (uint64_t) (n / RM_QK / 8) * PACK_GROUP_BYTES; }

RM_INLINE void pack_row_32(int64_t n, const void * w, void * packed, const int kind) {
    uint8_t * out = packed;
    for (int64_t i = 0; i + 8 <= n / RM_QK; i += 8, out += PACK_GROUP_BYTES) {
        _mm256_storeu_ps((float *) out, levels_scales8(w, i, kind));
        __m256i v[8];
        for (int k = 0; k < 8; k++) {
            v[k] = levels_unsigned(w, i + k, kind);
        }
        transpose8_epi32(v);
        for (int j = 0; j < 8; j++) {
            _mm256_storeu_si256((__m256i *) (out + 32 + 32 * j), v[j]);
        }
    }
}

static void pack_row_q4_0(int64_t n, const void * w, void * packed) { pack_row_32(n, w, packed, Q4_0_LEVELS); }
static void pack_row_q8_0(int64_t n, const void * w, void * packed) { pack_row_32(n, w, packed, Q8_0_LEVELS); }
static void pack_row_q5_0(int64_t n, const void * w, void * packed) { pack_row_32(n, w, packed, Q5_0_LEVELS); }
static void pack_row_iq4_nl(int64_t n, const void * w, void * packed) { pack_row_32(n, w, packed, IQ4_NL_LEVELS); }
static void pack_row_mxfp4(int64_t n, const void * w, void * packed) { pack_row_32(n, w, packed, MXFP4_LEVELS); }


/* One group of eight blocks against nc tokens' transposed activations: q holds T_2m and T_2m+1
 * side by side (m = 0..3), dw the eight weight scales; the packed and stored kernels share it, so
 * they do the same operations as dot_32_multi's x_info way. */
RM_INLINE void group_dot(const __m512i q[4], __m256 dw, const uint8_t * xg, uint64_t xt_stride, const int nc,
                         const float * x_info, int64_t x_info_stride, int64_t nb, int64_t i, float offset, __m256 * acc) {
    for (int c = 0; c < nc; c++) {
        const uint8_t * xc = xg + (uint64_t) c * xt_stride;
        __m512i pz = _mm512_setzero_si512();
        for (int m = 0; m < 4; m++) {
            pz = _mm512_dpbusd_epi32(pz, q[m], _mm512_loadu_si512((const void *) (xc + 64 * m)));
        }
        const __m256i p = _mm256_add_epi32(_mm512_castsi512_si256(pz), _mm512_extracti64x4_epi64(pz, 1));
        const float * xi = x_info + c * x_info_stride;
        const __m256 sums = _mm256_fnmadd_ps(_mm256_set1_ps(offset), _mm256_loadu_ps(xi + nb + i), _mm256_cvtepi32_ps(p));
        acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(xi + i)), sums, acc[c]);
    }
}

/* Blocks i.. to the end of the row one by one, as dot_32_multi and dot_32_packed take them: w the
 * row in the file's layout (or a stored row, whose blocks past the groups are the file's), x_t32
 * the tokens' 32 levels of block i, then i + 1.., xt_stride bytes a token apart. */
RM_INLINE void tail_blocks(int64_t nb, int64_t i, const void * w, const uint8_t * x_t32, uint64_t xt_stride, const int nc,
                           const float * x_info, int64_t x_info_stride, const int kind, __m256 * acc) {
    for (; i < nb; i++, x_t32 += 32) {
        const __m256i q = levels_signed(w, i, kind), aq = _mm256_sign_epi8(q, q);
        const float dw = levels_scale(w, i, kind);
        for (int c = 0; c < nc; c++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *) (x_t32 + (uint64_t) c * xt_stride));
            const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
            const float dx = x_info[c * x_info_stride + i];
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(p), acc[c]);
        }
    }
}

/* dot_32_multi's x_info way, group by group from the packed forms; the same integers and then
 * the same float operations, so the same results. */
RM_INLINE void dot_32_packed(int64_t n, float * out, const void * packed, const void * w, const void * x_t,
                             uint64_t xt_stride, const int nc, const float * x_info, int64_t x_info_stride,
                             const int kind) {
    const int64_t nb = n / RM_QK;
    const float offset = levels_offset[kind];
    const uint8_t * pk = packed;
    __m256 acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, pk += PACK_GROUP_BYTES) {
        const __m256 dw = _mm256_loadu_ps((const float *) pk);
        __m512i q[4];   /* T_2k and T_2k+1 side by side: the halves' lanes are added at the end */
        for (int j = 0; j < 4; j++) {
            q[j] = _mm512_loadu_si512((const void *) (pk + 32 + 64 * j));
        }
        group_dot(q, dw, (const uint8_t *) x_t + (uint64_t) (i / 8) * 256, xt_stride, nc, x_info, x_info_stride, nb, i,
                  offset, acc);
    }
    tail_blocks(nb, i, w, (const uint8_t *) x_t + (uint64_t) (i / 8) * 256, xt_stride, nc, x_info, x_info_stride, kind, acc);
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

#define RM_PACKED_DOT(name, kind)                                                                                  \
    static void name(int64_t n, int nc, float * out, const void * packed, const void * w, const void * x_t,        \
                     uint64_t xt_stride, const float * x_info, int64_t x_info_stride) {                            \
        if (nc == 8) {                                                                                             \
            dot_32_packed(n, out, packed, w, x_t, xt_stride, 8, x_info, x_info_stride, kind);                      \
        } else if (nc == 4) {                                                                                      \
            dot_32_packed(n, out, packed, w, x_t, xt_stride, 4, x_info, x_info_stride, kind);                      \
        } else {                                                                                                   \
            dot_32_packed(n, out, packed, w, x_t, xt_stride, 1, x_info, x_info_stride, kind);                      \
        }                                                                                                          \
    }
RM_PACKED_DOT(dot_packed_q4_0, Q4_0_LEVELS)
RM_PACKED_DOT(dot_packed_q8_0, Q8_0_LEVELS)
RM_PACKED_DOT(dot_packed_q5_0, Q5_0_LEVELS)
RM_PACKED_DOT(dot_packed_iq4_nl, IQ4_NL_LEVELS)
RM_PACKED_DOT(dot_packed_mxfp4, MXFP4_LEVELS)

/* Rows stored packed (rm_packed_kernels.repack_row), Q4_0 and MXFP4, in block32_x86.h's layout:
 * Q4_0's nibbles are its levels plus 8, MXFP4's the indices of its table. MXFP4 rows that end
 * inside a group (gpt-oss's 2,880 elements) are stored too. The one-token kernel then unpacks a
 * group in a dozen operations and needs no horizontal adds, the work the file layout's kernels
 * spend most of their time on; the integers and floats are dot_32_packed's, so those of the file
 * layout's kernels. */
RM_INLINE size_t stored_scale_bytes(const int kind) { return kind == MXFP4_LEVELS ? 8 : 16; }

/* The unsigned levels (levels_unsigned's) of 64 stored nibbles, T_2m's 32 and T_2m+1's. */
RM_INLINE __m512i stored_levels(__m256i v, const int kind) {
    const __m512i nib = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1),
                                         _mm512_set1_epi8(0x0f));
    if (kind == MXFP4_LEVELS) {   /* the table's levels plus 128 */
        const __m128i t = _mm_xor_si128(_mm_loadu_si128((const __m128i *) rm_mxfp4_values), _mm_set1_epi8((char) 0x80));
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), nib);
    }
    return nib;
}

/* The eight weight scales of a stored group as floats. */
RM_INLINE __m256 stored_scales8(const uint8_t * g, const int kind) {
    return kind == MXFP4_LEVELS ? e8m0_half8(g, 1) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) g));
}

RM_INLINE void repack_row_32(int64_t n, const void * w, void * stored, const int kind) {
    b32_repack_row(n, w, stored, levels_block_bytes[kind], stored_scale_bytes(kind) / 8);
}

RM_INLINE void unpack_stored_32(int64_t n, const void * stored, void * packed, const int kind) {
    const uint8_t * g = stored;
    uint8_t * out = packed;
    for (int64_t i = 0; i + 8 <= n / RM_QK; i += 8, g += 8 * levels_block_bytes[kind], out += PACK_GROUP_BYTES) {
        _mm256_storeu_ps((float *) out, stored_scales8(g, kind));
        for (int m = 0; m < 4; m++) {   /* T_2m and T_2m+1, side by side as pack_row_32 leaves them */
            const __m256i v = _mm256_loadu_si256((const __m256i *) (g + stored_scale_bytes(kind) + 32 * m));
            _mm512_storeu_si512((void *) (out + 32 + 64 * m), stored_levels(v, kind));
        }
    }
}

RM_INLINE void dot_stored_nc(int64_t n, float * out, const void * stored, const void * x_t, uint64_t xt_stride, const int nc,
                             const float * x_info, int64_t x_info_stride, const int kind) {
    const int64_t nb = n / RM_QK;
    const uint8_t * g = stored;
    __m256 acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, g += 8 * levels_block_bytes[kind]) {
        if (nc == 1) {
            rm_stream_ahead(g, (int) (8 * levels_block_bytes[kind]));
        }
        const __m256 dw = stored_scales8(g, kind);
        __m512i q[4];   /* T_2m and T_2m+1 side by side, as dot_32_packed has them */
        for (int m = 0; m < 4; m++) {
            q[m] = stored_levels(_mm256_loadu_si256((const __m256i *) (g + stored_scale_bytes(kind) + 32 * m)), kind);
        }
        group_dot(q, dw, (const uint8_t *) x_t + (uint64_t) (i / 8) * 256, xt_stride, nc, x_info, x_info_stride, nb, i,
                  levels_offset[kind], acc);
    }
    tail_blocks(nb, i, stored, (const uint8_t *) x_t + (uint64_t) (i / 8) * 256, xt_stride, nc, x_info, x_info_stride, kind, acc);
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

#define RM_STORED_KERNELS(type, kind)                                                                              \
    static void repack_row_##type(int64_t n, const void * w, void * stored) { repack_row_32(n, w, stored, kind); } \
    static void unpack_stored_##type(int64_t n, const void * stored, void * packed) {                              \
        unpack_stored_32(n, stored, packed, kind);                                                                 \
    }                                                                                                              \
    static void dot_stored_##type(int64_t n, int nc, float * out, const void * stored, const void * x_t,           \
                                  uint64_t xt_stride, const float * x_info, int64_t x_info_stride) {               \
        if (nc == 8) {                                                                                             \
            dot_stored_nc(n, out, stored, x_t, xt_stride, 8, x_info, x_info_stride, kind);                         \
        } else if (nc == 4) {                                                                                      \
            dot_stored_nc(n, out, stored, x_t, xt_stride, 4, x_info, x_info_stride, kind);                         \
        } else {                                                                                                   \
            dot_stored_nc(n, out, stored, x_t, xt_stride, 1, x_info, x_info_stride, kind);                         \
        }                                                                                                          \
    }
RM_STORED_KERNELS(q4_0, Q4_0_LEVELS)
RM_STORED_KERNELS(mxfp4, MXFP4_LEVELS)

/* stored_tail: 0 for Q4_0 (rows of whole groups only), 1 for MXFP4 */
static const rm_packed_kernels packed_q4_0 = {packed_bytes_32, grouped_act_bytes, pack_row_q4_0, grouped_transpose_act, dot_packed_q4_0,
                                              repack_row_q4_0, unpack_stored_q4_0, dot_stored_q4_0, 0, NULL, NULL};
static const rm_packed_kernels packed_q8_0 = {packed_bytes_32, grouped_act_bytes, pack_row_q8_0, grouped_transpose_act, dot_packed_q8_0,
                                              NULL, NULL, NULL, 0, NULL, NULL};
static const rm_packed_kernels packed_q5_0 = {packed_bytes_32, grouped_act_bytes, pack_row_q5_0, grouped_transpose_act, dot_packed_q5_0,
                                              NULL, NULL, NULL, 0, NULL, NULL};
static const rm_packed_kernels packed_iq4_nl = {packed_bytes_32, grouped_act_bytes, pack_row_iq4_nl, grouped_transpose_act,
                                                dot_packed_iq4_nl, NULL, NULL, NULL, 0, NULL, NULL};
static const rm_packed_kernels packed_mxfp4 = {packed_bytes_32, grouped_act_bytes, pack_row_mxfp4, grouped_transpose_act,
                                               dot_packed_mxfp4, repack_row_mxfp4, unpack_stored_mxfp4, dot_stored_mxfp4, 1, NULL, NULL};

/* ---- attention, 512 bits wide: rows of a multiple of 16 floats (others: simd_x86.h's) ---- */

/* Eight positions at a time, as attn_scores_x86, with 16-float products; each position's two
 * halves are added, then the eight sums come out of sums8_ps. */
static void attn_scores_512(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale,
                            float * s) {
    if (d % 16) {
        attn_scores(d, n, q, k, stride, scale, s);
        return;
    }
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m512 acc[8];
        for (int j = 0; j < 8; j++) {
            acc[j] = _mm512_setzero_ps();
        }
        for (int64_t i = 0; i < d; i += 16) {
            const __m512 qv = _mm512_loadu_ps(q + i);
            for (int j = 0; j < 8; j++) {
                acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + (p + j) * stride + i), acc[j]);
            }
        }
        __m256 h[8];
        for (int j = 0; j < 8; j++) {
            h[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
        }
        _mm256_storeu_ps(s + p, _mm256_mul_ps(_mm256_set1_ps(scale), sums8_ps(h)));
    }
    for (; p < n; p++) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < d; i += 16) {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + p * stride + i), acc);
        }
        s[p] = scale * _mm512_reduce_add_ps(acc);
    }
}

/* Up to 128 output floats held in registers while every position passes. */
static void attn_values_512(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                            int accumulate) {
    if (d % 16) {
        attn_values(d, n, s, v, stride, out, accumulate);
        return;
    }
    for (int64_t i0 = 0; i0 < d; i0 += 128) {
        const int w = (int) ((d - i0 < 128 ? d - i0 : 128) / 16);
        __m512 acc[8];
        for (int j = 0; j < 8; j++) {
            acc[j] = accumulate && j < w ? _mm512_loadu_ps(out + i0 + 16 * j) : _mm512_setzero_ps();
        }
        if (w == 8) {
            for (int64_t p = 0; p < n; p++) {
                const __m512 sp = _mm512_set1_ps(s[p]);
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < 8; j++) {
                    acc[j] = _mm512_fmadd_ps(sp, _mm512_loadu_ps(vp + 16 * j), acc[j]);
                }
            }
        } else {
            for (int64_t p = 0; p < n; p++) {
                const __m512 sp = _mm512_set1_ps(s[p]);
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < w; j++) {
                    acc[j] = _mm512_fmadd_ps(sp, _mm512_loadu_ps(vp + 16 * j), acc[j]);
                }
            }
        }
        for (int j = 0; j < w; j++) {
            _mm512_storeu_ps(out + i0 + 16 * j, acc[j]);
        }
    }
}

/* nr query rows (1 to RM_ATTN_ROWS_AT_ONCE) against the same positions: each key's 16 floats
 * are loaded once for all the rows (a tile of keys is read from cache once per three rows, not
 * per row), and each row's arithmetic is attn_scores_512's for whole groups of eight positions.
 * The last group, if partial, is filled out with the first position's key and goes through the
 * same sums, so a position's score does not depend on where n ends. */
RM_INLINE void scores8_rows_512(int64_t d, const int nr, const float * const q[], const float * const kp[8], float scale,
                                float * const s[RM_ATTN_ROWS_AT_ONCE]) {
    __m512 acc[RM_ATTN_ROWS_AT_ONCE][8];
    for (int r = 0; r < nr; r++) {
        for (int j = 0; j < 8; j++) {
            acc[r][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t i = 0; i < d; i += 16) {
        __m512 qv[RM_ATTN_ROWS_AT_ONCE];
        for (int r = 0; r < nr; r++) {
            qv[r] = _mm512_loadu_ps(q[r] + i);
        }
        for (int j = 0; j < 8; j++) {
            __m512 kv = _mm512_loadu_ps(kp[j] + i);
            __asm__("" : "+v"(kv));   /* loaded once for the rows, not folded into each */
            for (int r = 0; r < nr; r++) {
                acc[r][j] = _mm512_fmadd_ps(qv[r], kv, acc[r][j]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        __m256 h[8];
        for (int j = 0; j < 8; j++) {
            h[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[r][j]), _mm512_extractf32x8_ps(acc[r][j], 1));
        }
        _mm256_storeu_ps(s[r], _mm256_mul_ps(_mm256_set1_ps(scale), sums8_ps(h)));
    }
}

RM_INLINE void scores_rows_512(int64_t d, int64_t n, const int nr, const float * const q[], const float * k,
                               int64_t stride, float scale, float * s, int64_t s_stride) {
    for (int64_t p = 0; p < n; p += 8) {
        const float * kp[8];
        float part[RM_ATTN_ROWS_AT_ONCE][8];
        float * out[RM_ATTN_ROWS_AT_ONCE];
        for (int j = 0; j < 8; j++) {
            kp[j] = k + (p + j < n ? p + j : p) * stride;
        }
        for (int r = 0; r < nr; r++) {
            out[r] = p + 8 <= n ? s + r * s_stride + p : part[r];
        }
        scores8_rows_512(d, nr, q, kp, scale, out);
        for (int r = 0; p + 8 > n && r < nr; r++) {
            memcpy(s + r * s_stride + p, part[r], sizeof(float) * (size_t) (n - p));
        }
    }
}

static void attn_scores_rows_512(int64_t d, int64_t n, int nr, const float * const q[], const float * k, int64_t stride,
                                 float scale, float * s, int64_t s_stride) {
    if (d % 16) {
        attn_scores_rows(d, n, nr, q, k, stride, scale, s, s_stride);
        return;
    }
    switch (nr) {   /* a copy per count, the row loops unrolled */
    case 3: scores_rows_512(d, n, 3, q, k, stride, scale, s, s_stride); break;
    case 2: scores_rows_512(d, n, 2, q, k, stride, scale, s, s_stride); break;
    default: scores_rows_512(d, n, 1, q, k, stride, scale, s, s_stride); break;
    }
}

/* nr output rows (1 to RM_ATTN_ROWS_AT_ONCE) held in registers, up to 128 floats each, while
 * every position passes: each value's floats are loaded once for all the rows; each row's
 * arithmetic is attn_values_512's, accumulating. */
RM_INLINE void values_rows_512(int64_t d, int64_t n, const int nr, const float * s, int64_t s_stride, const float * v,
                               int64_t stride, float * const out[]) {
    for (int64_t i0 = 0; i0 < d; i0 += 128) {
        const int w = (int) ((d - i0 < 128 ? d - i0 : 128) / 16);
        __m512 acc[RM_ATTN_ROWS_AT_ONCE][8];
        for (int r = 0; r < nr; r++) {
            for (int j = 0; j < 8; j++) {
                acc[r][j] = j < w ? _mm512_loadu_ps(out[r] + i0 + 16 * j) : _mm512_setzero_ps();
            }
        }
        if (w == 8) {
            for (int64_t p = 0; p < n; p++) {
                __m512 sp[RM_ATTN_ROWS_AT_ONCE];
                for (int r = 0; r < nr; r++) {
                    sp[r] = _mm512_set1_ps(s[r * s_stride + p]);
                }
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < 8; j++) {
                    __m512 vv = _mm512_loadu_ps(vp + 16 * j);
                    __asm__("" : "+v"(vv));   /* loaded once for the rows, not folded into each */
                    for (int r = 0; r < nr; r++) {
                        acc[r][j] = _mm512_fmadd_ps(sp[r], vv, acc[r][j]);
                    }
                }
            }
        } else {
            for (int64_t p = 0; p < n; p++) {
                const float * vp = v + p * stride + i0;
                for (int j = 0; j < w; j++) {
                    const __m512 vv = _mm512_loadu_ps(vp + 16 * j);
                    for (int r = 0; r < nr; r++) {
                        acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(s[r * s_stride + p]), vv, acc[r][j]);
                    }
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            for (int j = 0; j < w; j++) {
                _mm512_storeu_ps(out[r] + i0 + 16 * j, acc[r][j]);
            }
        }
    }
}

static void attn_values_rows_512(int64_t d, int64_t n, int nr, const float * s, int64_t s_stride, const float * v,
                                 int64_t stride, float * const out[]) {
    if (d % 16) {
        attn_values_rows(d, n, nr, s, s_stride, v, stride, out);
        return;
    }
    switch (nr) {
    case 3: values_rows_512(d, n, 3, s, s_stride, v, stride, out); break;
    case 2: values_rows_512(d, n, 2, s, s_stride, v, stride, out); break;
    default: values_rows_512(d, n, 1, s, s_stride, v, stride, out); break;
    }
}

/* The K-quants' tile form (kq_rows_x86.h), from six tokens on: packing sixteen rows costs about
 * what 12 tokens' products do, and against the one-row prefill form (simd_x86.h) it wins from 6
 * (one thread, rows of 2048 and 768: 16-22 against 22-29 ps per weight and token at 6, 6.4-8.6
 * against 16-17 at 32) and loses at 4 (IQ4_XS 31 against 21; tools/bench_kernels.py --tokens N
 * --compare avx2,avx512). */
RM_ROWS_KQ(q2_K, rm_block_q2_K, 1, 0, 6)
RM_ROWS_KQ(q3_K, rm_block_q3_K, 1, 4, 6)
RM_ROWS_KQ(q4_K, rm_block_q4_K, 0, 0, 6)
RM_ROWS_KQ(q5_K, rm_block_q5_K, 0, 0, 6)
RM_ROWS_KQ(q6_K, rm_block_q6_K, 1, 32, 6)
RM_ROWS_KQ(iq4_xs, rm_block_iq4_xs, 0, 128, 6)
/* IQ2_XXS and IQ3_XXS from two tokens on: their codebook decoded once per row and tile of tokens
 * (one thread, rows of 2048 and 768, ps per weight and token against the one-row form, AVX-512 /
 * AVX2 sets on a Xeon): IQ2_XXS 53 / 81 against 67 / 102 at 2, 27 / 47 against 26 / 42 at 4,
 * 9.6 / 20 against 21 / 35 at 32; IQ3_XXS 35 / 58 against 43 / 58 at 4, 10.5 / 21.6 against 30 /
 * 48 at 32. */
RM_ROWS_KQ(iq2_xxs, rm_block_iq2_xxs, 0, 128, 2)
RM_ROWS_KQ(iq3_xxs, rm_block_iq3_xxs, 0, 128, 2)
/* Q4_0 and Q8_0 (one thread, ps per weight and token, against the packed form below, which takes
 * eight tokens and more, and the multi-token kernel under eight): Q8_0 from 6 (17.6 against 22.0
 * at 6, 14.4 against 15.0 at 8, 7.1 against 16.1 at 32); Q4_0, whose packed form is quicker at 8
 * (12.4 against 14.3), from 10 (12.5 against 13.6; 6.7 against 11.8 at 32). */
RM_ROWS_32(q4_0, R32_Q4_0, 10)
RM_ROWS_32(q8_0, R32_Q8_0, 6)
RM_ROWS_32(q5_0, R32_Q5_0, 10)
RM_ROWS_32(iq4_nl, R32_IQ4_NL, 10)
RM_ROWS_32(mxfp4, R32_MXFP4, 10)

/* Q4_K, Q5_K, Q6_K and IQ4_XS kept sixteen rows to a tile (kq_rows_x86.h), read by the tile form
 * for every number of tokens. */
RM_KS16_PACKED
RM_KS16_PACKED_AVX512

const rm_cpu_kernels rm_cpu_kernels_avx512 = {
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
    .vec_dot_multi = {
        [RM_TYPE_F32] = vec_dot_f32_multi,
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
    .attn_scores = attn_scores_512,
    .attn_values = attn_values_512,
    .attn_scores_rows = attn_scores_rows_512,
    .attn_values_rows = attn_values_rows_512,
    .exp_sum = exp_sum_x86,
    .max_of = max_x86,
    .packed = {
        [RM_TYPE_Q4_K] = &packed_q4_K,
        [RM_TYPE_Q6_K] = &packed_q6_K,
        [RM_TYPE_Q5_K] = &packed_q5_K,
        [RM_TYPE_IQ4_XS] = &packed_iq4_xs,
        [RM_TYPE_Q4_0] = &packed_q4_0,
        [RM_TYPE_Q8_0] = &packed_q8_0,
        [RM_TYPE_Q5_0] = &packed_q5_0,
        [RM_TYPE_IQ4_NL] = &packed_iq4_nl,
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
        [RM_TYPE_F32] = 1, [RM_TYPE_F16] = 1,
        [RM_TYPE_Q4_0] = 1, [RM_TYPE_Q8_0] = 1, [RM_TYPE_Q2_K] = 1, [RM_TYPE_Q3_K] = 1, [RM_TYPE_Q4_K] = 1,
        [RM_TYPE_Q5_K] = 1, [RM_TYPE_Q6_K] = 1, [RM_TYPE_MXFP4] = 1, [RM_TYPE_Q5_0] = 1, [RM_TYPE_Q4_1] = 1,
        [RM_TYPE_Q5_1] = 1, [RM_TYPE_IQ4_NL] = 1, [RM_TYPE_IQ4_XS] = 1, [RM_TYPE_IQ2_XXS] = 1, [RM_TYPE_IQ3_XXS] = 1,
    },
};

#endif /* RM_X86 */
