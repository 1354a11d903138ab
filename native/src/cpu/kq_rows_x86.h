/* kq_rows_x86.h - internal: the tile form of the K-quants (Q2_K to Q6_K, and IQ4_XS in the
 * AVX-512 set) and of the 32-element block types (below) without AMX: sixteen weight rows at once
 * against every token of a product.
 * Included by vec_dot_avx512.c and vec_dot_avx2.c after simd_x86.h (kq_sum's float steps).
 *
 * The prefill form of simd_x86.h (dot_kq_unpacked) takes one row against up to eight tokens: per
 * token and super-block it pays a reduction of its int32 lanes and the float steps, as much work
 * as the products themselves. Here the sixteen rows of a tile lie side by side in the lanes of a
 * register instead, so nothing is reduced across lanes:
 *
 *   D[t] = vpdpbusd(D[t], levels of 16 rows (4 each), token t's 4 activations broadcast)
 *   S[t] += D[t] * sc_j (vpmulld, per 16- or 32-element sub-block j, the 16 rows' scales)
 *   B[t] = sum_j bw_j * bsums_j(t) (vpdpwssd): the mins' term, or the levels' offset
 *
 * for eight tokens at a time against each loaded register of levels (the AVX-512 set; the AVX2 set
 * below takes eight rows to a register, four tokens at a time, and sums its products in int16
 * pairs with vpmaddubsw before one vpmaddwd by the scales). S and B are the integers the
 * one-token kernels reduce a super-block to (the exact S and M of kq_sum), so the float steps are
 * kq_sum's grouped ones, sixteen rows to a register: super-block b goes to partial sum b mod 8 as
 * fma(d_x d_w, S), then fma(-d_x dmin_w, M), and the eight partial sums are added as hsum_ps adds
 * them. Every output is bit for bit the AVX-512 set's vec_dot (rm_tile_kernels.exact).
 *
 * Layouts. A thread's room holds the tile's rows as levels in unsigned bytes (the type's offset
 * added), packed straight from the stored blocks by the type's tpack below (the AVX2 set's Q2_K
 * and Q3_K: unpacked by simd_x86.h's unpack_*, then transposed), per super-block: the levels, 4
 * elements of 16 rows per 64 bytes (group e at 64 e: 4096 bytes); the sixteen 16-element sub-
 * blocks' scales as int32 [j][row] (1024); the bsums' weights in int16 pairs [pair][row] (512); d
 * and dmin as floats [row] (128). Rows past the matrix are zero. The activations are the tokens'
 * Q8_K rows as they are, side by side (put_group copies them). The AVX2 set keeps its scales as
 * int16 pairs (sc, sc) in the scales' places, for vpmaddwd, and reads each 64 bytes as two halves
 * of eight rows. */
#ifndef RM_CPU_KQ_ROWS_X86_H
#define RM_CPU_KQ_ROWS_X86_H

#include "transpose_x86.h"

#define KR_LEV 0
#define KR_SC 4096
#define KR_BW 5120
#define KR_D 5632
#define KR_BYTES 5760    /* one super-block of RM_TILE_ROWS rows */
#define KR_TOKENS 8      /* tokens per pass over the tile: 8 sums and 8 dots in registers */
/* The stored tiles of Q4_K and Q6_K (both sets) and Q5_K (the AVX-512 set; see "kept sixteen rows
 * interleaved" below): where a super-block's parts lie. */
#define KS16_U 0
#define KS16_LEV 192
#define KS16_D 2240
#define KS16_DMIN 2272
/* Q6_K (16 * 210 bytes a super-block): the rows' 16 signed scales as 4 words each, word by word
 * (at 0); then for each 16-element sub-block j, at 256 + 192 j: the levels' low 4 bits as above
 * but paired within the sub-block, groups 4j + q and 4j + q + 2 in the q-th 64 bytes (q = 0, 1),
 * and their high 2 bits in the third, byte 4r + i holding group 4j + k's element i of row r at bits
 * 2k, 2k + 1; the sixteen d last (3328). Each super-block is read in the order it lies. */
#define KS16_Q6_SC 0
#define KS16_Q6_LEV(j, q) (256 + 192 * (j) + 64 * (q))
#define KS16_Q6_HB(j) (256 + 192 * (j) + 128)
#define KS16_Q6_D 3328
/* Q5_K (16 * 176 bytes, the AVX-512 set): Q4_K's scale words (at 0); then for each 32-element
 * sub-block J, at 192 + 320 J, Q4_K's four runs of 64 bytes of its low 4 bits, and a fifth run
 * holding the fifth bits of its eight groups, byte 4r + i holding group 8J + k's element i of row r
 * at bit k; the sixteen d, then the sixteen dmin, last (2752). */
#define KS16_Q5_LEV(J, q) (192 + 320 * (J) + 64 * (q))
#define KS16_Q5_HB(J) (192 + 320 * (J) + 256)
#define KS16_Q5_D 2752
#define KS16_Q5_DMIN 2784
/* IQ4_XS (16 * 136 bytes, the AVX-512 set): the rows' words d | scales_h << 16 (at 0), their
 * scales_l (64), then Q4_K's runs of level pairs (at 128 + 64 (4J + q)), holding the table's
 * indices: each run is a dword transpose of the rows' qs bytes 16J + 4q.. as they are. */
#define KS16_IQ4_DH 0
#define KS16_IQ4_SL 64
#define KS16_IQ4_LEV(J, q) (128 + 64 * (4 * (J) + (q)))
/* Which type a stored tile holds (ks16_tokens' kind). */
#define KS16_Q4 0
#define KS16_Q6 1
#define KS16_Q5 2
#define KS16_IQ4 3

typedef void (*kq_unpack_fn)(const void *, int64_t, kq_unpacked *);
/* A super-block of sixteen rows packed straight from the stored blocks (the AVX-512 set). */
typedef void (*kq_tpack_fn)(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb);

/* The eight partial sums a[0..7] (lane l: the super-blocks or blocks l mod 8) added as hsum_ps
 * adds a vector's eight lanes: ((0+4) + (2+6)) + ((1+5) + (3+7)). */
RM_INLINE __m256 sum8_ps256(const __m256 a[8]) {
    const __m256 even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    const __m256 odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    return _mm256_add_ps(even, odd);
}

#ifdef RM_KQ_GROUPED
RM_INLINE __m512 sum8_ps512(const __m512 a[8]) {
    const __m512 even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
    const __m512 odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
    return _mm512_add_ps(even, odd);
}
#endif

static int usable_rows_kq(int64_t n) { return n > 0 && n % RM_QK_K == 0; }

static uint64_t act_bytes_rows_kq(int64_t n, int32_t n_tok) {
    return (uint64_t) n_tok * (uint64_t) (n / RM_QK_K) * sizeof(rm_block_q8_K);
}

static uint64_t room_bytes_rows_kq(int64_t n) { return (uint64_t) (n / RM_QK_K) * KR_BYTES; }

static void put_group_rows_kq(int64_t n, const void * x_q, uint64_t x_stride, int32_t i0, int32_t count, void * x_t) {
    const uint64_t row = (uint64_t) (n / RM_QK_K) * sizeof(rm_block_q8_K);
    for (int32_t c = 0; c < count; c++) {
        memcpy((uint8_t *) x_t + (uint64_t) (i0 + c) * row, (const uint8_t *) x_q + (uint64_t) c * x_stride, row);
    }
}

/* ---- the 32-element blocks: Q4_0, Q8_0, Q5_0, IQ4_NL, MXFP4 -------------------------------------
 *
 * The same tiles for the types of 32-element blocks against Q8_0 activations: sixteen rows'
 * levels side by side as unsigned bytes, each type's levels plus its offset (Q4_0's nibbles, less
 * 8 in the kernels; Q8_0's levels plus 128; Q5_0's q, less 16; IQ4_NL's table levels plus 128;
 * MXFP4's plus 12), a block's integer dot per row and token (the unsigned levels times x, with
 * vpdpbusd or in int16 pairs, less the offset times sum(x)), then the one-token kernels' float
 * steps (dot_32_multi's and block32_x86.h's, alike in both sets): block k of a group of eight into
 * lane k as fma(d_w d_x, S), and each block past the last whole group into every lane l, its
 * elements 4l..4l + 3 (the lanes of a block's integer dot there), the lanes added as hsum_ps adds
 * them. In the AVX2 set without AVX-VNNI, the levels past 31 (Q8_0's and IQ4_NL's) would overflow
 * vpmaddubsw's int16 pairs: those two types are packed signed instead and take the sign trick (the
 * magnitudes times the activations with the levels' signs, each pair of products into int32 lanes
 * at once; the same integers, no offset). Q4_0 and MXFP4 rows may be kept in the stored layout
 * (block32_x86.h's b32_repack_row, both sets): they are read from there.
 *
 * Room per group of eight blocks (the last one partial when the row ends inside it, its missing
 * blocks zero): the levels, group e of 4 elements of 16 rows at 64 e (4096 bytes); the blocks' d as
 * floats [block][row] (512). Activations per token and block: its 32 levels, d as a float, and the
 * sum of the levels (40 bytes). */
#define B32R_D 4096
#define B32R_BYTES 4608
#define B32R_ACT 40

enum { R32_Q4_0, R32_Q8_0, R32_Q5_0, R32_IQ4_NL, R32_MXFP4 };
static const int32_t r32_offset[] = {8, 128, 16, 128, 12};
static const size_t r32_block_bytes[] = {sizeof(rm_block_q4_0), sizeof(rm_block_q8_0), sizeof(rm_block_q5_0),
                                         sizeof(rm_block_iq4_nl), sizeof(rm_block_mxfp4)};

/* Block i of a row as the room holds it: its levels plus the type's offset, and (d) its scale. */
RM_INLINE __m256i r32_levels(const uint8_t * row, int64_t i, const int kind, float * d) {
    const uint8_t * blk = row + (uint64_t) i * r32_block_bytes[kind];
    if (kind == R32_MXFP4) {
        *d = rm_e8m0_to_fp32_half(blk[0]);
        return _mm256_add_epi8(b32_levels(row, i, B32_MXFP4), _mm256_set1_epi8(12));
    }
    rm_fp16 h;
    memcpy(&h, blk, sizeof(h));   /* d is each block's first field */
    *d = fp16(h);
    switch (kind) {
    case R32_Q4_0: return nibbles_lo_hi(((const rm_block_q4_0 *) blk)->qs);
    case R32_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) ((const rm_block_q8_0 *) blk)->qs),
                                _mm256_set1_epi8((char) 0x80));
    case R32_Q5_0: return b32_levels_unsigned(row, i, B32_Q5_0);
    default: return b32_levels_unsigned(row, i, B32_IQ4_NL);
    }
}

static int usable_rows_32(int64_t n) { return n > 0 && n % RM_QK == 0; }
#define usable_rows_q4_0 usable_rows_32
#define usable_rows_q5_0 usable_rows_32
#define usable_rows_mxfp4 usable_rows_32
#define usable_rows_q8_0 usable_rows_32
#define usable_rows_iq4_nl usable_rows_32

static uint64_t act_bytes_rows_32(int64_t n, int32_t n_tok) { return (uint64_t) n_tok * (uint64_t) (n / RM_QK) * B32R_ACT; }

static uint64_t room_bytes_rows_32(int64_t n) { return (uint64_t) ((n / RM_QK + 7) / 8) * B32R_BYTES; }

static void put_group_rows_32(int64_t n, const void * x_q, uint64_t x_stride, int32_t i0, int32_t count, void * x_t) {
    const int64_t nb = n / RM_QK;
    for (int32_t c = 0; c < count; c++) {
        const rm_block_q8_0 * x = (const rm_block_q8_0 *) ((const uint8_t *) x_q + (uint64_t) c * x_stride);
        uint8_t * t = (uint8_t *) x_t + (uint64_t) (i0 + c) * (uint64_t) nb * B32R_ACT;
        for (int64_t b = 0; b < nb; b++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *) x[b].qs);
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
            const float d = fp16(x[b].d);   /* as rm_q8_0_act_info has it */
            const int32_t sum = hsum_epi32(s);
            _mm256_storeu_si256((__m256i *) (t + B32R_ACT * b), q);
            memcpy(t + B32R_ACT * b + 32, &d, 4);
            memcpy(t + B32R_ACT * b + 36, &sum, 4);
        }
    }
}

/* Token x's block b (B32R_ACT bytes each): its scale, and the offset times the sum of its levels
 * (all 32, or, with e >= 0, elements 4e..4e + 3 alone). */
RM_INLINE float r32_act_d(const uint8_t * x, int64_t b) {
    float d;
    memcpy(&d, x + (uint64_t) b * B32R_ACT + 32, 4);
    return d;
}

RM_INLINE int32_t r32_act_less(const uint8_t * x, int64_t b, int e, const int kind) {
    const uint8_t * xb = x + (uint64_t) b * B32R_ACT;
    int32_t sum;
    if (e < 0) {
        memcpy(&sum, xb + 36, 4);
    } else {
        const int8_t * q = (const int8_t *) xb + 4 * e;
        sum = q[0] + q[1] + q[2] + q[3];
    }
    return (int32_t) ((uint32_t) sum * (uint32_t) r32_offset[kind]);
}

/* Eight rows' whole group g from the stored layout into the room (wb, d): rows r0 + 8h.. (those
 * from r1 on as zero blocks). A stored row's T_j holds its blocks' dword j side by side (dword k:
 * block k's elements 4j..4j + 3), so one transpose over the eight rows gives block k's dword j of
 * every row, what the room holds at 64 (8k + j) + 32h: the levels r32_levels gives, unpacked in a
 * few operations per 64 instead of gathered block by block. */
RM_INLINE void r32_pack_stored_group(const uint8_t * w, uint64_t row_bytes, int64_t r0, int64_t r1, int64_t g, int h,
                                     uint8_t * wb, float * d, const int kind) {
    const size_t scale_bytes = kind == R32_MXFP4 ? 8 : 16;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i table = _mm256_broadcastsi128_si256(   /* MXFP4's levels plus 12, by index */
        _mm_add_epi8(_mm_loadu_si128((const __m128i *) rm_mxfp4_values), _mm_set1_epi8(12)));
    __m256i t[8][8];   /* [j][row] */
    for (int r = 0; r < 8; r++) {
        const int64_t row = r0 + 8 * h + r;
        const uint8_t * src = w + (uint64_t) row * row_bytes + (uint64_t) g * 8 * r32_block_bytes[kind];
        for (int k = 0; k < 8; k++) {
            float * dk = &d[RM_TILE_ROWS * k + 8 * h + r];
            if (row >= r1) {
                *dk = 0.0f;
            } else if (kind == R32_MXFP4) {
                *dk = rm_e8m0_to_fp32_half(src[k]);
            } else {
                rm_fp16 x;
                memcpy(&x, src + 2 * k, sizeof(x));
                *dk = fp16(x);
            }
        }
        for (int m = 0; m < 4; m++) {
            if (row >= r1) {
                t[2 * m][r] = t[2 * m + 1][r] = _mm256_setzero_si256();
                continue;
            }
            const __m256i v = _mm256_loadu_si256((const __m256i *) (src + scale_bytes + 32 * m));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (kind == R32_MXFP4) {
                lo = _mm256_shuffle_epi8(table, lo);
                hi = _mm256_shuffle_epi8(table, hi);
            }
            t[2 * m][r] = lo;
            t[2 * m + 1][r] = hi;
        }
    }
    for (int j = 0; j < 8; j++) {
        transpose8_epi32(t[j]);
        for (int k = 0; k < 8; k++) {
            _mm256_storeu_si256((__m256i *) (wb + 64 * (8 * k + j) + 32 * h), t[j][k]);
        }
    }
}

/* sgn: the levels signed instead (the offset-128 kinds, Q8_0 and IQ4_NL: the stored byte less 128,
 * i.e. its top bit flipped back), for the AVX2 set's sign-trick form. */
