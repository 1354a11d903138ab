/* block32_x86.h - internal: the 32-element block types other than Q4_0 and Q8_0, for the AVX2
 * and AVX-512 sets: Q5_0, IQ4_NL and MXFP4 against Q8_0 activations, Q4_1 and Q5_1 against Q8_1
 * (the activation types of their reference twins in quants_ref.c, types.c's table).
 *
 * Included by vec_dot_avx2.c and vec_dot_avx512.c after simd_x86.h, so each set compiles it with
 * its own flags; with AVX-512 VNNI (RM_KQ_512) a block's byte products go into int32 lanes in one
 * vpdpbusd and Q5's fifth bits come from a mask register, with AVX2 in vpmaddubsw and vpmaddwd and
 * a compare.
 *
 * A block's 32 levels come out in element order, signed (Q5_0's q - 16; IQ4_NL's and MXFP4's
 * levels, one byte shuffle of their table) or unsigned (Q4_1's and Q5_1's q). A signed block's
 * integer dot is |w| times x with w's signs, an unsigned one's q times x; both exact. Blocks go
 * in groups of eight: a tree of horizontal adds turns the eight blocks' int32 lanes into one
 * vector of eight block sums, which takes the eight scale products d_w d_x in one multiply-add
 * (and Q4_1/Q5_1 the eight m_w s_x in another). The blocks past the last group go one by one. So
 * results differ from the reference only in the order of the float sums (tests/test_kernels.py
 * states the budget). Every token of a multi-token call does the one-token kernel's operations in
 * its order: batched results equal single ones bit for bit. The AVX-512 set's prefill form
 * (vec_dot_avx512.c, rows packed as Q4_0's) takes Q5_0's, IQ4_NL's and MXFP4's levels and scales
 * from here and gives these kernels' floats. */
#ifndef RM_CPU_BLOCK32_X86_H
#define RM_CPU_BLOCK32_X86_H

#include "transpose_x86.h"

enum { B32_Q5_0, B32_IQ4_NL, B32_MXFP4, B32_Q4_1, B32_Q5_1 };

/* Per kind: the weight block's bytes, the activation block's bytes, and whether the levels are
 * signed (else unsigned, with an offset m_w applied through the activations' s = d_x sum(q_x)). */
static const size_t b32_block_bytes[] = {sizeof(rm_block_q5_0), sizeof(rm_block_iq4_nl), sizeof(rm_block_mxfp4),
                                         sizeof(rm_block_q4_1), sizeof(rm_block_q5_1)};
static const size_t b32_act_bytes[] = {sizeof(rm_block_q8_0), sizeof(rm_block_q8_0), sizeof(rm_block_q8_0),
                                       sizeof(rm_block_q8_1), sizeof(rm_block_q8_1)};
static const int b32_signed[] = {1, 1, 1, 0, 0};
/* The signed kinds' offset to unsigned levels (b32_levels_unsigned). */
static const float b32_offset[] = {16.0f, 128.0f, 128.0f, 0.0f, 0.0f};

/* block_sums8 (eight blocks' lane vectors -> their eight sums, in block order) is simd_x86.h's. */

/* The fp16 scales of eight blocks, `stride` bytes apart, as floats (inserted one by one: eight
 * small stores and a wide reload would stall on store forwarding). */
RM_INLINE __m256 scales8(const uint8_t * d, size_t stride) {
    __m128i h = _mm_setzero_si128();
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 0 * stride), 0);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 1 * stride), 1);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 2 * stride), 2);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 3 * stride), 3);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 4 * stride), 4);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 5 * stride), 5);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 6 * stride), 6);
    h = _mm_insert_epi16(h, *(const uint16_t *) (d + 7 * stride), 7);
    return _mm256_cvtph_ps(h);
}

/* rm_e8m0_to_fp32_half of eight exponent bytes `stride` bytes apart: 2^(e - 128) as the float
 * whose bits are (e - 1) << 23, or for e < 2 the subnormal 0x00200000 << e. */