RM_INLINE void pack_rows_32(int64_t n, const uint8_t * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                            uint8_t * room, const int kind, const int sgn) {
    const int64_t nb = n / RM_QK;
    for (int64_t g = 0; g < (nb + 7) / 8; g++) {
        uint8_t * wb = room + (uint64_t) g * B32R_BYTES;
        float * d = (float *) (wb + B32R_D);
        for (int h = 0; h < 2; h++) {
            if (stored && 8 * g + 8 <= nb) {   /* Q4_0, MXFP4: eight blocks take as many bytes in either layout */
                r32_pack_stored_group(w, row_bytes, r0, r1, g, h, wb, d, kind);
                continue;
            }
            __m256i lev[8][8];   /* [block][row] */
            for (int r = 0; r < 8; r++) {
                const int64_t row = r0 + 8 * h + r;
                const uint8_t * src = w + (uint64_t) row * row_bytes;
                for (int k = 0; k < 8; k++) {
                    float * dk = &d[RM_TILE_ROWS * k + 8 * h + r];
                    if (row >= r1 || 8 * g + k >= nb) {
                        lev[k][r] = _mm256_setzero_si256();
                        *dk = 0.0f;
                    } else {   /* the file's layout, or a stored row's blocks past its groups (the file's) */
                        lev[k][r] = r32_levels(src, 8 * g + k, kind, dk);
                        if (sgn) {
                            lev[k][r] = _mm256_xor_si256(lev[k][r], _mm256_set1_epi8((char) 0x80));
                        }
                    }
                }
            }
            for (int k = 0; k < 8; k++) {   /* dword j of block k: elements 32 k + 4 j.., group 8 k + j */
                transpose8_epi32(lev[k]);
                for (int j = 0; j < 8; j++) {
                    _mm256_storeu_si256((__m256i *) (wb + 64 * (8 * k + j) + 32 * h), lev[k][j]);
                }
            }
        }
    }
}

/* Rows r0..r1 (at most RM_TILE_ROWS) of w into the room by a type's tpack, super-block by
 * super-block (rows past the matrix read a zero block). */
RM_INLINE void pack_rows_stored(int64_t nsb, const uint8_t * w, uint64_t row_bytes, int64_t r0, int64_t r1,
                                uint8_t * room, kq_tpack_fn tpack, const size_t bsize) {
    static const uint8_t zero[256] __attribute__((aligned(64)));
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t * src[RM_TILE_ROWS];
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            src[r] = r0 + r < r1 ? w + (uint64_t) (r0 + r) * row_bytes + (uint64_t) b * bsize : zero;
            if (r0 + r < r1 && b + 1 < nsb) {   /* sixteen streams: more than the prefetchers follow */
                for (size_t o = 0; o < bsize; o += 64) {
                    __builtin_prefetch(src[r] + bsize + o, 0, 3);
                }
            }
        }
        tpack(src, room + (uint64_t) b * KR_BYTES);
    }
}

/* ---- IQ2_XXS and IQ3_XXS: codebook levels decoded row by row ----------------------------------
 *
 * Their levels are codebook entries picked by index bytes, so they are decoded per row (8 or 4
 * bytes a load, iq_grid_x86.h) and then turned on their side by dword transposes, eight rows at a
 * time. The levels are signed (IQ2_XXS up to 43, IQ3_XXS up to 62): the AVX-512 set keeps them
 * plus 128 (the sign bit flipped) with the scales as the offset's weights, as IQ4_XS; the AVX2 set
 * keeps them signed for the sign trick. A sub-block of 32 has one multiplier 2s + 1 (in both
 * 16-element places); d is kept times the type's step (a power of two: d_x (d_w step) is the
 * one-token kernels' (d_x d_w) step, the same float). */
RM_INLINE void tpack_iq_grid(const uint8_t * const src16[RM_TILE_ROWS], uint8_t * wb, const int kind) {
    const float step = kind == IQ_GRID_2XXS ? 0.125f : 0.25f;
    for (int rh = 0; rh < 2; rh++) {   /* rows 8 rh .. 8 rh + 7 */
        __m256i lev[8][8], mul[8];     /* [sub-block][row]; [row] 2s + 1 of its sub-blocks, int16 pairs */
        float * d = (float *) (wb + KR_D) + 8 * rh;
        for (int r = 0; r < 8; r++) {
            const uint8_t * blk = src16[8 * rh + r];
            rm_fp16 h;
            memcpy(&h, blk, sizeof(h));
            d[r] = fp16(h) * step;
            d[RM_TILE_ROWS + r] = 0.0f;
            const uint8_t * qs = blk + sizeof(rm_fp16);
#ifdef RM_KQ_GROUPED
            uint32_t signs[8];
            iq_grid_words(iq_grid_ss(qs, kind), signs, (uint32_t *) &mul[r]);
            for (int j = 0; j < 8; j++) {   /* the negative levels negated, then 128 added */
                const __m256i mag = iq_grid_mag(qs, j, kind);
                lev[j][r] = _mm256_xor_si256(_mm256_mask_sub_epi8(mag, (__mmask32) signs[j], _mm256_setzero_si256(), mag),
                                             _mm256_set1_epi8((char) 0x80));
            }
#else
            uint32_t m[8];
            for (int j = 0; j < 8; j++) {
                __m256i sgn;
                int mj;
                const __m256i mag = iq_grid_sub(qs, j, &sgn, &mj, kind);
                lev[j][r] = _mm256_sign_epi8(mag, sgn);
                m[j] = (uint32_t) mj * 0x10001u;
            }
            mul[r] = _mm256_loadu_si256((const __m256i *) m);
#endif
        }
        for (int j = 0; j < 8; j++) {   /* dword i of sub-block j: elements 32 j + 4 i.., group 8 j + i */
            transpose8_epi32(lev[j]);
            for (int i = 0; i < 8; i++) {
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * j + i) + 32 * rh), lev[j][i]);
            }
        }
        transpose8_epi32(mul);   /* mul[j] lane r: row r's sub-block j */
        for (int j = 0; j < 8; j++) {
#ifdef RM_KQ_GROUPED
            const __m256i sc = _mm256_and_si256(mul[j], _mm256_set1_epi32(0xffff));   /* int32 */
            _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * j + 32 * rh), mul[j]);
#else
            const __m256i sc = mul[j];   /* the (sc, sc) pairs of vpmaddwd */
#endif
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * j) + 32 * rh), sc);
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * j + 1) + 32 * rh), sc);
        }
    }
}

static void tpack_iq2_xxs(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_iq_grid(src, wb, IQ_GRID_2XXS); }
static void tpack_iq3_xxs(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_iq_grid(src, wb, IQ_GRID_3XXS); }
#define KQ_TPACK_iq2_xxs tpack_iq2_xxs
#define KQ_TPACK_iq3_xxs tpack_iq3_xxs
#define KQ_UNPACK_iq2_xxs NULL
#define KQ_UNPACK_iq3_xxs NULL

#ifdef RM_KQ_GROUPED   /* the AVX-512 set */

/* ---- packing a super-block of sixteen rows straight from the stored blocks ---------------------
 *
 * Q4_K, Q5_K, Q6_K and IQ4_XS are turned on their side as they are stored: the level bytes of
 * the sixteen rows by dword transposes (two nibbles, or four 2-bit fields, to a byte: half the
 * transposes of unpacked levels or fewer), the levels then made in place in every lane at once,
 * and the scales decoded from the rows' headers side by side (lane r: row r). The room is the one
 * the unpacking packer writes, byte for byte. src[r]: row r's super-block (a zero block for rows
 * past the matrix). */
/* t[j] lane r := dword j of the 64 bytes at src[r] + o. */
RM_INLINE void side16(const uint8_t * const src[RM_TILE_ROWS], size_t o, __m512i t[16]) {
    for (int r = 0; r < RM_TILE_ROWS; r++) {
        t[r] = _mm512_loadu_si512(src[r] + o);
    }
    transpose16_epi32(t);
}

/* h[j] lane r := dword j of the 32 bytes at src[r] + o. */
RM_INLINE void side8(const uint8_t * const src[RM_TILE_ROWS], size_t o, __m512i h[8]) {
    __m256i a[8], b[8];
    for (int r = 0; r < 8; r++) {
        a[r] = _mm256_loadu_si256((const __m256i *) (src[r] + o));
        b[r] = _mm256_loadu_si256((const __m256i *) (src[8 + r] + o));
    }
    transpose8_epi32(a);
    transpose8_epi32(b);
    for (int j = 0; j < 8; j++) {
        h[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a[j]), b[j], 1);
    }
}

/* w[i] lane r := dword i of the 16 bytes at src[r] + o. */
RM_INLINE void side4(const uint8_t * const src[RM_TILE_ROWS], size_t o, __m512i w[4]) {
    __m512i q[4];   /* q[k] dword 4m + i: row 4k + m's dword i */
    for (int k = 0; k < 4; k++) {   /* the lane of an insert must be a constant, unrolled or not */
        q[k] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *) (src[4 * k] + o)));
        q[k] = _mm512_inserti32x4(q[k], _mm_loadu_si128((const __m128i *) (src[4 * k + 1] + o)), 1);
        q[k] = _mm512_inserti32x4(q[k], _mm_loadu_si128((const __m128i *) (src[4 * k + 2] + o)), 2);
        q[k] = _mm512_inserti32x4(q[k], _mm_loadu_si128((const __m128i *) (src[4 * k + 3] + o)), 3);
    }
    for (int i = 0; i < 4; i++) {
        const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                                             _mm512_set1_epi32(i));
        const __m512i lo = _mm512_permutex2var_epi32(q[0], idx, q[1]), hi = _mm512_permutex2var_epi32(q[2], idx, q[3]);
        w[i] = _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
    }
}

/* Bit b of every byte of v moved to bit 4 (16-bit shifts: b <= 7 brings no other byte's bit). */
RM_INLINE __m512i bit_to4(__m512i v, const int b) {
    return b < 4 ? _mm512_slli_epi16(v, 4 - b) : b > 4 ? _mm512_srli_epi16(v, b - 4) : v;
}

/* The lanes' fp16 scales (the low halves of h) as floats. */
RM_INLINE __m512 side_fp16(__m512i h) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)); }

/* A 32-element sub-block's scale in every lane (int32), in both of its 16-element places. */
RM_INLINE void put_sc32(uint8_t * wb, int k, __m512i sc) {
    _mm512_storeu_si512(wb + KR_SC + 64 * (2 * k), sc);
    _mm512_storeu_si512(wb + KR_SC + 64 * (2 * k + 1), sc);
}

/* The sixteen 16-element sub-blocks' scales sc[j] (int32 lanes) into the room, and the bsums'
 * weights bw_j in int16 pairs (bw 2p, bw 2p + 1). */
RM_INLINE void put_sc16(uint8_t * wb, const __m512i sc[16], const __m512i bw[16]) {
    for (int j = 0; j < 16; j++) {
        _mm512_storeu_si512(wb + KR_SC + 64 * j, sc[j]);
    }
    for (int p = 0; p < 8; p++) {
        const __m512i pair = _mm512_or_si512(_mm512_and_si512(bw[2 * p], _mm512_set1_epi32(0xffff)),
                                             _mm512_slli_epi32(bw[2 * p + 1], 16));
        _mm512_storeu_si512(wb + KR_BW + 64 * p, pair);
    }
}

/* Q4_K / Q5_K: d and dmin, the 6-bit scales and mins (scales_k4's fields, lane by lane), the
 * nibbles of qs byte 32p + l as elements 64p + l and 64p + 32 + l, with Q5_K's fifth bits. */
RM_INLINE void tpack_k4(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb, const int five) {
    __m512i w[4];
    side4(src, 0, w);   /* d | dmin << 16, then the 12 scale bytes as u0, u1, u2 */
    _mm512_storeu_ps(wb + KR_D, side_fp16(w[0]));
    _mm512_storeu_ps(wb + KR_D + 64, side_fp16(_mm512_srli_epi32(w[0], 16)));
    const __m512i m6 = _mm512_set1_epi32(0x3f), m4 = _mm512_set1_epi32(0x0f), m2 = _mm512_set1_epi32(0x30);
    for (int k = 0; k < 8; k++) {
        __m512i sc, mn;
        if (k < 4) {
            sc = _mm512_and_si512(_mm512_srli_epi32(w[1], 8 * k), m6);
            mn = _mm512_and_si512(_mm512_srli_epi32(w[2], 8 * k), m6);
        } else {
            const int c = 8 * (k - 4);
            sc = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(w[3], c), m4),
                                           _mm512_srli_epi32(w[1], c + 2), m2, 0xf8);
            mn = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(w[3], c + 4), m4),
                                           _mm512_srli_epi32(w[2], c + 2), m2, 0xf8);
        }
        put_sc32(wb, k, sc);
        _mm512_storeu_si512(wb + KR_BW + 64 * k, _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16)));
    }
    const __m512i n4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    __m512i qh[8];
    if (five) {
        side8(src, offsetof(rm_block_q5_K, qh), qh);
    }
    for (int s = 0; s < 2; s++) {
        __m512i t[16];
        side16(src, (five ? offsetof(rm_block_q5_K, qs) : offsetof(rm_block_q4_K, qs)) + 64 * s, t);
        for (int j = 0; j < 16; j++) {   /* qs bytes 32p + l.., l = 4 (j % 8) */
            const int p = 2 * s + j / 8, l4 = j % 8;
            __m512i lo = _mm512_and_si512(t[j], n4), hi = _mm512_and_si512(_mm512_srli_epi16(t[j], 4), n4);
            if (five) {
                lo = _mm512_ternarylogic_epi32(lo, bit_to4(qh[l4], 2 * p), b4, 0xf8);
                hi = _mm512_ternarylogic_epi32(hi, bit_to4(qh[l4], 2 * p + 1), b4, 0xf8);
            }
            /* the file's byte 32p + l: elements 64p + l (group 16p + l4) and 64p + 32 + l */
            _mm512_storeu_si512(wb + KR_LEV + 64 * (16 * p + l4), lo);
            _mm512_storeu_si512(wb + KR_LEV + 64 * (16 * p + l4 + 8), hi);
        }
    }
}

static void tpack_q4_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_k4(src, wb, 0); }
static void tpack_q5_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_k4(src, wb, 1); }

/* Q6_K: levels + 32 from ql's nibbles and qh's 2-bit fields (levels_q6_K's, lane by lane), the
 * sixteen signed scales, d. */
static void tpack_q6_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) {
    __m512i w[4];
    side4(src, offsetof(rm_block_q6_K, scales), w);
    uint16_t d16[RM_TILE_ROWS];
    for (int r = 0; r < RM_TILE_ROWS; r++) {
        memcpy(&d16[r], src[r] + offsetof(rm_block_q6_K, d), 2);
    }
    _mm512_storeu_ps(wb + KR_D, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) d16)));
    _mm512_storeu_ps(wb + KR_D + 64, _mm512_setzero_ps());
    __m512i sc[16];
    for (int j = 0; j < 16; j++) {
        sc[j] = _mm512_srai_epi32(_mm512_slli_epi32(w[j / 4], 24 - 8 * (j % 4)), 24);
    }
    put_sc16(wb, sc, sc);
    const __m512i n4 = _mm512_set1_epi8(0x0f), m2h = _mm512_set1_epi8(0x30);
    __m512i qh[16];
    side16(src, offsetof(rm_block_q6_K, qh), qh);
    for (int h = 0; h < 2; h++) {
        __m512i t[16];
        side16(src, offsetof(rm_block_q6_K, ql) + 64 * h, t);
        for (int j = 0; j < 16; j++) {   /* ql bytes 64h + 32 (j / 8) + l, l = 4 (j % 8) */
            const int g = j / 8, l4 = j % 8;
            const __m512i q = qh[8 * h + l4];   /* qh bytes 32h + l.. */
            const __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(t[j], n4),
                                                         g ? _mm512_slli_epi16(q, 2) : _mm512_slli_epi16(q, 4), m2h, 0xf8);
            const __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(t[j], 4), n4),
                                                         g ? _mm512_srli_epi16(q, 2) : q, m2h, 0xf8);
            _mm512_storeu_si512(wb + KR_LEV + 64 * (8 * (4 * h + g) + l4), lo);       /* chunk 4h + g */
            _mm512_storeu_si512(wb + KR_LEV + 64 * (8 * (4 * h + 2 + g) + l4), hi);   /* chunk 4h + 2 + g */
        }
    }
}

/* IQ4_XS's sub-block J scale less 32 in each row's lane (the packed tiles' and the stored ones'), from
 * the words dh (d | scales_h << 16) and sl (scales_l): nibble J of sl under 2-bit field J of scales_h. */
RM_INLINE __m512i iq4_scale(__m512i dh, __m512i sl, const int J) {
    return _mm512_sub_epi32(_mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * J), _mm512_set1_epi32(0x0f)),
                                                      _mm512_srli_epi32(dh, 16 + 2 * J - 4), _mm512_set1_epi32(0x30), 0xf8),
                            _mm512_set1_epi32(32));
}

/* IQ4_XS: the table's levels plus 128 for the nibbles of qs bytes 16j + l (elements 32j + l and
 * 32j + 16 + l), the scales (6 bits from scales_l and scales_h) less 32 as the offset's weights
 * too, d. */
static void tpack_iq4_xs(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) {
    __m512i w[4];
    side4(src, 0, w);   /* d | scales_h << 16, scales_l */
    _mm512_storeu_ps(wb + KR_D, side_fp16(w[0]));
    _mm512_storeu_ps(wb + KR_D + 64, _mm512_setzero_ps());
    for (int k = 0; k < 8; k++) {
        const __m512i sc = iq4_scale(w[0], w[1], k);
        put_sc32(wb, k, sc);
        _mm512_storeu_si512(wb + KR_BW + 64 * k, _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xffff)),
                                                                _mm512_slli_epi32(sc, 16)));
    }
    const __m512i table = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *) rm_iq4nl_values), _mm_set1_epi8((char) 0x80)));
    const __m512i n4 = _mm512_set1_epi8(0x0f);
    for (int s = 0; s < 2; s++) {
        __m512i t[16];
        side16(src, offsetof(rm_block_iq4_xs, qs) + 64 * s, t);
        for (int j = 0; j < 16; j++) {   /* qs bytes 64s + 4j.. : sub-block 4s + j / 4, l = 4 (j % 4) */
            const int sb = 4 * s + j / 4, l4 = j % 4;
            const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(t[j], n4));
            const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(t[j], 4), n4));
            _mm512_storeu_si512(wb + KR_LEV + 64 * (8 * sb + l4), lo);
            _mm512_storeu_si512(wb + KR_LEV + 64 * (8 * sb + 4 + l4), hi);
        }
    }
}

#define KQ_TPACK_q2_K tpack_q2_K
#define KQ_TPACK_q3_K tpack_q3_K
#define KQ_TPACK_q4_K tpack_q4_K
#define KQ_TPACK_q5_K tpack_q5_K
#define KQ_TPACK_q6_K tpack_q6_K
#define KQ_TPACK_iq4_xs tpack_iq4_xs
#define KQ_UNPACK_q2_K NULL   /* every type is packed straight from storage */
#define KQ_UNPACK_q3_K NULL
#define KQ_UNPACK_q4_K NULL
#define KQ_UNPACK_q5_K NULL
#define KQ_UNPACK_q6_K NULL
#define KQ_UNPACK_iq4_xs NULL

/* Q2_K / Q3_K's levels: the 2-bit fields of qs byte 32h + l at bits 2g as elements 128h + 32g + l
 * (chunk 4h + g), lane by lane; Q3_K's high bit (hmask byte l, bit 4h + g) adds 4 (then the
 * levels are q + 4 in 0..7, levels_q3_K's). */
RM_INLINE void tpack_k2_levels(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb, size_t qs_at, const int hmask) {
    __m512i t[16], hm[8];
    side16(src, qs_at, t);
    if (hmask) {
        side8(src, offsetof(rm_block_q3_K, hmask), hm);
    }
    const __m512i m2 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);
    for (int j = 0; j < 16; j++) {   /* qs bytes 32h + l.., l = 4 (j % 8) */
        const int h = j / 8, l4 = j % 8;
        for (int g = 0; g < 4; g++) {
            __m512i q = _mm512_and_si512(_mm512_srli_epi16(t[j], 2 * g), m2);
            if (hmask) {
                const int e = 4 * h + g - 2;   /* bit 4h + g of each byte to bit 2 */
                const __m512i hi = e < 0 ? _mm512_slli_epi16(hm[l4], -e) : _mm512_srli_epi16(hm[l4], e);
                q = _mm512_ternarylogic_epi32(q, hi, b2, 0xf8);
            }
            _mm512_storeu_si512(wb + KR_LEV + 64 * (8 * (4 * h + g) + l4), q);
        }
    }
}

/* Q2_K: scales[j]'s low nibble the scale, its high one the min; d and dmin. */
static void tpack_q2_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) {
    __m512i w[4], tail[4], sc[16], mn[16];
    side4(src, 0, w);                                                       /* the sixteen scale bytes */
    side4(src, offsetof(rm_block_q2_K, d) + sizeof(rm_fp16) * 2 - 16, tail);   /* ... d | dmin << 16 */
    _mm512_storeu_ps(wb + KR_D, side_fp16(tail[3]));
    _mm512_storeu_ps(wb + KR_D + 64, side_fp16(_mm512_srli_epi32(tail[3], 16)));
    for (int j = 0; j < 16; j++) {
        sc[j] = _mm512_and_si512(_mm512_srli_epi32(w[j / 4], 8 * (j % 4)), _mm512_set1_epi32(0x0f));
        mn[j] = _mm512_and_si512(_mm512_srli_epi32(w[j / 4], 8 * (j % 4) + 4), _mm512_set1_epi32(0x0f));
    }
    put_sc16(wb, sc, mn);
    tpack_k2_levels(src, wb, offsetof(rm_block_q2_K, qs), 0);
}

/* Q3_K: the sixteen 6-bit scales less 32 (scales_q3_K's fields, lane by lane), read with d from
 * the 16 bytes that end the block. */
static void tpack_q3_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) {
    __m512i w[4], sc[16];
    side4(src, sizeof(rm_block_q3_K) - 16, w);   /* qs' last 2 bytes, the 12 scale bytes, d */
    const __m512i u[3] = {_mm512_or_si512(_mm512_srli_epi32(w[0], 16), _mm512_slli_epi32(w[1], 16)),
                          _mm512_or_si512(_mm512_srli_epi32(w[1], 16), _mm512_slli_epi32(w[2], 16)),
                          _mm512_or_si512(_mm512_srli_epi32(w[2], 16), _mm512_slli_epi32(w[3], 16))};
    _mm512_storeu_ps(wb + KR_D, side_fp16(_mm512_srli_epi32(w[3], 16)));
    _mm512_storeu_ps(wb + KR_D + 64, _mm512_setzero_ps());
    for (int j = 0; j < 16; j++) {   /* word k = j / 4 of scales_q3_K's result, byte j % 4 */
        const int k = j / 4, b = j % 4;
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(u[k % 2], 8 * b + 4 * (k / 2)), _mm512_set1_epi32(0x0f));
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(u[2], 8 * b + 2 * k), _mm512_set1_epi32(3));
        sc[j] = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
    }
    put_sc16(wb, sc, sc);
    tpack_k2_levels(src, wb, offsetof(rm_block_q3_K, qs), 1);
}

/* Token t's four activations e (elements 4e..4e + 3) in every lane. */
#define KR_X4(x, e) _mm512_set1_epi32(*(const int32_t *) ((x)->qs + 4 * (e)))

/* nt tokens (1 to KR_TOKENS; x[t] their Q8_K rows) against the packed tile: out[t][row].
 * sixteen: the types whose scales are per 16 elements (Q2_K, Q3_K, Q6_K; else per 32); off_mul:
 * the levels' offset (Q3_K 4, Q6_K 32, IQ4_XS 128; 0: the bsums' term is the mins, Q2_K, Q4_K,
 * Q5_K). */
RM_INLINE void rows_tokens_kq(int64_t nsb, const uint8_t * room, const rm_block_q8_K * const x[KR_TOKENS], const int nt,
                              float out[KR_TOKENS][RM_TILE_ROWS], const int sixteen, const int off_mul) {
    __m512 acc[KR_TOKENS][8];   /* [token][super-block mod 8]: 16 rows; kept in L1 */
    for (int t = 0; t < nt; t++) {
        for (int l = 0; l < 8; l++) {
            acc[t][l] = _mm512_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t * wb = room + (uint64_t) b * KR_BYTES;
        __m512i S[KR_TOKENS], D[KR_TOKENS];
        for (int t = 0; t < nt; t++) {
            S[t] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 16; j += 2 - sixteen) {   /* sub-blocks of 16 (or 32) elements */
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_setzero_si512();
            }
#pragma GCC unroll 8
            for (int e = 4 * j; e < 4 * j + 8 - 4 * sixteen; e++) {
                const __m512i lv = _mm512_loadu_si512(wb + KR_LEV + 64 * e);
                for (int t = 0; t < nt; t++) {
                    D[t] = _mm512_dpbusd_epi32(D[t], lv, KR_X4(x[t] + b, e));
                }
            }
            const __m512i s = _mm512_loadu_si512(wb + KR_SC + 64 * j);
            for (int t = 0; t < nt; t++) {
                S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(D[t], s));
            }
        }
        for (int t = 0; t < nt; t++) {   /* sum_j bw_j bsums_j, pair by pair */
            D[t] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 8; p++) {
            const __m512i bw = _mm512_loadu_si512(wb + KR_BW + 64 * p);
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpwssd_epi32(D[t], bw, _mm512_set1_epi32(*(const int32_t *) (x[t][b].bsums + 2 * p)));
            }
        }
        const __m512 dw = _mm512_loadu_ps(wb + KR_D), dm = _mm512_loadu_ps(wb + KR_D + 64);
        const int l = (int) (b % 8);
        for (int t = 0; t < nt; t++) {
            const __m512 dx = _mm512_set1_ps(x[t][b].d);
            if (off_mul) {   /* times 4, 32 or 128: a shift */
                const __m512i sv = _mm512_sub_epi32(S[t], _mm512_slli_epi32(D[t], off_mul == 4 ? 2 : off_mul == 32 ? 5 : 7));
                acc[t][l] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(sv), acc[t][l]);
            } else {
                acc[t][l] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(S[t]), acc[t][l]);
                acc[t][l] = _mm512_fnmadd_ps(_mm512_mul_ps(dx, dm), _mm512_cvtepi32_ps(D[t]), acc[t][l]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm512_storeu_ps(out[t], sum8_ps512(acc[t]));
    }
}

RM_INLINE void matmul_rows_kq(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                              int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate,
                              kq_unpack_fn unpack, kq_tpack_fn tpack, const size_t bsize, const int sixteen,
                              const int off_mul) {
    const int64_t nsb = n / RM_QK_K;
    const uint64_t xrow = (uint64_t) nsb * sizeof(rm_block_q8_K);
    (void) unpack;   /* every type of the set has its tpack */
    pack_rows_stored(nsb, w, row_bytes, r0, r1, room, tpack, bsize);
    const __mmask16 rows = (__mmask16) ((1u << (r1 - r0)) - 1);
    for (int32_t i0 = 0; i0 < n_tok; i0 += KR_TOKENS) {
        const int nt = n_tok - i0 < KR_TOKENS ? n_tok - i0 : KR_TOKENS;
        const rm_block_q8_K * x[KR_TOKENS];
        for (int t = 0; t < KR_TOKENS; t++) {
            x[t] = (const rm_block_q8_K *) ((const uint8_t *) x_t + (uint64_t) (i0 + (t < nt ? t : 0)) * xrow);
        }
        float out[KR_TOKENS][RM_TILE_ROWS];
        switch (nt) {   /* a copy per count, the token loops unrolled */
        case 8: rows_tokens_kq(nsb, room, x, 8, out, sixteen, off_mul); break;
        case 7: rows_tokens_kq(nsb, room, x, 7, out, sixteen, off_mul); break;
        case 6: rows_tokens_kq(nsb, room, x, 6, out, sixteen, off_mul); break;
        case 5: rows_tokens_kq(nsb, room, x, 5, out, sixteen, off_mul); break;
        case 4: rows_tokens_kq(nsb, room, x, 4, out, sixteen, off_mul); break;
        case 3: rows_tokens_kq(nsb, room, x, 3, out, sixteen, off_mul); break;
        case 2: rows_tokens_kq(nsb, room, x, 2, out, sixteen, off_mul); break;
        default: rows_tokens_kq(nsb, room, x, 1, out, sixteen, off_mul); break;
        }
        for (int t = 0; t < nt; t++) {
            float * yt = y + (int64_t) (i0 + t) * y_stride + r0;
            __m512 v = _mm512_loadu_ps(out[t]);
            if (accumulate) {
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, yt), v);
            }
            _mm512_mask_storeu_ps(yt, rows, v);
        }
    }
}

/* nt tokens (1 to KR_TOKENS) against the packed tile of nb blocks: out[t][row]. */
RM_INLINE void rows_tokens_32(int64_t nb, const uint8_t * room, const uint8_t * const x[KR_TOKENS], const int nt,
                              float out[KR_TOKENS][RM_TILE_ROWS], const int kind) {
    __m512 acc[KR_TOKENS][8];   /* [token][block mod 8]: 16 rows */
    for (int t = 0; t < nt; t++) {
        for (int l = 0; l < 8; l++) {
            acc[t][l] = _mm512_setzero_ps();
        }
    }
    for (int64_t g = 0; g < nb / 8; g++) {
        const uint8_t * wb = room + (uint64_t) g * B32R_BYTES;
        for (int k = 0; k < 8; k++) {
            __m512i S[KR_TOKENS];
            const uint8_t * xb[KR_TOKENS];
            for (int t = 0; t < nt; t++) {
                xb[t] = x[t] + (uint64_t) (8 * g + k) * B32R_ACT;
                S[t] = _mm512_setzero_si512();
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m512i lv = _mm512_loadu_si512(wb + 64 * (8 * k + j));
                for (int t = 0; t < nt; t++) {
                    S[t] = _mm512_dpbusd_epi32(S[t], lv, _mm512_set1_epi32(*(const int32_t *) (xb[t] + 4 * j)));
                }
            }
            const __m512 dw = _mm512_loadu_ps(wb + B32R_D + 64 * k);
            for (int t = 0; t < nt; t++) {
                const __m512i sv = _mm512_sub_epi32(S[t], _mm512_set1_epi32(r32_act_less(x[t], 8 * g + k, -1, kind)));
                acc[t][k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(r32_act_d(x[t], 8 * g + k))),
                                            _mm512_cvtepi32_ps(sv), acc[t][k]);
            }
        }
    }
    const uint8_t * wb = room + (uint64_t) (nb / 8) * B32R_BYTES;
    for (int64_t b = nb / 8 * 8; b < nb; b++) {   /* the blocks past the last whole group, one by one */
        const int k = (int) (b % 8);
        const __m512 dw = _mm512_loadu_ps(wb + B32R_D + 64 * k);
        for (int j = 0; j < 8; j++) {
            const __m512i lv = _mm512_loadu_si512(wb + 64 * (8 * k + j));
            for (int t = 0; t < nt; t++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lv,
                                                      _mm512_set1_epi32(*(const int32_t *) (x[t] + b * B32R_ACT + 4 * j)));
                const __m512i sv = _mm512_sub_epi32(p, _mm512_set1_epi32(r32_act_less(x[t], b, j, kind)));
                acc[t][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(r32_act_d(x[t], b))), _mm512_cvtepi32_ps(sv),
                                            acc[t][j]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm512_storeu_ps(out[t], sum8_ps512(acc[t]));
    }
}