RM_INLINE __m256 e8m0_half8(const uint8_t * e, size_t stride) {
    __m128i v = _mm_cvtsi32_si128(e[0]);
    v = _mm_insert_epi8(v, e[1 * stride], 1);
    v = _mm_insert_epi8(v, e[2 * stride], 2);
    v = _mm_insert_epi8(v, e[3 * stride], 3);
    v = _mm_insert_epi8(v, e[4 * stride], 4);
    v = _mm_insert_epi8(v, e[5 * stride], 5);
    v = _mm_insert_epi8(v, e[6 * stride], 6);
    v = _mm_insert_epi8(v, e[7 * stride], 7);
    const __m256i x = _mm256_cvtepu8_epi32(v);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(x, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), x);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), x)));
}

/* The 32 nibbles of a 16-byte run as bytes, low nibbles first (nibbles_lo_hi's order), from a
 * broadcast load, a shift and a dword blend: no cross-lane shuffle. */
RM_INLINE __m256i nibbles32(const uint8_t * qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) qs));
    return _mm256_and_si256(_mm256_blend_epi32(b, _mm256_srli_epi16(b, 4), 0xf0), _mm256_set1_epi8(0x0f));
}

/* ---- rows of 32-element blocks in groups of eight, transposed (the prefill and stored forms) --
 *
 * A group of eight blocks as registers: L_k, block k's 32 levels (dword j: levels 4j..4j+3).
 * Transposed, T_j holds dword j of every block (dword k: block k's levels 4j..4j+3), so eight
 * multiply-adds of T_j (weights) against T_j (activations) leave block k's integer dot in lane k:
 * the lanes block_sums8 makes with its tree of horizontal adds, here with none. A token's
 * activations so laid out: its groups' eight T_j (256 bytes each), then the 32 levels of each block
 * past the last whole group as they are.
 *
 * Rows stored in groups (rm_packed_kernels.repack_row; Q4_0 and MXFP4, whose blocks are a scale
 * field and 16 bytes of nibbles): a group is its eight blocks' scale fields side by side (Q4_0's
 * fp16 d, 16 bytes; MXFP4's E8M0 bytes, 8), then their nibbles transposed, T_2m in the low and
 * T_2m+1 in the high nibbles of 32 bytes (128 bytes): as many bytes as the eight blocks take in
 * the file. Blocks past the last whole group stay as the file has them, at the same offsets. */
static inline uint64_t grouped_act_bytes(int64_t n) { return (uint64_t) (n / RM_QK) * 32; }

static inline void grouped_transpose_act(int64_t n, const void * x_q, void * x_t) {
    const rm_block_q8_0 * x = x_q;
    uint8_t * out = x_t;
    int64_t i = 0;
    for (; i + 8 <= n / RM_QK; i += 8, out += 256) {
        __m256i v[8];
        for (int k = 0; k < 8; k++) {
            v[k] = _mm256_loadu_si256((const __m256i *) x[i + k].qs);
        }
        transpose8_epi32(v);
        for (int j = 0; j < 8; j++) {
            _mm256_storeu_si256((__m256i *) (out + 32 * j), v[j]);
        }
    }
    for (; i < n / RM_QK; i++, out += 32) {
        memcpy(out, x[i].qs, 32);
    }
}

/* A row into the stored layout: blocks of block_bytes, each a scale field of scale_bytes then its
 * 16 nibble bytes. */
RM_INLINE void b32_repack_row(int64_t n, const void * w, void * stored, const size_t block_bytes, const size_t scale_bytes) {
    const int64_t nb = n / RM_QK;
    uint8_t * out = stored;
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, out += 8 * block_bytes) {
        const uint8_t * src = (const uint8_t *) w + (uint64_t) i * block_bytes;
        __m256i v[8];
        for (int k = 0; k < 8; k++) {
            memcpy(out + scale_bytes * (size_t) k, src + (size_t) k * block_bytes, scale_bytes);
            v[k] = nibbles32(src + (size_t) k * block_bytes + scale_bytes);
        }
        transpose8_epi32(v);
        for (int m = 0; m < 4; m++) {
            _mm256_storeu_si256((__m256i *) (out + 8 * scale_bytes + 32 * m), _mm256_or_si256(v[2 * m], _mm256_slli_epi16(v[2 * m + 1], 4)));
        }
    }
    memcpy(out, (const uint8_t *) w + (uint64_t) i * block_bytes, (size_t) (nb - i) * block_bytes);
}