RM_INLINE void matmul_rows_32(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                              const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate,
                              const int kind) {
    const int64_t nb = n / RM_QK;
    const uint64_t xrow = (uint64_t) nb * B32R_ACT;
    pack_rows_32(n, w, stored, row_bytes, r0, r1, room, kind, 0);
    const __mmask16 rows = (__mmask16) ((1u << (r1 - r0)) - 1);
    for (int32_t i0 = 0; i0 < n_tok; i0 += KR_TOKENS) {
        const int nt = n_tok - i0 < KR_TOKENS ? n_tok - i0 : KR_TOKENS;
        const uint8_t * x[KR_TOKENS];
        for (int t = 0; t < KR_TOKENS; t++) {
            x[t] = (const uint8_t *) x_t + (uint64_t) (i0 + (t < nt ? t : 0)) * xrow;
        }
        float out[KR_TOKENS][RM_TILE_ROWS];
        switch (nt) {   /* a copy per count, the token loops unrolled */
        case 8: rows_tokens_32(nb, room, x, 8, out, kind); break;
        case 7: rows_tokens_32(nb, room, x, 7, out, kind); break;
        case 6: rows_tokens_32(nb, room, x, 6, out, kind); break;
        case 5: rows_tokens_32(nb, room, x, 5, out, kind); break;
        case 4: rows_tokens_32(nb, room, x, 4, out, kind); break;
        case 3: rows_tokens_32(nb, room, x, 3, out, kind); break;
        case 2: rows_tokens_32(nb, room, x, 2, out, kind); break;
        default: rows_tokens_32(nb, room, x, 1, out, kind); break;
        }
        for (int t = 0; t < nt; t++) {
            float * yt = y + (int64_t) (i0 + t) * y_stride + r0;
            __m512 v = _mm512_loadu_ps(out[t]);
            if (accumulate) {
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, yt), v);
            }
            _mm512_mask_storeu_ps(yt, rows, v);
        }
    }
}

/* ---- Q4_K, Q5_K and Q6_K kept sixteen rows interleaved (the stored layout) ------------------------
 *
 * A CPU-only model keeps Q4_K matrices of a multiple of sixteen rows (and Q6_K's, and in the
 * AVX-512 set Q5_K's: their layouts at the top of this file) in a layout made for this tile form
 * (the AVX2 set reads it as two halves of eight rows, further down): each sixteen rows are one
 * tile of the same bytes (16 * 144 per super-block), super-block b of all sixteen rows at 2304 b,
 * as
 *
 *   [0, 192)      the three 32-bit words of each row's 12 scale bytes, word by word (u0 of the
 *                 sixteen rows, u1, u2);
 *   [192, 2240)   the levels: 64 bytes for each pair of groups (8J + q, 8J + q + 4) of sub-block J
 *                 (q = 0..3), at 192 + 64 (4J + q): byte 4r + i holds row r's element 4 (8J + q) + i
 *                 in its low nibble and element 4 (8J + q + 4) + i in its high one;
 *   [2240, 2304)  the sixteen d (fp16), then the sixteen dmin.
 *
 * So nothing is packed per product: a 64-byte load and two masks give two groups' levels for
 * sixteen rows, and the scales are decoded lane by lane as the room's are. The integers and the
 * float steps are rows_tokens_kq's, so the floats are the tile form's, which are the one-token
 * kernels' (one token is the tile form with nt = 1: no kernel reads these rows one at a time). */

/* Sixteen rows of Q4_K (five: Q5_K; row_bytes apart) into one tile of the layouts above. */
static void ks16_repack_k4(int64_t n, const void * w, uint64_t row_bytes, void * tile, const int five) {
    uint8_t room[KR_BYTES] __attribute__((aligned(64)));
    const size_t bsize = five ? sizeof(rm_block_q5_K) : sizeof(rm_block_q4_K);
    const __m512i n4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    for (int64_t b = 0; b < n / RM_QK_K; b++) {
        const uint8_t * src[RM_TILE_ROWS];
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            src[r] = (const uint8_t *) w + (uint64_t) r * row_bytes + (uint64_t) b * bsize;
        }
        tpack_k4(src, room, five);   /* the levels (0..15, 0..31) as the room holds them: group e at 64 e */
        uint8_t * o = (uint8_t *) tile + (uint64_t) b * RM_TILE_ROWS * bsize;
        for (int J = 0; J < 8; J++) {
            if (five) {   /* bit k: group 8J + k's fifth bit */
                __m512i hb = _mm512_setzero_si512();
                for (int k = 0; k < 8; k++) {
                    const __m512i g = _mm512_loadu_si512(room + KR_LEV + 64 * (8 * J + k));
                    hb = _mm512_or_si512(hb, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(g, 4), one), k));
                }
                _mm512_storeu_si512(o + KS16_Q5_HB(J), hb);
            }
            for (int q = 0; q < 4; q++) {
                const __m512i lo = _mm512_loadu_si512(room + KR_LEV + 64 * (8 * J + q));
                const __m512i hi = _mm512_loadu_si512(room + KR_LEV + 64 * (8 * J + q + 4));
                _mm512_storeu_si512(o + (five ? KS16_Q5_LEV(J, q) : KS16_LEV + 64 * (4 * J + q)),
                                    _mm512_or_si512(_mm512_and_si512(lo, n4), _mm512_slli_epi16(_mm512_and_si512(hi, n4), 4)));
            }
        }
        __m512i h[4];
        side4(src, 0, h);   /* d | dmin << 16, u0, u1, u2 */
        _mm256_storeu_si256((__m256i *) (o + (five ? KS16_Q5_D : KS16_D)), _mm512_cvtepi32_epi16(h[0]));
        _mm256_storeu_si256((__m256i *) (o + (five ? KS16_Q5_DMIN : KS16_DMIN)),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
        for (int k = 0; k < 3; k++) {
            _mm512_storeu_si512(o + KS16_U + 64 * k, h[1 + k]);
        }
    }
}

static void ks16_repack_q4_K(int64_t n, const void * w, uint64_t row_bytes, void * tile) {
    ks16_repack_k4(n, w, row_bytes, tile, 0);
}

static void ks16_repack_q5_K(int64_t n, const void * w, uint64_t row_bytes, void * tile) {
    ks16_repack_k4(n, w, row_bytes, tile, 1);
}

/* Sixteen rows of Q6_K into one tile of the layout above. */
static void ks16_repack_q6_K(int64_t n, const void * w, uint64_t row_bytes, void * tile) {
    uint8_t room[KR_BYTES] __attribute__((aligned(64)));
    const __m512i n4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < n / RM_QK_K; b++) {
        const uint8_t * src[RM_TILE_ROWS];
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            src[r] = (const uint8_t *) w + (uint64_t) r * row_bytes + (uint64_t) b * sizeof(rm_block_q6_K);
        }
        tpack_q6_K(src, room);   /* the levels + 32 as the room holds them: group e at 64 e */
        uint8_t * o = (uint8_t *) tile + (uint64_t) b * RM_TILE_ROWS * sizeof(rm_block_q6_K);
        for (int j = 0; j < 16; j++) {
            __m512i g[4], hb = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                g[k] = _mm512_loadu_si512(room + KR_LEV + 64 * (4 * j + k));
                hb = _mm512_or_si512(hb, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(g[k], 4), m2), 2 * k));
            }
            for (int q = 0; q < 2; q++) {
                _mm512_storeu_si512(o + KS16_Q6_LEV(j, q),
                                    _mm512_or_si512(_mm512_and_si512(g[q], n4), _mm512_slli_epi16(_mm512_and_si512(g[q + 2], n4), 4)));
            }
            _mm512_storeu_si512(o + KS16_Q6_HB(j), hb);
        }
        __m512i sc[4];
        side4(src, offsetof(rm_block_q6_K, scales), sc);
        for (int k = 0; k < 4; k++) {
            _mm512_storeu_si512(o + KS16_Q6_SC + 64 * k, sc[k]);
        }
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            memcpy(o + KS16_Q6_D + 2 * r, src[r] + offsetof(rm_block_q6_K, d), 2);
        }
    }
}

/* Sixteen rows of IQ4_XS into one tile of the layout above. */
static void ks16_repack_iq4_xs(int64_t n, const void * w, uint64_t row_bytes, void * tile) {
    for (int64_t b = 0; b < n / RM_QK_K; b++) {
        const uint8_t * src[RM_TILE_ROWS];
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            src[r] = (const uint8_t *) w + (uint64_t) r * row_bytes + (uint64_t) b * sizeof(rm_block_iq4_xs);
        }
        uint8_t * o = (uint8_t *) tile + (uint64_t) b * RM_TILE_ROWS * sizeof(rm_block_iq4_xs);
        __m512i h[4];
        side4(src, 0, h);   /* d | scales_h << 16, scales_l */
        _mm512_storeu_si512(o + KS16_IQ4_DH, h[0]);
        _mm512_storeu_si512(o + KS16_IQ4_SL, h[1]);
        for (int s = 0; s < 2; s++) {
            __m512i t[16];
            side16(src, offsetof(rm_block_iq4_xs, qs) + 64 * s, t);
            for (int j = 0; j < 16; j++) {   /* qs bytes 64s + 4j..: sub-block 4s + j / 4's groups j % 4 and 4 + j % 4 */
                _mm512_storeu_si512(o + KS16_IQ4_LEV(4 * s + j / 4, j % 4), t[j]);
            }
        }
    }
}

/* Sub-block J's scale (mins: its min) in each row's lane, from the words u0, u1, u2 (scales_k4's
 * fields, as tpack_k4 decodes them). */
RM_INLINE __m512i ks16_field(const __m512i u[3], const int J, const int mins) {
    const __m512i m6 = _mm512_set1_epi32(0x3f), m4 = _mm512_set1_epi32(0x0f), m2 = _mm512_set1_epi32(0x30);
    if (J < 4) {
        return _mm512_and_si512(_mm512_srli_epi32(u[mins], 8 * J), m6);
    }
    const int c = 8 * (J - 4) + 4 * mins;
    return _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(u[2], c), m4),
                                     _mm512_srli_epi32(u[mins], 8 * (J - 4) + 2), m2, 0xf8);
}

/* Levels of group 4j + k (k = 0..3) of a Q6_K tile: its low 4 bits from the pair load v (k % 2 ==
 * q) and its high 2 bits from hb, at bits 4, 5: q + 32 in 0..63. */
RM_INLINE __m512i ks16_q6_levels(__m512i v, __m512i hb, const int k) {
    const __m512i n4 = _mm512_set1_epi8(0x0f), m2h = _mm512_set1_epi8(0x30);
    const __m512i lo4 = k < 2 ? _mm512_and_si512(v, n4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), n4);
    const __m512i h = k < 2 ? _mm512_slli_epi16(hb, 4 - 2 * k) : k == 2 ? hb : _mm512_srli_epi16(hb, 2);
    return _mm512_ternarylogic_epi32(lo4, h, m2h, 0xf8);
}

/* Sub-block j of super-block b (its levels at sb, the header words u) against the nt tokens: its
 * dot D weighted by its scale into S (ks16_tokens). */
RM_INLINE void ks16_sub(const int j, const uint8_t * sb, int64_t b, const __m512i u[4], const __m512i table,
                        const rm_block_q8_K * const x[KR_TOKENS], const int nt, __m512i S[KR_TOKENS], const int kind) {
    const int six = kind == KS16_Q6, five = kind == KS16_Q5, iq4 = kind == KS16_IQ4;
    const __m512i n4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    __m512i D[KR_TOKENS];
    for (int t = 0; t < nt; t++) {
        D[t] = _mm512_setzero_si512();
    }
    if (six) {
        const __m512i hb = _mm512_loadu_si512(sb + KS16_Q6_HB(j));
        for (int q = 0; q < 2; q++) {
            const __m512i v = _mm512_loadu_si512(sb + KS16_Q6_LEV(j, q));
            const __m512i lo = ks16_q6_levels(v, hb, q), hi = ks16_q6_levels(v, hb, q + 2);
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpbusd_epi32(D[t], lo, KR_X4(x[t] + b, 4 * j + q));
                D[t] = _mm512_dpbusd_epi32(D[t], hi, KR_X4(x[t] + b, 4 * j + q + 2));
            }
        }
    } else if (iq4) {   /* the table's levels + 128 for Q4_K's nibbles */
        for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(sb + KS16_IQ4_LEV(j, q));
            const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, n4));
            const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), n4));
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpbusd_epi32(D[t], lo, KR_X4(x[t] + b, 8 * j + q));
                D[t] = _mm512_dpbusd_epi32(D[t], hi, KR_X4(x[t] + b, 8 * j + q + 4));
            }
        }
    } else if (five) {   /* Q4_K's levels, 16 added where the fifth bit is set (a byte mask: no shift) */
        const __m512i hb = _mm512_loadu_si512(sb + KS16_Q5_HB(j));
        for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(sb + KS16_Q5_LEV(j, q));
            const __mmask64 flo = _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char) (1 << q)));
            const __mmask64 fhi = _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char) (1 << (q + 4))));
            const __m512i lo4 = _mm512_and_si512(v, n4), hi4 = _mm512_and_si512(_mm512_srli_epi16(v, 4), n4);
            const __m512i lo = _mm512_mask_add_epi8(lo4, flo, lo4, b4);
            const __m512i hi = _mm512_mask_add_epi8(hi4, fhi, hi4, b4);
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpbusd_epi32(D[t], lo, KR_X4(x[t] + b, 8 * j + q));
                D[t] = _mm512_dpbusd_epi32(D[t], hi, KR_X4(x[t] + b, 8 * j + q + 4));
            }
        }
    } else {
        for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_loadu_si512(sb + KS16_LEV + 64 * (4 * j + q));
            const __m512i lo = _mm512_and_si512(v, n4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), n4);
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpbusd_epi32(D[t], lo, KR_X4(x[t] + b, 8 * j + q));
                D[t] = _mm512_dpbusd_epi32(D[t], hi, KR_X4(x[t] + b, 8 * j + q + 4));
            }
        }
    }
    /* Q6_K: signed byte j % 4 of word j / 4 */
    const __m512i sc = six   ? _mm512_srai_epi32(_mm512_slli_epi32(u[j / 4], 24 - 8 * (j % 4)), 24)
                       : iq4 ? iq4_scale(u[0], u[1], j)
                             : ks16_field(u, j, 0);
    for (int t = 0; t < nt; t++) {
        S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(D[t], sc));
    }
}

/* nt tokens (x[t]: their Q8_K rows) against one tile of Q4_K, Q6_K, Q5_K or IQ4_XS (kind KS16_*):
 * out[t][row], rows_tokens_kq's integers and float steps. */
RM_INLINE void ks16_tokens(int64_t nsb, const uint8_t * tile, const rm_block_q8_K * const x[KR_TOKENS], const int nt,
                           float out[KR_TOKENS][RM_TILE_ROWS], const int kind) {
    const int six = kind == KS16_Q6, five = kind == KS16_Q5, iq4 = kind == KS16_IQ4;
    const size_t tb = RM_TILE_ROWS * (six    ? sizeof(rm_block_q6_K)
                                      : five ? sizeof(rm_block_q5_K)
                                      : iq4  ? sizeof(rm_block_iq4_xs)
                                             : sizeof(rm_block_q4_K));
    __m512 acc[KR_TOKENS][8];   /* [token][super-block mod 8]: 16 rows */
    for (int t = 0; t < nt; t++) {
        for (int l = 0; l < 8; l++) {
            acc[t][l] = _mm512_setzero_ps();
        }
    }
    const __m512i table = iq4 ? _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *) rm_iq4nl_values),
                                                                     _mm_set1_epi8((char) 0x80)))
                              : _mm512_setzero_si512();   /* IQ4_XS's levels + 128 */
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t * sb = tile + (uint64_t) b * tb;
        /* u0, u1, u2; the scales' words (Q6_K); dh and sl (IQ4_XS) */
        const uint8_t * hdr = sb + (six ? KS16_Q6_SC : KS16_U);
        const __m512i u[4] = {_mm512_loadu_si512(hdr), _mm512_loadu_si512(hdr + 64),
                              iq4 ? _mm512_setzero_si512() : _mm512_loadu_si512(hdr + 128),
                              six ? _mm512_loadu_si512(hdr + 192) : _mm512_setzero_si512()};
        __m512i S[KR_TOKENS], D[KR_TOKENS];
        for (int t = 0; t < nt; t++) {
            S[t] = _mm512_setzero_si512();
        }
        const int nj = six ? 16 : 8;   /* sub-blocks: of 16 elements (Q6_K), of 32 (Q4_K) */
        /* Unrolled whole, the tokens' sums spilled: from three tokens on, Q6_K's sixteen sub-blocks
         * go eight at a time and the others' eight two at a time (32 tokens, ps a weight: Q6_K 8.7 ->
         * 8.0, Q4_K 6.6 -> 6.3, Q5_K 7.8 -> 7.5, IQ4_XS 6.9 -> 6.6). One or two tokens (decode) keep
         * them whole: Q6_K's decode ran 11% slower in halves. */
        if (six && nt > 2) {
#pragma GCC unroll 8
            for (int j = 0; j < nj; j++) {
                ks16_sub(j, sb, b, u, table, x, nt, S, kind);
            }
        } else if (nt > 2) {
#pragma GCC unroll 2
            for (int j = 0; j < nj; j++) {
                ks16_sub(j, sb, b, u, table, x, nt, S, kind);
            }
        } else {
#pragma GCC unroll 16
            for (int j = 0; j < nj; j++) {
                ks16_sub(j, sb, b, u, table, x, nt, S, kind);
            }
        }
        for (int t = 0; t < nt; t++) {   /* the bsums' weights (the mins, or the scales) against the bsums, pair by pair */
            D[t] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 8; p++) {
            __m512i bw;
            if (six) {   /* (sc 2p, sc 2p + 1) */
                const __m512i w = u[p / 2];
                bw = _mm512_or_si512(_mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 16 * (p % 2)), 24),
                                                      _mm512_set1_epi32(0xffff)),
                                     _mm512_slli_epi32(_mm512_srai_epi32(_mm512_slli_epi32(w, 16 - 16 * (p % 2)), 24), 16));
            } else if (iq4) {   /* (sc p, sc p) */
                const __m512i sc = iq4_scale(u[0], u[1], p);
                bw = _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(sc, 16));
            } else {   /* (min p, min p) */
                const __m512i mn = ks16_field(u, p, 1);
                bw = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));
            }
            for (int t = 0; t < nt; t++) {
                D[t] = _mm512_dpwssd_epi32(D[t], bw, _mm512_set1_epi32(*(const int32_t *) (x[t][b].bsums + 2 * p)));
            }
        }
        const __m512 dw = iq4 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(u[0]))
                              : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (sb + (six ? KS16_Q6_D : five ? KS16_Q5_D : KS16_D))));
        const __m512 dm = six || iq4 ? dw : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (sb + (five ? KS16_Q5_DMIN : KS16_DMIN))));
        const int l = (int) (b % 8);
        for (int t = 0; t < nt; t++) {
            const __m512 dx = _mm512_set1_ps(x[t][b].d);
            if (six || iq4) {   /* the offset 32 (128): S - 32 (128) sum(sc bsums) */
                const __m512i sv = _mm512_sub_epi32(S[t], _mm512_slli_epi32(D[t], iq4 ? 7 : 5));
                acc[t][l] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(sv), acc[t][l]);
            } else {
                acc[t][l] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(S[t]), acc[t][l]);
                acc[t][l] = _mm512_fnmadd_ps(_mm512_mul_ps(dx, dm), _mm512_cvtepi32_ps(D[t]), acc[t][l]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm512_storeu_ps(out[t], sum8_ps512(acc[t]));
    }
}

/* nc tokens (1 to KR_TOKENS; their Q8_K rows xt_stride bytes apart) against one tile:
 * out[c][row] (rm_packed_kernels.dot_tile). */
RM_INLINE void ks16_dot(int64_t n, int nc, float out[][RM_TILE_ROWS], const void * tile, const void * x_t,
                        uint64_t xt_stride, const int kind) {
    const rm_block_q8_K * x[KR_TOKENS];
    for (int t = 0; t < KR_TOKENS; t++) {
        x[t] = (const rm_block_q8_K *) ((const uint8_t *) x_t + (uint64_t) (t < nc ? t : 0) * xt_stride);
    }
    const int64_t nsb = n / RM_QK_K;
    switch (nc) {   /* a copy per count, the token loops unrolled */
    case 8: ks16_tokens(nsb, tile, x, 8, out, kind); break;
    case 7: ks16_tokens(nsb, tile, x, 7, out, kind); break;
    case 6: ks16_tokens(nsb, tile, x, 6, out, kind); break;
    case 5: ks16_tokens(nsb, tile, x, 5, out, kind); break;
    case 4: ks16_tokens(nsb, tile, x, 4, out, kind); break;
    case 3: ks16_tokens(nsb, tile, x, 3, out, kind); break;
    case 2: ks16_tokens(nsb, tile, x, 2, out, kind); break;
    default: ks16_tokens(nsb, tile, x, 1, out, kind); break;
    }
}

/* The tile form on a stored matrix: rows r0..r1 (within one tile or across two, when a caller's
 * chunks are not whole tiles) against every token of x_t (Q8_K rows side by side). */
RM_INLINE void ks16_matmul(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                           int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate, const int kind) {
    (void) room;   /* the tiles are read as they are, eight tokens a pass */
    const uint64_t xrow = (uint64_t) (n / RM_QK_K) * sizeof(rm_block_q8_K);
    for (int64_t k0 = r0 / RM_TILE_ROWS * RM_TILE_ROWS; k0 < r1; k0 += RM_TILE_ROWS) {
        const int64_t a = r0 > k0 ? r0 : k0, e = r1 < k0 + RM_TILE_ROWS ? r1 : k0 + RM_TILE_ROWS;
        const __mmask16 rows = (__mmask16) (((1u << (e - k0)) - 1) & ~((1u << (a - k0)) - 1));
        for (int32_t i0 = 0; i0 < n_tok; i0 += KR_TOKENS) {
            const int nt = n_tok - i0 < KR_TOKENS ? n_tok - i0 : KR_TOKENS;
            float out[KR_TOKENS][RM_TILE_ROWS];
            ks16_dot(n, nt, out, (const uint8_t *) w + (uint64_t) k0 * row_bytes, (const uint8_t *) x_t + (uint64_t) i0 * xrow,
                     xrow, kind);
            for (int t = 0; t < nt; t++) {
                float * yt = y + (int64_t) (i0 + t) * y_stride + k0;
                __m512 v = _mm512_loadu_ps(out[t]);
                if (accumulate) {
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, yt), v);
                }
                _mm512_mask_storeu_ps(yt, rows, v);
            }
        }
    }
}

#define RM_KS16_KERNELS(t, kind)                                                                                     \
    static void ks16_dot_##t(int64_t n, int nc, float out[][RM_TILE_ROWS], const void * tile, const void * x_t,      \
                             uint64_t xt_stride) {                                                                   \
        ks16_dot(n, nc, out, tile, x_t, xt_stride, kind);                                                            \
    }                                                                                                                \
    static void ks16_matmul_##t(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1,               \
                                const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride,           \
                                int accumulate) {                                                                    \
        ks16_matmul(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, kind);                       \
    }

RM_KS16_KERNELS(q4_K, KS16_Q4)
RM_KS16_KERNELS(q6_K, KS16_Q6)
RM_KS16_KERNELS(q5_K, KS16_Q5)
RM_KS16_KERNELS(iq4_xs, KS16_IQ4)

#else   /* the AVX2 set */

/* Q4_K, Q5_K and Q6_K packed straight from the stored blocks, as in the AVX-512 set, eight rows
 * (half h of the tile) at a time: the room's bytes are the unpacking packer's. */

/* t[j] lane r := dword j of the 32 bytes at src[r] + o. */
RM_INLINE void side8x8(const uint8_t * const src[8], size_t o, __m256i t[8]) {
    for (int r = 0; r < 8; r++) {
        t[r] = _mm256_loadu_si256((const __m256i *) (src[r] + o));
    }
    transpose8_epi32(t);
}

/* w[i] lane r := dword i of the 16 bytes at src[r] + o. */
RM_INLINE void side8x4(const uint8_t * const src[8], size_t o, __m256i w[4]) {
    __m256i a[4];   /* rows 2k (low half) and 2k + 1 (high half) */
    for (int k = 0; k < 4; k++) {
        a[k] = _mm256_set_m128i(_mm_loadu_si128((const __m128i *) (src[2 * k + 1] + o)),
                                _mm_loadu_si128((const __m128i *) (src[2 * k] + o)));
    }
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   /* lanes hold rows 0 2 4 6 1 3 5 7 */
    w[0] = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(t0, t2), order);
    w[1] = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(t0, t2), order);
    w[2] = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi64(t1, t3), order);
    w[3] = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi64(t1, t3), order);
}

/* The lanes' fp16 values (the low halves of v) as floats. */
RM_INLINE __m256 side8_fp16(__m256i v) {
    v = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

RM_INLINE void tpack_k4(const uint8_t * const src16[RM_TILE_ROWS], uint8_t * wb, const int five) {
    const __m256i m6 = _mm256_set1_epi32(0x3f), m4 = _mm256_set1_epi32(0x0f), m2 = _mm256_set1_epi32(0x30);
    const __m256i n4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int h = 0; h < 2; h++) {
        const uint8_t * const * src = src16 + 8 * h;
        __m256i w[4];
        side8x4(src, 0, w);   /* d | dmin << 16, then the 12 scale bytes as u0, u1, u2 */
        _mm256_storeu_ps((float *) (wb + KR_D + 32 * h), side8_fp16(w[0]));
        _mm256_storeu_ps((float *) (wb + KR_D + 64 + 32 * h), side8_fp16(_mm256_srli_epi32(w[0], 16)));
        for (int k = 0; k < 8; k++) {
            __m256i sc, mn;
            if (k < 4) {
                sc = _mm256_and_si256(_mm256_srli_epi32(w[1], 8 * k), m6);
                mn = _mm256_and_si256(_mm256_srli_epi32(w[2], 8 * k), m6);
            } else {
                const int c = 8 * (k - 4);
                sc = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[3], c), m4),
                                     _mm256_and_si256(_mm256_srli_epi32(w[1], c + 2), m2));
                mn = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[3], c + 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi32(w[2], c + 2), m2));
            }
            const __m256i pair = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));   /* (sc, sc) for vpmaddwd */
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * k) + 32 * h), pair);
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * k + 1) + 32 * h), pair);
            _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * k + 32 * h), _mm256_or_si256(mn, _mm256_slli_epi32(mn, 16)));
        }
        __m256i qh[8];
        if (five) {
            side8x8(src, offsetof(rm_block_q5_K, qh), qh);
        }
        for (int p = 0; p < 4; p++) {   /* qs bytes 32p + l, l = 4j */
            __m256i t[8];
            side8x8(src, (five ? offsetof(rm_block_q5_K, qs) : offsetof(rm_block_q4_K, qs)) + 32 * p, t);
            for (int j = 0; j < 8; j++) {
                __m256i lo = _mm256_and_si256(t[j], n4), hi = _mm256_and_si256(_mm256_srli_epi16(t[j], 4), n4);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_and_si256(bit_to4_256(qh[j], 2 * p), b4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(bit_to4_256(qh[j], 2 * p + 1), b4));
                }
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (16 * p + j) + 32 * h), lo);
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (16 * p + 8 + j) + 32 * h), hi);
            }
        }
    }
}

static void tpack_q4_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_k4(src, wb, 0); }
static void tpack_q5_K(const uint8_t * const src[RM_TILE_ROWS], uint8_t * wb) { tpack_k4(src, wb, 1); }

/* Q6_K: levels + 32 from ql's nibbles and qh's 2-bit fields, the sixteen signed scales as (sc, sc)
 * pairs, the bsums' weights (sc 2p, sc 2p + 1), d. */
static void tpack_q6_K(const uint8_t * const src16[RM_TILE_ROWS], uint8_t * wb) {
    const __m256i n4 = _mm256_set1_epi8(0x0f), m2h = _mm256_set1_epi8(0x30), lo16 = _mm256_set1_epi32(0xffff);
    for (int rh = 0; rh < 2; rh++) {   /* rows 8 rh .. 8 rh + 7 */
        const uint8_t * const * src = src16 + 8 * rh;
        __m256i w[4], sc[16];
        side8x4(src, offsetof(rm_block_q6_K, scales), w);
        uint16_t d16[8];
        for (int r = 0; r < 8; r++) {
            memcpy(&d16[r], src[r] + offsetof(rm_block_q6_K, d), 2);
        }
        _mm256_storeu_ps((float *) (wb + KR_D + 32 * rh), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) d16)));
        _mm256_storeu_ps((float *) (wb + KR_D + 64 + 32 * rh), _mm256_setzero_ps());
        for (int j = 0; j < 16; j++) {
            sc[j] = _mm256_srai_epi32(_mm256_slli_epi32(w[j / 4], 24 - 8 * (j % 4)), 24);
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * j + 32 * rh),
                                _mm256_or_si256(_mm256_and_si256(sc[j], lo16), _mm256_slli_epi32(sc[j], 16)));
        }
        for (int p = 0; p < 8; p++) {
            _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * p + 32 * rh),
                                _mm256_or_si256(_mm256_and_si256(sc[2 * p], lo16), _mm256_slli_epi32(sc[2 * p + 1], 16)));
        }
        for (int h = 0; h < 2; h++) {
            __m256i qh[8];
            side8x8(src, offsetof(rm_block_q6_K, qh) + 32 * h, qh);   /* qh bytes 32h + l */
            for (int g = 0; g < 2; g++) {
                __m256i t[8];
                side8x8(src, offsetof(rm_block_q6_K, ql) + 64 * h + 32 * g, t);   /* ql bytes 64h + 32g + l */
                for (int l4 = 0; l4 < 8; l4++) {
                    const __m256i q = qh[l4];
                    const __m256i lo = _mm256_or_si256(_mm256_and_si256(t[l4], n4),
                                                       _mm256_and_si256(g ? _mm256_slli_epi16(q, 2) : _mm256_slli_epi16(q, 4), m2h));
                    const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(t[l4], 4), n4),
                                                       _mm256_and_si256(g ? _mm256_srli_epi16(q, 2) : q, m2h));
                    _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * (4 * h + g) + l4) + 32 * rh), lo);
                    _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * (4 * h + 2 + g) + l4) + 32 * rh), hi);
                }
            }
        }
    }
}

/* IQ4_XS: the table's levels signed (levels past 31 would overflow vpmaddubsw's int16 pairs with
 * an offset: the kernel takes the sign trick), the nibbles of qs bytes 16j + l as elements 32j + l
 * and 32j + 16 + l, the eight 6-bit scales less 32 as (sc, sc) pairs in both 16-element places, d.
 * No offset: the bsums' weights stay unused. */
static void tpack_iq4_xs(const uint8_t * const src16[RM_TILE_ROWS], uint8_t * wb) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) rm_iq4nl_values));
    const __m256i n4 = _mm256_set1_epi8(0x0f), lo16 = _mm256_set1_epi32(0xffff);
    for (int rh = 0; rh < 2; rh++) {   /* rows 8 rh .. 8 rh + 7 */
        const uint8_t * const * src = src16 + 8 * rh;
        __m256i w[4];
        side8x4(src, 0, w);   /* d | scales_h << 16, scales_l */
        _mm256_storeu_ps((float *) (wb + KR_D + 32 * rh), side8_fp16(w[0]));
        _mm256_storeu_ps((float *) (wb + KR_D + 64 + 32 * rh), _mm256_setzero_ps());
        for (int k = 0; k < 8; k++) {
            const __m256i sc = _mm256_sub_epi32(
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[1], 4 * k), _mm256_set1_epi32(0x0f)),
                                _mm256_and_si256(_mm256_srli_epi32(w[0], 16 + 2 * k - 4), _mm256_set1_epi32(0x30))),
                _mm256_set1_epi32(32));
            const __m256i pair = _mm256_or_si256(_mm256_and_si256(sc, lo16), _mm256_slli_epi32(sc, 16));
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * k) + 32 * rh), pair);
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * k + 1) + 32 * rh), pair);
        }
        for (int p = 0; p < 4; p++) {
            __m256i t[8];
            side8x8(src, offsetof(rm_block_iq4_xs, qs) + 32 * p, t);   /* qs bytes 32p + 4j.. */
            for (int j = 0; j < 8; j++) {   /* sub-block 2p + j / 4, l = 4 (j % 4) */
                const int sb = 2 * p + j / 4, l4 = j % 4;
                const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(t[j], n4));
                const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(t[j], 4), n4));
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * sb + l4) + 32 * rh), lo);
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * sb + 4 + l4) + 32 * rh), hi);
            }
        }
    }
}