/* Q5_0 and Q5_1: the nibbles with bit j of qh as bit 4 of element j; Q5_0 then less 16. */
RM_INLINE __m256i levels_5bit(const uint8_t * qs, const uint8_t qh[4], const int less16) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i q = nibbles32(qs);
#ifdef RM_KQ_512
    return less16 ? _mm256_mask_sub_epi8(q, (__mmask32) ~h, q, _mm256_set1_epi8(16))
                  : _mm256_mask_add_epi8(q, (__mmask32) h, q, _mm256_set1_epi8(16));
#else
    /* byte j of the spread holds byte j / 8 of qh; the bit set where bit j is */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int) h),
                                               _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((int64_t) 0x8040201008040201);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    /* q | 0xf0 is q - 16 as a signed byte */
    return less16 ? _mm256_or_si256(q, _mm256_andnot_si256(set, _mm256_set1_epi8((char) 0xf0)))
                  : _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
#endif
}

/* Block i's 32 levels, in element order. */
RM_INLINE __m256i b32_levels(const void * w, int64_t i, const int kind) {
    switch (kind) {
    case B32_Q5_0: {
        const rm_block_q5_0 * b = (const rm_block_q5_0 *) w + i;
        return levels_5bit(b->qs, b->qh, 1);
    }
    case B32_Q5_1: {
        const rm_block_q5_1 * b = (const rm_block_q5_1 *) w + i;
        return levels_5bit(b->qs, b->qh, 0);
    }
    case B32_Q4_1:
        return nibbles32(((const rm_block_q4_1 *) w + i)->qs);
    case B32_IQ4_NL: {
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) rm_iq4nl_values));
        return _mm256_shuffle_epi8(table, nibbles32(((const rm_block_iq4_nl *) w + i)->qs));
    }
    default: {   /* B32_MXFP4 */
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) rm_mxfp4_values));
        return _mm256_shuffle_epi8(table, nibbles32(((const rm_block_mxfp4 *) w + i)->qs));
    }
    }
}

/* The signed kinds' levels plus b32_offset: Q5_0's q, the tables' levels plus 128 (bytes 1..241). */
RM_INLINE __m256i b32_levels_unsigned(const void * w, int64_t i, const int kind) {
    if (kind == B32_Q5_0) {
        const rm_block_q5_0 * b = (const rm_block_q5_0 *) w + i;
        return levels_5bit(b->qs, b->qh, 0);
    }
    return _mm256_xor_si256(b32_levels(w, i, kind), _mm256_set1_epi8((char) 0x80));
}

/* The offset of the unsigned levels a one-token kernel takes with the activations' sums: in the
 * AVX2 set the smallest that makes them unsigned, so that vpmaddubsw's pairs hold them (levels up
 * to 31: Q5_0's q, MXFP4's levels plus 12; IQ4_NL's would reach 241: it keeps the signed way). */
#ifdef RM_KQ_512
#define B32_OFFSET_WAY(kind) b32_signed[kind]
RM_INLINE __m256i b32_levels_offset(const void * w, int64_t i, const int kind) { return b32_levels_unsigned(w, i, kind); }
RM_INLINE float b32_offset_of(const int kind) { return b32_offset[kind]; }
#else
#define B32_OFFSET_WAY(kind) ((kind) == B32_Q5_0 || (kind) == B32_MXFP4)
RM_INLINE __m256i b32_levels_offset(const void * w, int64_t i, const int kind) {
    return kind == B32_MXFP4 ? _mm256_add_epi8(b32_levels(w, i, kind), _mm256_set1_epi8(12)) : b32_levels_unsigned(w, i, kind);
}
RM_INLINE float b32_offset_of(const int kind) { return kind == B32_MXFP4 ? 12.0f : b32_offset[kind]; }
#endif