#define KQ_TPACK_q2_K NULL
#define KQ_TPACK_q3_K NULL
#define KQ_TPACK_q4_K tpack_q4_K
#define KQ_TPACK_q5_K tpack_q5_K
#define KQ_TPACK_q6_K tpack_q6_K
#define KQ_TPACK_iq4_xs tpack_iq4_xs
#define KQ_UNPACK_q2_K unpack_q2_K   /* unpacked row by row, then transposed */
#define KQ_UNPACK_q3_K unpack_q3_K
#define KQ_UNPACK_q4_K NULL
#define KQ_UNPACK_q5_K NULL
#define KQ_UNPACK_q6_K NULL
#define KQ_UNPACK_iq4_xs NULL

/* Rows r0..r1 (at most RM_TILE_ROWS) of w into the room: each super-block of the rows unpacked,
 * eight rows at a time, then turned on their side by dword transposes. */
RM_INLINE void pack_rows_kq(int64_t n, const uint8_t * w, uint64_t row_bytes, int64_t r0, int64_t r1, uint8_t * room,
                            kq_unpack_fn unpack, kq_tpack_fn tpack, const size_t bsize, const int mins) {
    const int64_t nsb = n / RM_QK_K;
    if (tpack) {
        pack_rows_stored(nsb, w, row_bytes, r0, r1, room, tpack, bsize);
        return;
    }
    for (int64_t b = 0; b < nsb; b++) {
        uint8_t * wb = room + (uint64_t) b * KR_BYTES;
        float * d = (float *) (wb + KR_D);
        for (int h = 0; h < 2; h++) {
            kq_unpacked u[8];
            for (int r = 0; r < 8; r++) {
                const int64_t row = r0 + 8 * h + r;
                if (row >= r1) {
                    memset(&u[r], 0, sizeof(u[r]));
                    d[8 * h + r] = d[RM_TILE_ROWS + 8 * h + r] = 0.0f;
                    continue;
                }
                const uint8_t * src = w + (uint64_t) row * row_bytes;
                if (b + 1 < nsb) {   /* sixteen streams: more than the prefetchers follow */
                    for (size_t o = 0; o < bsize; o += 64) {
                        __builtin_prefetch(src + (uint64_t) (b + 1) * bsize + o, 0, 3);
                    }
                }
                unpack(src, b, &u[r]);
                d[8 * h + r] = u[r].d;
                d[RM_TILE_ROWS + 8 * h + r] = mins ? u[r].dmin : 0.0f;
            }
            __m256i t[8], lo[8], hi[8];
            for (int k = 0; k < 8; k++) {   /* dword j of chunk k: elements 32 k + 4 j.., group 8 k + j */
                for (int r = 0; r < 8; r++) {
                    t[r] = u[r].q[k];
                }
                transpose8_epi32(t);
                for (int j = 0; j < 8; j++) {
                    _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * k + j) + 32 * h), t[j]);
                }
            }
            for (int r = 0; r < 8; r++) {   /* sub-block j's scale as the pair (sc, sc) */
                const __m128i s16lo = _mm_cvtepi8_epi16(u[r].sc16), s16hi = _mm_cvtepi8_epi16(_mm_srli_si128(u[r].sc16, 8));
                lo[r] = _mm256_set_m128i(_mm_unpackhi_epi16(s16lo, s16lo), _mm_unpacklo_epi16(s16lo, s16lo));
                hi[r] = _mm256_set_m128i(_mm_unpackhi_epi16(s16hi, s16hi), _mm_unpacklo_epi16(s16hi, s16hi));
                t[r] = u[r].bw;
            }
            transpose8_epi32(lo);
            transpose8_epi32(hi);
            transpose8_epi32(t);
            for (int j = 0; j < 8; j++) {
                _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * j + 32 * h), lo[j]);
                _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (8 + j) + 32 * h), hi[j]);
                _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * j + 32 * h), t[j]);
            }
        }
    }
}

/* acc + the products of u8's unsigned bytes and s8's signed ones, four to an int32 lane: vpdpbusd
 * in its VEX form (AVX-VNNI), which this file's flags do not name, so the compiler never emits it
 * where rm_cpu_avx_vnni() has not said yes. */
RM_INLINE __m256i dpbusd_vex(__m256i acc, __m256i u8, __m256i s8) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u8), "x"(s8));
    return acc;
}

/* nt tokens (1 to KR_TOKENS_AVX2; x[t] their Q8_K rows) against half h (rows 8h..8h + 7) of the
 * packed tile: out[t][8h + row]. With vnni, a sub-block's products go into int32 lanes four at a
 * time (vpdpbusd) and are scaled by one vpmulld, as in the AVX-512 set; without, run groups of
 * four products are summed in int16 pairs (vpmaddubsw; their sums stay within int16: 4 groups for
 * levels up to 31, 2 for Q6_K's up to 63) before one vpmaddwd by the scales' pairs. sgn: signed
 * levels, each group's products taken on their magnitudes with the activations' signs moved onto
 * them (into int32 lanes with vnni, else int16 pairs each scaled at once). sixteen, off_mul: as
 * in the AVX-512 set. */
#define KR_TOKENS_AVX2 4
RM_INLINE void rows_tokens_kq(int64_t nsb, const uint8_t * room, const rm_block_q8_K * const x[KR_TOKENS_AVX2],
                              const int nt, const int h, float out[KR_TOKENS_AVX2][RM_TILE_ROWS], const int run,
                              const int sixteen, const int off_mul, const int vnni, const int sgn) {
    __m256 acc[KR_TOKENS_AVX2][8];   /* [token][super-block mod 8]: 8 rows; kept in L1 */
    for (int t = 0; t < nt; t++) {
        for (int l = 0; l < 8; l++) {
            acc[t][l] = _mm256_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t * wb = room + (uint64_t) b * KR_BYTES + 32 * h;
        __m256i S[KR_TOKENS_AVX2], P[KR_TOKENS_AVX2];
        for (int t = 0; t < nt; t++) {
            S[t] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 16; j += 2 - sixteen) {   /* sub-blocks of 16 (or 32) elements */
            const __m256i sc = _mm256_loadu_si256((const __m256i *) (wb + KR_SC + 64 * j));
            if (sgn) {   /* signed levels: their magnitudes against the activations with their signs */
                for (int t = 0; t < nt; t++) {
                    P[t] = _mm256_setzero_si256();
                }
#pragma GCC unroll 8
                for (int e = 4 * j; e < 4 * j + 8; e++) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + KR_LEV + 64 * e));
                    const __m256i alv = _mm256_sign_epi8(lv, lv);
                    for (int t = 0; t < nt; t++) {
                        const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(*(const int32_t *) (x[t][b].qs + 4 * e)), lv);
                        if (vnni) {   /* into int32 lanes, scaled once below */
                            P[t] = dpbusd_vex(P[t], alv, sx);
                        } else {      /* each group's pairs (at most 2 x 127 x 127) times the scales at once */
                            S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(_mm256_maddubs_epi16(alv, sx), sc));
                        }
                    }
                }
                const __m256i sc32 = _mm256_srai_epi32(_mm256_slli_epi32(sc, 16), 16);   /* one of the pair */
                for (int t = 0; t < nt && vnni; t++) {
                    S[t] = _mm256_add_epi32(S[t], _mm256_mullo_epi32(P[t], sc32));
                }
                continue;
            }
            if (vnni) {
                for (int t = 0; t < nt; t++) {
                    P[t] = _mm256_setzero_si256();
                }
#pragma GCC unroll 8
                for (int e = 4 * j; e < 4 * j + 8 - 4 * sixteen; e++) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + KR_LEV + 64 * e));
                    for (int t = 0; t < nt; t++) {
                        P[t] = dpbusd_vex(P[t], lv, _mm256_set1_epi32(*(const int32_t *) (x[t][b].qs + 4 * e)));
                    }
                }
                const __m256i sc32 = _mm256_srai_epi32(_mm256_slli_epi32(sc, 16), 16);   /* one of the pair */
                for (int t = 0; t < nt; t++) {
                    S[t] = _mm256_add_epi32(S[t], _mm256_mullo_epi32(P[t], sc32));
                }
                continue;
            }
#pragma GCC unroll 2
            for (int e0 = 4 * j; e0 < 4 * j + 8 - 4 * sixteen; e0 += run) {
#pragma GCC unroll 2
                for (int e = e0; e < e0 + run; e++) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + KR_LEV + 64 * e));
                    for (int t = 0; t < nt; t++) {
                        const __m256i p = _mm256_maddubs_epi16(lv, _mm256_set1_epi32(*(const int32_t *) (x[t][b].qs + 4 * e)));
                        P[t] = e == e0 ? p : _mm256_add_epi16(P[t], p);
                    }
                }
                for (int t = 0; t < nt; t++) {
                    S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(P[t], sc));
                }
            }
        }
        for (int t = 0; t < nt; t++) {   /* sum_j bw_j bsums_j, pair by pair */
            P[t] = _mm256_setzero_si256();
        }
        for (int p = 0; p < 8 * !sgn; p++) {
            const __m256i bw = _mm256_loadu_si256((const __m256i *) (wb + KR_BW + 64 * p));
            for (int t = 0; t < nt; t++) {
                P[t] = _mm256_add_epi32(P[t], _mm256_madd_epi16(bw, _mm256_set1_epi32(*(const int32_t *) (x[t][b].bsums + 2 * p))));
            }
        }
        const __m256 dw = _mm256_loadu_ps((const float *) (wb + KR_D)), dm = _mm256_loadu_ps((const float *) (wb + KR_D + 64));
        const int l = (int) (b % 8);
        for (int t = 0; t < nt; t++) {
            const __m256 dx = _mm256_set1_ps(x[t][b].d);
            if (sgn) {
                acc[t][l] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(S[t]), acc[t][l]);
            } else if (off_mul) {   /* times 4 or 32: a shift, as the one-token kernels take it */
                const __m256i sv = _mm256_sub_epi32(S[t], _mm256_slli_epi32(P[t], off_mul == 4 ? 2 : 5));
                acc[t][l] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(sv), acc[t][l]);
            } else {
                acc[t][l] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(S[t]), acc[t][l]);
                acc[t][l] = _mm256_fnmadd_ps(_mm256_mul_ps(dx, dm), _mm256_cvtepi32_ps(P[t]), acc[t][l]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm256_storeu_ps(out[t] + 8 * h, sum8_ps256(acc[t]));
    }
}

/* Every token of x_t against the packed room of rows k0..k0 + 15 (a..e of them stored to y). */
RM_INLINE void rows_kq_room(int64_t nsb, const void * room, const void * x_t, int32_t n_tok, int64_t k0, int64_t a, int64_t e,
                            float * y, int64_t y_stride, int accumulate, const int sixteen, const int off_mul) {
    const uint64_t xrow = (uint64_t) nsb * sizeof(rm_block_q8_K);
    const int run = off_mul == 32 ? 2 : 4;   /* Q6_K's levels reach 63 */
    /* vpdpbusd where there is one, for the 32-element sub-blocks: one thread, rows of 2048, 32
     * tokens, ps per weight and token with and without (RAPIDMOE_AVX_VNNI=0): Q4_K 12.1 / 14.3,
     * Q5_K 12.0 / 14.0; for the 16-element ones a vpmulld per 16 products costs what it saves:
     * Q2_K 13.7-14.3 / 14.8-15.0, Q3_K 13.7 / 13.7-14.0, Q6_K 13.5 / 12.9-13.1 */
    /* IQ4_XS, IQ2_XXS and IQ3_XXS (offset 128): their levels packed signed by their tpack, the sign
     * trick, with vpdpbusd where there is one (one thread, rows of 2048, 32 tokens, ps per weight
     * and token with and without: IQ4_XS 14.6 / 18.5, IQ2_XXS 16.8 / 20.7, IQ3_XXS 18.1 / 21.9) */
    const int sgn = off_mul == 128;
    const int vnni = !sixteen && rm_cpu_avx_vnni();
    for (int32_t i0 = 0; i0 < n_tok; i0 += KR_TOKENS_AVX2) {
        const int nt = n_tok - i0 < KR_TOKENS_AVX2 ? n_tok - i0 : KR_TOKENS_AVX2;
        const rm_block_q8_K * x[KR_TOKENS_AVX2];
        for (int t = 0; t < KR_TOKENS_AVX2; t++) {
            x[t] = (const rm_block_q8_K *) ((const uint8_t *) x_t + (uint64_t) (i0 + (t < nt ? t : 0)) * xrow);
        }
        float out[KR_TOKENS_AVX2][RM_TILE_ROWS];
        for (int h = 0; h < (e - k0 > 8 ? 2 : 1); h++) {
            switch (nt + 4 * vnni + 8 * sgn) {   /* a copy per count and form, the token loops unrolled */
            case 16: rows_tokens_kq(nsb, room, x, 4, h, out, run, 0, off_mul, 1, 1); break;
            case 15: rows_tokens_kq(nsb, room, x, 3, h, out, run, 0, off_mul, 1, 1); break;
            case 14: rows_tokens_kq(nsb, room, x, 2, h, out, run, 0, off_mul, 1, 1); break;
            case 13: rows_tokens_kq(nsb, room, x, 1, h, out, run, 0, off_mul, 1, 1); break;
            case 12: rows_tokens_kq(nsb, room, x, 4, h, out, run, 0, off_mul, 0, 1); break;
            case 11: rows_tokens_kq(nsb, room, x, 3, h, out, run, 0, off_mul, 0, 1); break;
            case 10: rows_tokens_kq(nsb, room, x, 2, h, out, run, 0, off_mul, 0, 1); break;
            case 9: rows_tokens_kq(nsb, room, x, 1, h, out, run, 0, off_mul, 0, 1); break;
            case 8: rows_tokens_kq(nsb, room, x, 4, h, out, run, sixteen, off_mul, 1, 0); break;
            case 7: rows_tokens_kq(nsb, room, x, 3, h, out, run, sixteen, off_mul, 1, 0); break;
            case 6: rows_tokens_kq(nsb, room, x, 2, h, out, run, sixteen, off_mul, 1, 0); break;
            case 5: rows_tokens_kq(nsb, room, x, 1, h, out, run, sixteen, off_mul, 1, 0); break;
            case 4: rows_tokens_kq(nsb, room, x, 4, h, out, run, sixteen, off_mul, 0, 0); break;
            case 3: rows_tokens_kq(nsb, room, x, 3, h, out, run, sixteen, off_mul, 0, 0); break;
            case 2: rows_tokens_kq(nsb, room, x, 2, h, out, run, sixteen, off_mul, 0, 0); break;
            default: rows_tokens_kq(nsb, room, x, 1, h, out, run, sixteen, off_mul, 0, 0); break;
            }
        }
        for (int t = 0; t < nt; t++) {
            float * yt = y + (int64_t) (i0 + t) * y_stride;
            for (int64_t r = a; r < e; r++) {
                yt[r] = accumulate ? yt[r] + out[t][r - k0] : out[t][r - k0];
            }
        }
    }
}


RM_INLINE void matmul_rows_kq(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                              int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate,
                              kq_unpack_fn unpack, kq_tpack_fn tpack, const size_t bsize, const int sixteen,
                              const int off_mul) {
    pack_rows_kq(n, w, row_bytes, r0, r1, room, unpack, tpack, bsize, off_mul == 0);
    rows_kq_room(n / RM_QK_K, room, x_t, n_tok, r0, r0, r1, y, y_stride, accumulate, sixteen, off_mul);
}

/* How the AVX2 set takes a 32-element block's products: int16 runs of vpmaddubsw (levels up to 31),
 * vpdpbusd (AVX-VNNI), or the sign trick on signed levels (Q8_0 and IQ4_NL without AVX-VNNI). */
enum { R32_RUNS, R32_VNNI, R32_SIGN };

/* The eight int32 lanes of u . s (u unsigned bytes, s signed; four products a lane). */
RM_INLINE __m256i dot4_u8s8(__m256i u, __m256i s, const int vnni) {
    return vnni ? dpbusd_vex(_mm256_setzero_si256(), u, s) : _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* The eight int32 lanes of lv . bx for signed levels lv (|lv| = alv) and signed activations bx: the
 * magnitudes times bx with lv's signs, in int16 pairs (at most 2 x 128 x 127: no saturation), then
 * added into int32 lanes. Levels of Q8_0 and IQ4_NL reach 127, so two pairs would not fit in int16. */
RM_INLINE __m256i dot4_sign(__m256i lv, __m256i alv, __m256i bx) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(alv, _mm256_sign_epi8(bx, lv)), _mm256_set1_epi16(1));
}

/* nt tokens (1 to KR_TOKENS_AVX2) against half h of the packed tile of nb blocks: out[t][8h + row]. */
RM_INLINE void rows_tokens_32(int64_t nb, const uint8_t * room, const uint8_t * const x[KR_TOKENS_AVX2], const int nt,
                              const int h, float out[KR_TOKENS_AVX2][RM_TILE_ROWS], const int kind, const int mode) {
    __m256 acc[KR_TOKENS_AVX2][8];   /* [token][block mod 8]: 8 rows */
    for (int t = 0; t < nt; t++) {
        for (int l = 0; l < 8; l++) {
            acc[t][l] = _mm256_setzero_ps();
        }
    }
    for (int64_t g = 0; g < nb / 8; g++) {
        const uint8_t * wb = room + (uint64_t) g * B32R_BYTES + 32 * h;
        for (int k = 0; k < 8; k++) {
            __m256i S[KR_TOKENS_AVX2], P[KR_TOKENS_AVX2];
            const uint8_t * xb[KR_TOKENS_AVX2];
            for (int t = 0; t < nt; t++) {
                xb[t] = x[t] + (uint64_t) (8 * g + k) * B32R_ACT;
                S[t] = _mm256_setzero_si256();
            }
            if (mode == R32_VNNI) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + 64 * (8 * k + j)));
                    for (int t = 0; t < nt; t++) {
                        S[t] = dpbusd_vex(S[t], lv, _mm256_set1_epi32(*(const int32_t *) (xb[t] + 4 * j)));
                    }
                }
            } else if (mode == R32_SIGN) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + 64 * (8 * k + j)));
                    const __m256i alv = _mm256_sign_epi8(lv, lv);
                    for (int t = 0; t < nt; t++) {
                        S[t] = _mm256_add_epi32(S[t], dot4_sign(lv, alv, _mm256_set1_epi32(*(const int32_t *) (xb[t] + 4 * j))));
                    }
                }
            } else {   /* levels up to 31: four groups' pairs in int16 (at most 8 x 31 x 128), then int32 lanes */
#pragma GCC unroll 2
                for (int j0 = 0; j0 < 8; j0 += 4) {
#pragma GCC unroll 2
                    for (int j = j0; j < j0 + 4; j++) {
                        const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + 64 * (8 * k + j)));
                        for (int t = 0; t < nt; t++) {
                            const __m256i p = _mm256_maddubs_epi16(lv, _mm256_set1_epi32(*(const int32_t *) (xb[t] + 4 * j)));
                            P[t] = j == j0 ? p : _mm256_add_epi16(P[t], p);
                        }
                    }
                    for (int t = 0; t < nt; t++) {
                        S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(P[t], _mm256_set1_epi16(1)));
                    }
                }
            }
            const __m256 dw = _mm256_loadu_ps((const float *) (wb + B32R_D + 64 * k));
            for (int t = 0; t < nt; t++) {
                const __m256i sv = mode == R32_SIGN ? S[t] : _mm256_sub_epi32(S[t], _mm256_set1_epi32(r32_act_less(x[t], 8 * g + k, -1, kind)));
                acc[t][k] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(r32_act_d(x[t], 8 * g + k))),
                                            _mm256_cvtepi32_ps(sv), acc[t][k]);
            }
        }
    }
    const uint8_t * wb = room + (uint64_t) (nb / 8) * B32R_BYTES + 32 * h;
    for (int64_t b = nb / 8 * 8; b < nb; b++) {   /* the blocks past the last whole group, one by one */
        const int k = (int) (b % 8);
        const __m256 dw = _mm256_loadu_ps((const float *) (wb + B32R_D + 64 * k));
        for (int j = 0; j < 8; j++) {
            const __m256i lv = _mm256_loadu_si256((const __m256i *) (wb + 64 * (8 * k + j)));
            for (int t = 0; t < nt; t++) {
                const __m256i bx = _mm256_set1_epi32(*(const int32_t *) (x[t] + b * B32R_ACT + 4 * j));
                const __m256i sv = mode == R32_SIGN ? dot4_sign(lv, _mm256_sign_epi8(lv, lv), bx)
                                                    : _mm256_sub_epi32(dot4_u8s8(lv, bx, mode == R32_VNNI),
                                                                       _mm256_set1_epi32(r32_act_less(x[t], b, j, kind)));
                acc[t][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(r32_act_d(x[t], b))), _mm256_cvtepi32_ps(sv),
                                            acc[t][j]);
            }
        }
    }
    for (int t = 0; t < nt; t++) {
        _mm256_storeu_ps(out[t] + 8 * h, sum8_ps256(acc[t]));
    }
}

RM_INLINE void matmul_rows_32(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                              const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate,
                              const int kind) {
    const int64_t nb = n / RM_QK;
    const uint64_t xrow = (uint64_t) nb * B32R_ACT;
    /* the levels past 31 (offset 128: Q8_0, IQ4_NL) without AVX-VNNI take the sign trick */
    const int mode = rm_cpu_avx_vnni() ? R32_VNNI : r32_offset[kind] == 128 ? R32_SIGN : R32_RUNS;
    pack_rows_32(n, w, stored, row_bytes, r0, r1, room, kind, mode == R32_SIGN);   /* stored: Q4_0's and MXFP4's */
    for (int32_t i0 = 0; i0 < n_tok; i0 += KR_TOKENS_AVX2) {
        const int nt = n_tok - i0 < KR_TOKENS_AVX2 ? n_tok - i0 : KR_TOKENS_AVX2;
        const uint8_t * x[KR_TOKENS_AVX2];
        for (int t = 0; t < KR_TOKENS_AVX2; t++) {
            x[t] = (const uint8_t *) x_t + (uint64_t) (i0 + (t < nt ? t : 0)) * xrow;
        }
        float out[KR_TOKENS_AVX2][RM_TILE_ROWS];
        for (int h = 0; h < (r1 - r0 > 8 ? 2 : 1); h++) {
            switch (nt + 4 * mode) {   /* a copy per count and mode, the token loops unrolled */
            case 12: rows_tokens_32(nb, room, x, 4, h, out, kind, R32_SIGN); break;
            case 11: rows_tokens_32(nb, room, x, 3, h, out, kind, R32_SIGN); break;
            case 10: rows_tokens_32(nb, room, x, 2, h, out, kind, R32_SIGN); break;
            case 9: rows_tokens_32(nb, room, x, 1, h, out, kind, R32_SIGN); break;
            case 8: rows_tokens_32(nb, room, x, 4, h, out, kind, R32_VNNI); break;
            case 7: rows_tokens_32(nb, room, x, 3, h, out, kind, R32_VNNI); break;
            case 6: rows_tokens_32(nb, room, x, 2, h, out, kind, R32_VNNI); break;
            case 5: rows_tokens_32(nb, room, x, 1, h, out, kind, R32_VNNI); break;
            case 4: rows_tokens_32(nb, room, x, 4, h, out, kind, R32_RUNS); break;
            case 3: rows_tokens_32(nb, room, x, 3, h, out, kind, R32_RUNS); break;
            case 2: rows_tokens_32(nb, room, x, 2, h, out, kind, R32_RUNS); break;
            default: rows_tokens_32(nb, room, x, 1, h, out, kind, R32_RUNS); break;
            }
        }
        for (int t = 0; t < nt; t++) {
            float * yt = y + (int64_t) (i0 + t) * y_stride + r0;
            for (int64_t r = 0; r < r1 - r0; r++) {
                yt[r] = accumulate ? yt[r] + out[t][r] : out[t][r];
            }
        }
    }
}


/* ---- Q4_K and Q6_K kept sixteen rows to a tile, the AVX2 set ----------------------------------
 *
 * The AVX-512 set's layout (above), read as two halves of eight rows: each 64-byte run's first 32
 * bytes are rows 0..7, its last 32 rows 8..15, and so are the headers' runs (d and dmin: 16 bytes a
 * half). The products go as this set's tiles take them: vpmaddubsw of eight rows' levels by a
 * token's four activations, summed in int16 (a Q4_K sub-block's eight groups: at most 8 * 2 * 15
 * * 128 = 30720; Q6_K's levels reach 63, two groups: 2 * 2 * 63 * 128 = 32256), one vpmaddwd by the
 * (sc, sc) pairs; the same integers and float steps as rows_tokens_kq, so the same floats. */

/* Sixteen rows of Q4_K (six = 0) or Q6_K into one tile. */
RM_INLINE void ks16_repack(int64_t n, const void * w, uint64_t row_bytes, void * tile, const int six) {
    uint8_t room[KR_BYTES] __attribute__((aligned(64)));
    const size_t bsize = six ? sizeof(rm_block_q6_K) : sizeof(rm_block_q4_K);
    const __m256i n4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < n / RM_QK_K; b++) {
        const uint8_t * src[RM_TILE_ROWS];
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            src[r] = (const uint8_t *) w + (uint64_t) r * row_bytes + (uint64_t) b * bsize;
        }
        if (six) {
            tpack_q6_K(src, room);
        } else {
            tpack_k4(src, room, 0);
        }
        uint8_t * o = (uint8_t *) tile + (uint64_t) b * RM_TILE_ROWS * bsize;
        for (int h = 0; h < 2; h++) {
#define KS16_LOAD(e) _mm256_loadu_si256((const __m256i *) (room + KR_LEV + 64 * (e) + 32 * h))
#define KS16_PAIR(lo, hi) _mm256_or_si256(_mm256_and_si256((lo), n4), _mm256_slli_epi16(_mm256_and_si256((hi), n4), 4))
            for (int j = 0; j < (six ? 16 : 8); j++) {
                if (six) {
                    __m256i g[4], hb = _mm256_setzero_si256();
                    for (int k = 0; k < 4; k++) {
                        g[k] = KS16_LOAD(4 * j + k);
                        hb = _mm256_or_si256(hb, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(g[k], 4), m2), 2 * k));
                    }
                    for (int q = 0; q < 2; q++) {
                        _mm256_storeu_si256((__m256i *) (o + KS16_Q6_LEV(j, q) + 32 * h), KS16_PAIR(g[q], g[q + 2]));
                    }
                    _mm256_storeu_si256((__m256i *) (o + KS16_Q6_HB(j) + 32 * h), hb);
                } else {
                    for (int q = 0; q < 4; q++) {
                        _mm256_storeu_si256((__m256i *) (o + KS16_LEV + 64 * (4 * j + q) + 32 * h),
                                            KS16_PAIR(KS16_LOAD(8 * j + q), KS16_LOAD(8 * j + q + 4)));
                    }
                }
            }
#undef KS16_LOAD
#undef KS16_PAIR
            __m256i v[4];
            side8x4(src + 8 * h, six ? offsetof(rm_block_q6_K, scales) : 0, v);
            if (six) {   /* the scales' four words */
                for (int k = 0; k < 4; k++) {
                    _mm256_storeu_si256((__m256i *) (o + KS16_Q6_SC + 64 * k + 32 * h), v[k]);
                }
                continue;
            }
            const __m256i lo16 = _mm256_set1_epi32(0xffff);   /* d | dmin << 16, then u0, u1, u2 */
            const __m256i d = _mm256_and_si256(v[0], lo16), dm = _mm256_srli_epi32(v[0], 16);
            _mm_storeu_si128((__m128i *) (o + KS16_D + 16 * h), _mm_packus_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1)));
            _mm_storeu_si128((__m128i *) (o + KS16_DMIN + 16 * h),
                             _mm_packus_epi32(_mm256_castsi256_si128(dm), _mm256_extracti128_si256(dm, 1)));
            for (int k = 0; k < 3; k++) {
                _mm256_storeu_si256((__m256i *) (o + KS16_U + 64 * k + 32 * h), v[1 + k]);
            }
        }
        if (six) {
            for (int r = 0; r < RM_TILE_ROWS; r++) {
                memcpy(o + KS16_Q6_D + 2 * r, src[r] + offsetof(rm_block_q6_K, d), 2);
            }
        }
    }
}

static void ks16_repack_q4_K(int64_t n, const void * w, uint64_t row_bytes, void * tile) { ks16_repack(n, w, row_bytes, tile, 0); }
static void ks16_repack_q6_K(int64_t n, const void * w, uint64_t row_bytes, void * tile) { ks16_repack(n, w, row_bytes, tile, 1); }

/* Sub-block J's scale (mins: its min) in each of eight rows' lanes, from the words u0, u1, u2. */
RM_INLINE __m256i ks16_field256(const __m256i u[4], const int J, const int mins) {
    const __m256i m6 = _mm256_set1_epi32(0x3f), m4 = _mm256_set1_epi32(0x0f), m2 = _mm256_set1_epi32(0x30);
    if (J < 4) {
        return _mm256_and_si256(_mm256_srli_epi32(u[mins], 8 * J), m6);
    }
    const int c = 8 * (J - 4) + 4 * mins;
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u[2], c), m4),
                           _mm256_and_si256(_mm256_srli_epi32(u[mins], 8 * (J - 4) + 2), m2));
}

/* Levels of group 4j + k of a Q6_K tile's eight rows (ks16_q6_levels). */
RM_INLINE __m256i ks16_q6_levels256(__m256i v, __m256i hb, const int k) {
    const __m256i n4 = _mm256_set1_epi8(0x0f), m2h = _mm256_set1_epi8(0x30);
    const __m256i lo4 = k < 2 ? _mm256_and_si256(v, n4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), n4);
    const __m256i hi = k < 2 ? _mm256_slli_epi16(hb, 4 - 2 * k) : k == 2 ? hb : _mm256_srli_epi16(hb, 2);
    return _mm256_or_si256(lo4, _mm256_and_si256(hi, m2h));
}

/* An int32 lane's value in both of its int16 halves, for vpmaddwd. */
RM_INLINE __m256i ks16_pair(__m256i v) {
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}

#define KS16_X(t, e) _mm256_set1_epi32(*(const int32_t *) (x[t][b].qs + 4 * (e)))

/* Sub-block j of half h of super-block b (at sb; the header words u) against the nt tokens, into
 * S (ks16_tokens). */
RM_INLINE void ks16_sub(const int j, const uint8_t * sb, int64_t b, const int h, const __m256i u[4],
                        const rm_block_q8_K * const x[KR_TOKENS_AVX2], const int nt, __m256i S[KR_TOKENS_AVX2],
                        const int six) {
    const __m256i n4 = _mm256_set1_epi8(0x0f);
    __m256i P[KR_TOKENS_AVX2];
    if (six) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *) (sb + KS16_Q6_HB(j) + 32 * h));
        const __m256i v0 = _mm256_loadu_si256((const __m256i *) (sb + KS16_Q6_LEV(j, 0) + 32 * h));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *) (sb + KS16_Q6_LEV(j, 1) + 32 * h));
        const __m256i sc = ks16_pair(_mm256_srai_epi32(_mm256_slli_epi32(u[j / 4], 24 - 8 * (j % 4)), 24));
        for (int k0 = 0; k0 < 4; k0 += 2) {   /* two groups a run */
            const __m256i l0 = ks16_q6_levels256(v0, hb, k0), l1 = ks16_q6_levels256(v1, hb, k0 + 1);
            for (int t = 0; t < nt; t++) {
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(l0, KS16_X(t, 4 * j + k0)),
                                                   _mm256_maddubs_epi16(l1, KS16_X(t, 4 * j + k0 + 1)));
                S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(p, sc));
            }
        }
        return;
    }
    for (int t = 0; t < nt; t++) {
        P[t] = _mm256_setzero_si256();
    }
    for (int q = 0; q < 4; q++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *) (sb + KS16_LEV + 64 * (4 * j + q) + 32 * h));
        const __m256i lo = _mm256_and_si256(v, n4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), n4);
        for (int t = 0; t < nt; t++) {
            P[t] = _mm256_add_epi16(P[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, KS16_X(t, 8 * j + q)),
                                                           _mm256_maddubs_epi16(hi, KS16_X(t, 8 * j + q + 4))));
        }
    }
    const __m256i sc = ks16_pair(ks16_field256(u, j, 0));
    for (int t = 0; t < nt; t++) {
        S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(P[t], sc));
    }
}