/* Block i's scale d_w as a float. */
RM_INLINE float b32_scale(const void * w, int64_t i, const int kind) {
    const uint8_t * b = (const uint8_t *) w + (uint64_t) i * b32_block_bytes[kind];
    if (kind == B32_MXFP4) {
        return rm_e8m0_to_fp32_half(b[0]);
    }
    rm_fp16 h;
    memcpy(&h, b, 2);   /* d is each block's first field */
    return fp16(h);
}

/* The eight int32 lanes of u . s, u unsigned bytes and s signed. */
RM_INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
#ifdef RM_KQ_512
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* Lanes of one block's integer dot with activations x (32 bytes): q the levels, aq = |q| for
 * the signed kinds (x then takes q's signs). */
RM_INLINE __m256i b32_block_dot(__m256i q, __m256i aq, const int8_t * x, const int kind) {
    const __m256i v = _mm256_loadu_si256((const __m256i *) x);
    return b32_signed[kind] ? dot_u8s8(aq, _mm256_sign_epi8(v, q)) : dot_u8s8(q, v);
}

/* out[c] = dot(w, token c) for nc tokens (1, 4, or with AVX-512 8), tokens x_stride bytes apart.
 * For the Q8_0 kinds the activation scales come from x_info when given (the same floats), and a
 * block's integer dot is then taken on the unsigned levels (b32_levels_offset), less the offset
 * times the block's activation sum (x_info's): one vpdpbusd with VNNI, or no signs to move in the
 * AVX2 set (Q5_0 and MXFP4 only: vpmaddubsw would saturate on IQ4_NL's unsigned levels). The same
 * integers, exact in float, so the same results either way. */
RM_INLINE void dot_b32(int64_t n, float * out, const void * w, const void * x_q, uint64_t x_stride, const int nc,
                       const float * x_info, int64_t x_info_stride, const int kind) {
    const int64_t nb = n / RM_QK;
    const size_t wbytes = b32_block_bytes[kind], xbytes = b32_act_bytes[kind];
    const int sgn = b32_signed[kind];
    const int offset_way = B32_OFFSET_WAY(kind) && x_info;
    const uint8_t * wb = w;
    const uint8_t * x[RM_MULTI_MAX];
    __m256 acc[RM_MULTI_MAX];
    for (int c = 0; c < nc; c++) {
        x[c] = (const uint8_t *) x_q + (uint64_t) c * x_stride;
        acc[c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        const uint8_t * g = wb + (uint64_t) i * wbytes;
        if (nc == 1) {
            rm_stream_ahead(g, (int) (8 * wbytes));
        }
        const __m256 dw = kind == B32_MXFP4 ? e8m0_half8(g, wbytes) : scales8(g, wbytes);
        __m256 mw = _mm256_setzero_ps();
        if (!sgn) {
            mw = scales8(g + 2, wbytes);   /* m follows d */
        }
        __m256i q[8], aq[8];
        for (int k = 0; k < 8; k++) {
            if (offset_way) {
                q[k] = aq[k] = b32_levels_offset(w, i + k, kind);
            } else {
                q[k] = b32_levels(w, i + k, kind);
                aq[k] = sgn ? _mm256_sign_epi8(q[k], q[k]) : q[k];
            }
        }
        for (int c = 0; c < nc; c++) {
            const uint8_t * xg = x[c] + (uint64_t) i * xbytes;
            __m256i p[8];
            __m256 sums;
            if (offset_way) {
                for (int k = 0; k < 8; k++) {
                    p[k] = dot_u8s8(q[k], _mm256_loadu_si256((const __m256i *) (xg + k * xbytes + 2)));
                }
                /* small integers: exact in float, the value the signed way gives */
                sums = _mm256_fnmadd_ps(_mm256_set1_ps(b32_offset_of(kind)), _mm256_loadu_ps(x_info + c * x_info_stride + nb + i),
                                        _mm256_cvtepi32_ps(block_sums8(p)));
            } else {
                for (int k = 0; k < 8; k++) {
                    p[k] = b32_block_dot(q[k], aq[k], (const int8_t *) (xg + k * xbytes + (sgn ? 2 : 4)), kind);
                }
                sums = _mm256_cvtepi32_ps(block_sums8(p));
            }
            const __m256 dx = sgn && x_info ? _mm256_loadu_ps(x_info + c * x_info_stride + i) : scales8(xg, xbytes);
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), sums, acc[c]);
            if (!sgn) {   /* sum((d q + m) x) = d d_x sum(q q_x) + m s_x */
                acc[c] = _mm256_fmadd_ps(mw, scales8(xg + 2, xbytes), acc[c]);
            }
        }
    }
    for (; i < nb; i++) {   /* the last few blocks, one by one */
        const __m256i q = b32_levels(w, i, kind), aq = sgn ? _mm256_sign_epi8(q, q) : q;
        const float dw = b32_scale(w, i, kind);
        for (int c = 0; c < nc; c++) {
            const uint8_t * xb = x[c] + (uint64_t) i * xbytes;
            rm_fp16 h[2];
            memcpy(h, xb, sizeof(h));
            const float dx = sgn && x_info ? x_info[c * x_info_stride + i] : fp16(h[0]);
            const __m256 s = _mm256_cvtepi32_ps(b32_block_dot(q, aq, (const int8_t *) (xb + (sgn ? 2 : 4)), kind));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), s, acc[c]);
            if (!sgn) {
                rm_fp16 m;
                memcpy(&m, wb + (uint64_t) i * wbytes + 2, 2);
                acc[c] = _mm256_add_ps(acc[c], _mm256_setr_ps(fp16(m) * fp16(h[1]), 0, 0, 0, 0, 0, 0, 0));
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        out[c] = hsum_ps(acc[c]);
    }
}