/* nt tokens (1 to KR_TOKENS_AVX2) against one tile, each super-block's two halves of eight rows
 * in turn (each line of it used whole while in L1): out[t][row]. */
RM_INLINE void ks16_tokens(int64_t nsb, const uint8_t * tile, const rm_block_q8_K * const x[KR_TOKENS_AVX2], const int nt,
                           float out[KR_TOKENS_AVX2][RM_TILE_ROWS], const int six) {
    const size_t tb = RM_TILE_ROWS * (six ? sizeof(rm_block_q6_K) : sizeof(rm_block_q4_K));
    __m256 acc[2][KR_TOKENS_AVX2][8];   /* [half][token][super-block mod 8]: 8 rows */
    for (int h = 0; h < 2; h++) {
        for (int t = 0; t < nt; t++) {
            for (int l = 0; l < 8; l++) {
                acc[h][t][l] = _mm256_setzero_ps();
            }
        }
    }
    for (int64_t bh = 0; bh < 2 * nsb; bh++) {   /* super-block b = bh / 2, its half h = bh % 2 */
        const int64_t b = bh / 2;
        const int h = (int) (bh % 2);
        const uint8_t * sb = tile + (uint64_t) b * tb;
        const uint8_t * hdr = sb + (six ? KS16_Q6_SC : KS16_U) + 32 * h;
        const __m256i u[4] = {_mm256_loadu_si256((const __m256i *) hdr), _mm256_loadu_si256((const __m256i *) (hdr + 64)),
                              _mm256_loadu_si256((const __m256i *) (hdr + 128)),
                              six ? _mm256_loadu_si256((const __m256i *) (hdr + 192)) : _mm256_setzero_si256()};
        __m256i S[KR_TOKENS_AVX2], P[KR_TOKENS_AVX2];
        for (int t = 0; t < nt; t++) {
            S[t] = _mm256_setzero_si256();
        }
        const int nj = six ? 16 : 8;
        if (nt > 2) {   /* two at a time: unrolled whole, the tokens' sums spilled (4 tokens: Q4_K 18.6 -> 17.2 ps a weight, Q6_K 19.7 -> 18.7) */
#pragma GCC unroll 2
            for (int j = 0; j < nj; j++) {
                ks16_sub(j, sb, b, h, u, x, nt, S, six);
            }
        } else {   /* whole for one or two tokens (Q6_K's one token ran 8% slower in pairs) */
#pragma GCC unroll 16
            for (int j = 0; j < nj; j++) {
                ks16_sub(j, sb, b, h, u, x, nt, S, six);
            }
        }
        for (int t = 0; t < nt; t++) {   /* the bsums' weights against the bsums, pair by pair */
            P[t] = _mm256_setzero_si256();
        }
        for (int p = 0; p < 8; p++) {
            __m256i bw;
            if (six) {   /* (sc 2p, sc 2p + 1) */
                const __m256i w = u[p / 2];
                bw = _mm256_or_si256(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(w, 24 - 16 * (p % 2)), 24),
                                                      _mm256_set1_epi32(0xffff)),
                                     _mm256_slli_epi32(_mm256_srai_epi32(_mm256_slli_epi32(w, 16 - 16 * (p % 2)), 24), 16));
            } else {   /* (min p, min p) */
                bw = ks16_pair(ks16_field256(u, p, 1));
            }
            for (int t = 0; t < nt; t++) {
                P[t] = _mm256_add_epi32(P[t], _mm256_madd_epi16(bw, _mm256_set1_epi32(*(const int32_t *) (x[t][b].bsums + 2 * p))));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (sb + (six ? KS16_Q6_D : KS16_D) + 16 * h)));
        const __m256 dm = six ? dw : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (sb + KS16_DMIN + 16 * h)));
        const int l = (int) (b % 8);
        for (int t = 0; t < nt; t++) {
            const __m256 dx = _mm256_set1_ps(x[t][b].d);
            if (six) {   /* the offset 32: S - 32 sum(sc bsums) */
                const __m256i sv = _mm256_sub_epi32(S[t], _mm256_slli_epi32(P[t], 5));
                acc[h][t][l] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(sv), acc[h][t][l]);
            } else {
                acc[h][t][l] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(S[t]), acc[h][t][l]);
                acc[h][t][l] = _mm256_fnmadd_ps(_mm256_mul_ps(dx, dm), _mm256_cvtepi32_ps(P[t]), acc[h][t][l]);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        for (int t = 0; t < nt; t++) {
            _mm256_storeu_ps(out[t] + 8 * h, sum8_ps256(acc[h][t]));
        }
    }
}
#undef KS16_X

/* nc tokens (1 to RM_MULTI_MAX; their Q8_K rows xt_stride bytes apart) against one tile, four at a
 * time: out[c][row] (rm_packed_kernels.dot_tile). */
RM_INLINE void ks16_dot(int64_t n, int nc, float out[][RM_TILE_ROWS], const void * tile, const void * x_t,
                        uint64_t xt_stride, const int six) {
    const int64_t nsb = n / RM_QK_K;
    for (int c = 0; c < nc; c += KR_TOKENS_AVX2) {
        const int nt = nc - c < KR_TOKENS_AVX2 ? nc - c : KR_TOKENS_AVX2;
        const rm_block_q8_K * x[KR_TOKENS_AVX2];
        for (int t = 0; t < KR_TOKENS_AVX2; t++) {
            x[t] = (const rm_block_q8_K *) ((const uint8_t *) x_t + (uint64_t) (c + (t < nt ? t : 0)) * xt_stride);
        }
        float o[KR_TOKENS_AVX2][RM_TILE_ROWS];
        switch (nt) {   /* a copy per count, the token loops unrolled */
        case 4: ks16_tokens(nsb, tile, x, 4, o, six); break;
        case 3: ks16_tokens(nsb, tile, x, 3, o, six); break;
        case 2: ks16_tokens(nsb, tile, x, 2, o, six); break;
        default: ks16_tokens(nsb, tile, x, 1, o, six); break;
        }
        memcpy(out[c], o, sizeof(float) * RM_TILE_ROWS * (size_t) nt);
    }
}

/* One super-block of a stored tile into the room as tpack_k4 / tpack_q6_K leave it: the levels
 * (two groups a 64-byte run; Q6_K's high bits put in), the scales as (sc, sc) pairs, the bsums'
 * weights, d and dmin as floats. */
RM_INLINE void ks16_to_room(const uint8_t * sb, uint8_t * wb, const int six) {
    const __m256i n4 = _mm256_set1_epi8(0x0f), lo16 = _mm256_set1_epi32(0xffff);
    for (int h = 0; h < 2; h++) {
        const uint8_t * hdr = sb + (six ? KS16_Q6_SC : KS16_U) + 32 * h;
        __m256i u[4];
        for (int k = 0; k < (six ? 4 : 3); k++) {
            u[k] = _mm256_loadu_si256((const __m256i *) (hdr + 64 * k));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (sb + (six ? KS16_Q6_D : KS16_D) + 16 * h)));
        _mm256_storeu_ps((float *) (wb + KR_D + 32 * h), dw);
        _mm256_storeu_ps((float *) (wb + KR_D + 64 + 32 * h),
                         six ? _mm256_setzero_ps() : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (sb + KS16_DMIN + 16 * h))));
        if (six) {
            __m256i sc[16];
            for (int j = 0; j < 16; j++) {
                sc[j] = _mm256_srai_epi32(_mm256_slli_epi32(u[j / 4], 24 - 8 * (j % 4)), 24);
                _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * j + 32 * h), ks16_pair(sc[j]));
                const __m256i hb = _mm256_loadu_si256((const __m256i *) (sb + KS16_Q6_HB(j) + 32 * h));
                for (int k = 0; k < 4; k++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *) (sb + KS16_Q6_LEV(j, k % 2) + 32 * h));
                    _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (4 * j + k) + 32 * h), ks16_q6_levels256(v, hb, k));
                }
            }
            for (int p = 0; p < 8; p++) {
                _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * p + 32 * h),
                                    _mm256_or_si256(_mm256_and_si256(sc[2 * p], lo16), _mm256_slli_epi32(sc[2 * p + 1], 16)));
            }
            continue;
        }
        for (int J = 0; J < 8; J++) {
            const __m256i sc = ks16_pair(ks16_field256(u, J, 0));
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * J) + 32 * h), sc);
            _mm256_storeu_si256((__m256i *) (wb + KR_SC + 64 * (2 * J + 1) + 32 * h), sc);
            _mm256_storeu_si256((__m256i *) (wb + KR_BW + 64 * J + 32 * h), ks16_pair(ks16_field256(u, J, 1)));
            for (int q = 0; q < 4; q++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *) (sb + KS16_LEV + 64 * (4 * J + q) + 32 * h));
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * J + q) + 32 * h), _mm256_and_si256(v, n4));
                _mm256_storeu_si256((__m256i *) (wb + KR_LEV + 64 * (8 * J + q + 4) + 32 * h),
                                    _mm256_and_si256(_mm256_srli_epi16(v, 4), n4));
            }
        }
    }
}

/* From this many tokens a stored tile is unpacked into the room once and read from there four
 * tokens a pass (rows_kq_room), instead of its nibbles being split again for each pass. */
#define KS16_ROOM_TOKENS 8

/* The tile form on a stored matrix: rows r0..r1 (whole tiles or not) against every token of x_t. */
RM_INLINE void ks16_matmul(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                           int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate, const int six) {
    const uint64_t xrow = (uint64_t) (n / RM_QK_K) * sizeof(rm_block_q8_K);
    const size_t tb = RM_TILE_ROWS * (six ? sizeof(rm_block_q6_K) : sizeof(rm_block_q4_K));
    for (int64_t k0 = r0 / RM_TILE_ROWS * RM_TILE_ROWS; k0 < r1; k0 += RM_TILE_ROWS) {
        const int64_t a = r0 > k0 ? r0 : k0, e = r1 < k0 + RM_TILE_ROWS ? r1 : k0 + RM_TILE_ROWS;
        if (n_tok >= KS16_ROOM_TOKENS) {
            for (int64_t b = 0; b < n / RM_QK_K; b++) {
                ks16_to_room((const uint8_t *) w + (uint64_t) k0 * row_bytes + (uint64_t) b * tb, (uint8_t *) room + (uint64_t) b * KR_BYTES,
                             six);
            }
            rows_kq_room(n / RM_QK_K, room, x_t, n_tok, k0, a, e, y, y_stride, accumulate, six, six ? 32 : 0);
            continue;
        }
        for (int32_t i0 = 0; i0 < n_tok; i0 += RM_MULTI_MAX) {
            const int nt = n_tok - i0 < RM_MULTI_MAX ? n_tok - i0 : RM_MULTI_MAX;
            float out[RM_MULTI_MAX][RM_TILE_ROWS];
            ks16_dot(n, nt, out, (const uint8_t *) w + (uint64_t) k0 * row_bytes, (const uint8_t *) x_t + (uint64_t) i0 * xrow,
                     xrow, six);
            for (int t = 0; t < nt; t++) {
                float * yt = y + (int64_t) (i0 + t) * y_stride;
                for (int64_t r = a; r < e; r++) {
                    yt[r] = accumulate ? yt[r] + out[t][r - k0] : out[t][r - k0];
                }
            }
        }
    }
}

#define RM_KS16_KERNELS(t, six)                                                                                      \
    static void ks16_dot_##t(int64_t n, int nc, float out[][RM_TILE_ROWS], const void * tile, const void * x_t,     \
                             uint64_t xt_stride) {                                                                  \
        ks16_dot(n, nc, out, tile, x_t, xt_stride, six);                                                            \
    }                                                                                                                \
    static void ks16_matmul_##t(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1,              \
                                const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride,          \
                                int accumulate) {                                                                  \
        ks16_matmul(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, six);                       \
    }

RM_KS16_KERNELS(q4_K, 0)
RM_KS16_KERNELS(q6_K, 1)

#endif

/* The tile form on matrices kept sixteen rows to a tile (ks16_*; ks16_none: the type has none). */
static void ks16_none(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                      int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {
    (void) n, (void) w, (void) row_bytes, (void) r0, (void) r1, (void) x_t, (void) n_tok, (void) room, (void) y;
    (void) y_stride, (void) accumulate;
}
#define KQ_MATMUL16_q4_K ks16_matmul_q4_K
#define KQ_MATMUL16_q6_K ks16_matmul_q6_K
/* The stored form of Q4_K and Q6_K, tiles of sixteen rows (both sets; Q5_K and IQ4_XS: RM_KS16_PACKED_AVX512) */
#define RM_KS16_PACKED                                                                                             \
    static const rm_packed_kernels packed_q4_K = {NULL, kq_act_bytes, NULL, kq_copy_act, NULL, NULL, NULL, NULL, 0, \
                                                  ks16_repack_q4_K, ks16_dot_q4_K};                                \
    static const rm_packed_kernels packed_q6_K = {NULL, kq_act_bytes, NULL, kq_copy_act, NULL, NULL, NULL, NULL, 0, \
                                                  ks16_repack_q6_K, ks16_dot_q6_K};
#ifdef RM_KQ_GROUPED   /* Q5_K and IQ4_XS too (the AVX2 set keeps them as the file has them) */
#define KQ_MATMUL16_q5_K ks16_matmul_q5_K
#define KQ_MATMUL16_iq4_xs ks16_matmul_iq4_xs
#define RM_KS16_PACKED_AVX512                                                                                          \
    static const rm_packed_kernels packed_q5_K = {NULL, kq_act_bytes, NULL, kq_copy_act, NULL, NULL, NULL, NULL, 0,     \
                                                  ks16_repack_q5_K, ks16_dot_q5_K};                                    \
    static const rm_packed_kernels packed_iq4_xs = {NULL, kq_act_bytes, NULL, kq_copy_act, NULL, NULL, NULL, NULL, 0,   \
                                                    ks16_repack_iq4_xs, ks16_dot_iq4_xs};
#else
#define KQ_MATMUL16_q5_K ks16_none
#define KQ_MATMUL16_iq4_xs ks16_none
#endif
#define KQ_MATMUL16_q2_K ks16_none
#define KQ_MATMUL16_q3_K ks16_none
#define KQ_MATMUL16_iq2_xxs ks16_none
#define KQ_MATMUL16_iq3_xxs ks16_none

#define RM_ROWS_32(t, kind, min_tokens)                                                                            \
    static void matmul_rows_##t(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1, \
                                const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride,         \
                                int accumulate) {                                                                  \
        matmul_rows_32(n, w, stored, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, kind);          \
    }                                                                                                              \
    static const rm_tile_kernels rows_##t = {min_tokens, 1, usable_rows_##t, act_bytes_rows_32, put_group_rows_32, \
                                             room_bytes_rows_32, matmul_rows_##t, 1};

#define RM_ROWS_KQ(t, block, sixteen, off_mul, min_tokens)                                                         \
    static void matmul_rows_##t(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1, \
                                const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride,         \
                                int accumulate) {                                                                  \
        if (stored) {   /* rows kept sixteen to a tile (the only stored layout of the K-quants) */                 \
            KQ_MATMUL16_##t(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate);                    \
            return;                                                                                                \
        }                                                                                                          \
        matmul_rows_kq(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, KQ_UNPACK_##t,          \
                       KQ_TPACK_##t, sizeof(block), sixteen, off_mul);                                             \
    }                                                                                                              \
    static const rm_tile_kernels rows_##t = {min_tokens, 1, usable_rows_kq, act_bytes_rows_kq, put_group_rows_kq,  \
                                             room_bytes_rows_kq, matmul_rows_##t, KQ_MATMUL16_##t != ks16_none};

#endif