/* The most tokens one pass takes: eight fill the 32 AVX-512 registers, four the 16 of AVX2. */
#ifdef RM_KQ_512
#define B32_WIDE 8
#else
#define B32_WIDE 4
#endif

/* 1 to 8 tokens: passes of B32_WIDE, then four, then one at a time. */
RM_INLINE void dot_b32_tokens(int64_t n, int nc, float * out, const void * w, const void * x_q, uint64_t x_stride,
                              const float * x_info, int64_t x_info_stride, const int kind) {
    for (int c = 0; c < nc;) {
        const uint8_t * xc = (const uint8_t *) x_q + (uint64_t) c * x_stride;
        const float * ic = x_info ? x_info + c * x_info_stride : NULL;
        if (B32_WIDE == 8 && nc - c >= 8) {
            dot_b32(n, out + c, w, xc, x_stride, B32_WIDE, ic, x_info_stride, kind);
            c += B32_WIDE;
        } else if (nc - c >= 4) {
            dot_b32(n, out + c, w, xc, x_stride, 4, ic, x_info_stride, kind);
            c += 4;
        } else {
            dot_b32(n, out + c, w, xc, x_stride, 1, ic, x_info_stride, kind);
            c += 1;
        }
    }
}

#define RM_B32_KERNELS(type, kind)                                                                                 \
    static void vec_dot_##type(int64_t n, float * out, const void * w, const void * x_q) {                         \
        dot_b32(n, out, w, x_q, 0, 1, NULL, 0, kind);                                                              \
    }                                                                                                              \
    static void vec_dot_##type##_multi(int64_t n, int nc, float * out, const void * w, const void * x_q,           \
                                       uint64_t x_stride, const float * x_info, int64_t x_info_stride) {           \
        dot_b32_tokens(n, nc, out, w, x_q, x_stride, x_info, x_info_stride, kind);                                 \
    }
RM_B32_KERNELS(q5_0, B32_Q5_0)
RM_B32_KERNELS(q4_1, B32_Q4_1)
RM_B32_KERNELS(q5_1, B32_Q5_1)
RM_B32_KERNELS(iq4_nl, B32_IQ4_NL)
RM_B32_KERNELS(mxfp4, B32_MXFP4)

#endif
