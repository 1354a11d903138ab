/* matmul_amx.c - the AMX set: prefill matrix products on the tile registers (AMX-TILE, AMX-INT8),
 * for Q8_0 and Q4_0 (below) and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS and
 * IQ3_XXS (further down), each bit for bit the AVX-512 set's one-token kernel.
 *
 * One tdpbssd multiplies a tile of 16 weight rows x 32 int8 levels by a tile of 32 levels x 16
 * tokens into 16 x 16 int32 sums: one 32-element block of 16 rows against 16 tokens, 8192
 * multiply-adds in one instruction. Every block has its own scales, so the int32 tile is stored
 * after each block and scaled with AVX-512, 16 tokens to a register:
 *
 *   acc[r][b mod 8][c] = fma(dw[r][b] * dx[c][b], float(sum[r][c]), acc[r][b mod 8][c])
 *
 * then out[r][c] is the eight partial sums added as hsum_ps adds them. These are the integers
 * and the float operations, in the same order, of the AVX-512 set's kernels (dot_32_multi and its
 * prefill form, on rows of whole groups of eight blocks), so a token's result is bit for bit the
 * one the AVX-512 set's vec_dot gives, in prefill and in decode. Everything else in this set
 * (vec_dot, decode, products of too few tokens, the other types) is the AVX-512 set's: dispatch.c
 * falls through.
 *
 * Layouts. A thread's room holds RM_TILE_ROWS rows unpacked: per block, the 16 rows' 32 signed
 * levels (512 bytes, Q4_0's nibbles less 8) and their 16 scales as floats (64 bytes), rows past
 * the matrix zero. The activations of a product: per group of 16 tokens and per block, the
 * levels in the tile's pairing (dword j of token c at 64 j + 4 c: 512 bytes), then the 16 token
 * scales as floats (64 bytes); places past the last token are zero. Both are 576 bytes per block,
 * 1.125 bytes per weight or activation: made per product (a thread's room is 18 bytes per element
 * of a row), nothing is kept at load. Q4_0 rows that the AVX-512 set keeps in its stored layout
 * (RAPIDMOE_REPACK) are unpacked from that layout.
 *
 * Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags (CMakeLists.txt), only where the
 * compiler has them (RM_AMX); chosen only where cpuid, XCR0 and the kernel's grant of the tile
 * state all say yes (dispatch.c).
 */
#if defined(RM_AMX)

#include <immintrin.h>
#include <string.h>

#include "iq_grids.h"
#include "dispatch.h"
#include "iq_grid_x86.h"
#include "transpose_x86.h"

#define RM_AMX_INLINE static inline __attribute__((always_inline))
#define TILE_BLOCK_BYTES 576   /* one block of RM_TILE_ROWS rows or 16 tokens: 512 levels + 64 scale bytes */
#define TILE_TOKENS RM_TILE_TOKENS

/* The tile configuration (palette 1): tile 0 the int32 sums (16 rows x 16 tokens), tile 1 the
 * weights (16 rows x 32 levels), tile 2 the activations (8 rows of 4 levels x 16 tokens). */
typedef struct tile_config {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} tile_config;

/* ldtilecfg with the whole 64-byte configuration as its operand: GCC 12's _tile_loadconfig names
 * only its first 8 bytes, so the compiler may drop the stores of the rest as dead (it did, once
 * the K-quant tiles' accumulators grew: the tiles were left unconfigured and tilezero faulted). */
static inline void tile_load_config(const tile_config * cfg) {
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
}

static void tile_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    cfg.rows[0] = RM_TILE_ROWS, cfg.colsb[0] = TILE_TOKENS * 4;
    cfg.rows[1] = RM_TILE_ROWS, cfg.colsb[1] = RM_QK;
    cfg.rows[2] = RM_QK / 4, cfg.colsb[2] = TILE_TOKENS * 4;
    tile_load_config(&cfg);
}

enum { Q8_0_LEVELS, Q4_0_LEVELS };

static int usable_32(int64_t n) { return n > 0 && n % (8 * RM_QK) == 0; }   /* whole groups of eight blocks */

static uint64_t act_bytes_32(int64_t n, int32_t n_tok) {
    return (uint64_t) ((n_tok + TILE_TOKENS - 1) / TILE_TOKENS) * (uint64_t) (n / RM_QK) * TILE_BLOCK_BYTES;
}

static uint64_t room_bytes_32(int64_t n) { return (uint64_t) (n / RM_QK) * TILE_BLOCK_BYTES; }

static void put_act_32(int64_t n, const void * x_q, int32_t i, int32_t n_tok, void * x_t) {
    const int64_t nb = n / RM_QK;
    const rm_block_q8_0 * x = x_q;
    uint8_t * g = (uint8_t *) x_t + (uint64_t) (i / TILE_TOKENS) * (uint64_t) nb * TILE_BLOCK_BYTES;
    const int c = i % TILE_TOKENS;
    /* the last token clears the places after it in its group */
    const int clear = i == n_tok - 1 ? TILE_TOKENS - 1 - c : 0;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t * blk = g + (uint64_t) b * TILE_BLOCK_BYTES;
        for (int j = 0; j < RM_QK / 4; j++) {
            memcpy(blk + 64 * j + 4 * c, x[b].qs + 4 * j, 4);
            memset(blk + 64 * j + 4 * (c + 1), 0, (size_t) (4 * clear));
        }
        const float dx = rm_fp16_to_fp32(x[b].d);   /* as rm_q8_0_act_info has it */
        memcpy(blk + 512 + 4 * c, &dx, 4);
        memset(blk + 512 + 4 * (c + 1), 0, (size_t) (4 * clear));
    }
}

static void put_group_32(int64_t n, const void * x_q, uint64_t x_stride, int32_t i0, int32_t count, void * x_t) {
    for (int32_t c = 0; c < count; c++) {   /* the last one clears the places after it */
        put_act_32(n, (const uint8_t *) x_q + (uint64_t) c * x_stride, i0 + c, i0 + count, x_t);
    }
}

/* Block k of a group of eight in the AVX-512 set's stored Q4_0 layout (vec_dot_avx512.c,
 * repack_row_32): the eight fp16 scales, then 4 x 32 bytes whose dword k holds, in its low
 * nibbles, levels 8m..8m+3 of block k and in its high nibbles levels 8m+4..8m+7 (m = 0..3). */
static void stored_q4_0_block(const uint8_t * g, int k, float * d, uint8_t * out) {
    rm_fp16 h;
    memcpy(&h, g + 2 * k, sizeof(h));
    *d = rm_fp16_to_fp32(h);
    int32_t u[4];
    for (int m = 0; m < 4; m++) {
        memcpy(&u[m], g + 16 + 32 * m + 4 * k, 4);
    }
    const __m128i v = _mm_loadu_si128((const __m128i *) u), m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m4), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), eight);
    _mm_storeu_si128((__m128i *) out, _mm_unpacklo_epi32(lo, hi));
    _mm_storeu_si128((__m128i *) (out + 16), _mm_unpackhi_epi32(lo, hi));
}

/* Rows r0..r1 (at most RM_TILE_ROWS) unpacked into the room, block by block. */
static void pack_rows_32(int64_t n, const uint8_t * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                         uint8_t * room, const int kind) {
    const int64_t nb = n / RM_QK;
    const size_t wblock = kind == Q8_0_LEVELS ? sizeof(rm_block_q8_0) : sizeof(rm_block_q4_0);
    const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t * blk = room + (uint64_t) b * TILE_BLOCK_BYTES;
        float * dw = (float *) (blk + 512);
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            if (r0 + r >= r1) {
                memset(blk + 32 * r, 0, 32);
                dw[r] = 0.0f;
                continue;
            }
            if (stored) {   /* Q4_0 only: 8 blocks take 144 bytes in either layout */
                stored_q4_0_block(w + (uint64_t) (r0 + r) * row_bytes + (uint64_t) (b / 8) * 8 * wblock, (int) (b % 8),
                                  &dw[r], blk + 32 * r);
                continue;
            }
            const uint8_t * src = w + (uint64_t) (r0 + r) * row_bytes + (uint64_t) b * wblock;
            rm_fp16 h;
            memcpy(&h, src, sizeof(h));   /* d is each block's first field */
            dw[r] = rm_fp16_to_fp32(h);
            if (kind == Q8_0_LEVELS) {
                memcpy(blk + 32 * r, ((const rm_block_q8_0 *) src)->qs, 32);
            } else {   /* levels 0..15 in the low nibbles, 16..31 in the high ones */
                const __m128i v = _mm_loadu_si128((const __m128i *) ((const rm_block_q4_0 *) src)->qs);
                _mm_storeu_si128((__m128i *) (blk + 32 * r), _mm_sub_epi8(_mm_and_si128(v, m4), eight));
                _mm_storeu_si128((__m128i *) (blk + 32 * r + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), eight));
            }
        }
    }
}

/* One group of 16 tokens against the packed rows: see the top of the file. out[r][c] */
static void tile_group_32(int64_t nb, const uint8_t * room, const uint8_t * xg, float out[RM_TILE_ROWS][TILE_TOKENS]) {
    __m512 acc[RM_TILE_ROWS][8];
    int32_t sums[RM_TILE_ROWS][TILE_TOKENS] __attribute__((aligned(64)));
    for (int r = 0; r < RM_TILE_ROWS; r++) {
        for (int k = 0; k < 8; k++) {
            acc[r][k] = _mm512_setzero_ps();
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * wb = room + (uint64_t) b * TILE_BLOCK_BYTES, * xb = xg + (uint64_t) b * TILE_BLOCK_BYTES;
        _tile_zero(0);
        _tile_loadd(1, wb, RM_QK);
        _tile_loadd(2, xb, TILE_TOKENS * 4);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, sums, TILE_TOKENS * 4);
        const __m512 dx = _mm512_loadu_ps(xb + 512);
        const float * dw = (const float *) (wb + 512);
        const int k = (int) (b % 8);
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            const __m512 d = _mm512_mul_ps(_mm512_set1_ps(dw[r]), dx);
            acc[r][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_load_si512(sums[r])), acc[r][k]);
        }
    }
    for (int r = 0; r < RM_TILE_ROWS; r++) {   /* hsum_ps's order: ((0+4) + (2+6)) + ((1+5) + (3+7)) */
        const __m512 even = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][4]), _mm512_add_ps(acc[r][2], acc[r][6]));
        const __m512 odd = _mm512_add_ps(_mm512_add_ps(acc[r][1], acc[r][5]), _mm512_add_ps(acc[r][3], acc[r][7]));
        _mm512_storeu_ps(out[r], _mm512_add_ps(even, odd));
    }
}

/* y[(i0 + c) * y_stride + r] (+)= out[r - r0][c] for the group's tokens */
static void store_tile(float out[RM_TILE_ROWS][TILE_TOKENS], int32_t i0, int32_t n_tok, int64_t r0, int64_t r1, float * y,
                       int64_t y_stride, int accumulate) {
    const int nc = n_tok - i0 < TILE_TOKENS ? n_tok - i0 : TILE_TOKENS;
    for (int c = 0; c < nc; c++) {
        float * yc = y + (int64_t) (i0 + c) * y_stride;
        for (int64_t r = r0; r < r1; r++) {
            yc[r] = accumulate ? yc[r] + out[r - r0][c] : out[r - r0][c];
        }
    }
}

static void matmul_32(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                      const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate,
                      const int kind) {
    const int64_t nb = n / RM_QK;
    pack_rows_32(n, w, stored, row_bytes, r0, r1, room, kind);
    tile_configure();
    for (int32_t i0 = 0; i0 < n_tok; i0 += TILE_TOKENS) {
        float out[RM_TILE_ROWS][TILE_TOKENS];
        tile_group_32(nb, room, (const uint8_t *) x_t + (uint64_t) (i0 / TILE_TOKENS) * (uint64_t) nb * TILE_BLOCK_BYTES,
                      out);
        store_tile(out, i0, n_tok, r0, r1, y, y_stride, accumulate);
    }
    _tile_release();
}

static void matmul_q8_0(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                        const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {
    matmul_32(n, w, 0, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, Q8_0_LEVELS);   /* never stored */
}

static void matmul_q4_0(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                        const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {
    matmul_32(n, w, stored, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, Q4_0_LEVELS);
}

/* ---- the K-quants (Q2_K to Q6_K), IQ4_XS, IQ2_XXS and IQ3_XXS, against Q8_K ---------------- *
 *
 * A super-block's exact integer dot S (the reference's sumi) is sum_j sc_j * dot(levels_j, x_j)
 * over its sub-blocks j (Q4_K/Q5_K/IQ4_XS/IQ2_XXS/IQ3_XXS: 8 of 32 elements; Q2_K/Q3_K/Q6_K: 16 of 16),
 * with integer sub-block scales sc_j. The packing folds each scale into its levels: w = level *
 * sc, at most 4096 in size for every type here (Q6_K: 32 * 128), split as w = 128 hi + lo with hi
 * in [-32, 32] and lo in [0, 127], both int8. Two tdpbssd per 64 elements (K = 64), one on the
 * his and one on the los, then give S = 128 H + L for 16 rows x 16 tokens, in int32 without
 * overflow (|S| < 256 * 4096 * 128). For the mins of Q4_K/Q5_K the integer M = sum_s m_s (bsums
 * of sub-block s) comes from vpmaddwd on pairs of sub-blocks. Q6_K's levels are stored less 32
 * (signed), so it needs no offset term; IQ4_XS is Q4_K's shape with its table's signed levels and
 * signed scales (sc - 32), and no mins; IQ2_XXS and IQ3_XXS the same with their signed codebook
 * levels, scales 2s + 1 and a power-of-two step (d_x d_w step, the float the AVX-512 kernel takes).
 * Q3_K's levels are taken less 4 (signed, -4..3) with its scales less 32, |w| <= 128. Q2_K's w =
 * level * scale is at most 45, all lo: its his' places carry each element's 4-bit min instead, so
 * the his' tile gives M (sixteen mins of 16 elements) directly, exact, with no bsums.
 *
 * The AVX-512 kernels reduce each super-block to the same S and M, and their float steps depend
 * on nothing else (simd_x86.h, kq_sum): super-block b goes to partial sum b mod 8 as
 * fma(d_w d_x, S), then fma(-dmin_w d_x, M), and the eight partial sums are added as hsum_ps adds
 * them. The tiles take the same steps, 16 tokens to a register, so every output is bit for bit
 * the one-token kernel's (rm_tile_kernels.exact).
 *
 * Layouts, per super-block. Weights (a thread's room, RM_TILE_ROWS rows): the his, 64 elements at
 * a time, 16 rows x 64 bytes each (4096 bytes), then the los the same way (4096); the mins in
 * pairs of int16 [pair][row] (256); d and dmin as floats [row] (128). Activations (per group of 16
 * tokens): the levels, dword e of token c at 64 e + 4 c (4096 bytes); d as floats (64); the
 * 32-element sums in pairs of int16 [pair][token] (256). That is 33.5 bytes of room per element
 * of a row, and 1.08 bytes per activation. */
#define KQ_W_BYTES (4096 + 4096 + 256 + 128)
#define KQ_W_LO 4096
#define KQ_W_MINS 8192
#define KQ_W_D 8448
#define KQ_X_BYTES (4096 + 64 + 256)

enum { KQ_Q4_K, KQ_Q5_K, KQ_Q6_K, KQ_IQ4_XS, KQ_IQ2_XXS, KQ_IQ3_XXS, KQ_Q2_K, KQ_Q3_K };

/* sub-blocks of 16 elements (sixteen scales), not 32 */
#define KQ_SIXTEEN(kind) ((kind) == KQ_Q6_K || (kind) == KQ_Q2_K || (kind) == KQ_Q3_K)

static int usable_kq(int64_t n) { return n > 0 && n % RM_QK_K == 0; }

static uint64_t act_bytes_kq(int64_t n, int32_t n_tok) {
    return (uint64_t) ((n_tok + TILE_TOKENS - 1) / TILE_TOKENS) * (uint64_t) (n / RM_QK_K) * KQ_X_BYTES;
}

static uint64_t room_bytes_kq(int64_t n) { return (uint64_t) (n / RM_QK_K) * KQ_W_BYTES; }

/* A group of up to 16 tokens' Q8_K rows into the tile layout: 64 dwords of 16 tokens at a time
 * by a transpose in registers; tokens past `count` as zeros. */
static void put_group_kq(int64_t n, const void * x_q, uint64_t x_stride, int32_t i0, int32_t count, void * x_t) {
    const int64_t nsb = n / RM_QK_K;
    uint8_t * g = (uint8_t *) x_t + (uint64_t) (i0 / TILE_TOKENS) * (uint64_t) nsb * KQ_X_BYTES;
    static const rm_block_q8_K zero;   /* all zero: d 0, levels 0, sums 0 */
    for (int64_t b = 0; b < nsb; b++) {
        const rm_block_q8_K * x[TILE_TOKENS];
        for (int c = 0; c < TILE_TOKENS; c++) {
            x[c] = c < count ? (const rm_block_q8_K *) ((const uint8_t *) x_q + (uint64_t) c * x_stride) + b : &zero;
        }
        uint8_t * blk = g + (uint64_t) b * KQ_X_BYTES;
        for (int e0 = 0; e0 < RM_QK_K / 4; e0 += 16) {
            __m512i r[16];
            for (int c = 0; c < TILE_TOKENS; c++) {
                r[c] = _mm512_loadu_si512(x[c]->qs + 4 * e0);
            }
            transpose16_epi32(r);
            for (int j = 0; j < 16; j++) {
                _mm512_storeu_si512(blk + 64 * (e0 + j), r[j]);
            }
        }
        float * d = (float *) (blk + 4096);
        int16_t * pairs = (int16_t *) (blk + 4160);
        for (int c = 0; c < TILE_TOKENS; c++) {
            d[c] = x[c]->d;
            for (int p = 0; p < 4; p++) {   /* sub-blocks 2p and 2p + 1: 32-element sums, at most 4064 */
                pairs[32 * p + 2 * c] = (int16_t) (x[c]->bsums[4 * p] + x[c]->bsums[4 * p + 1]);
                pairs[32 * p + 2 * c + 1] = (int16_t) (x[c]->bsums[4 * p + 2] + x[c]->bsums[4 * p + 3]);
            }
        }
    }
}

/* Q4_K/Q5_K's sub-block scale and min j of 12 packed bytes (as quants_ref.c unpacks them) */
static void scale_min_k4(const uint8_t q[12], int j, int32_t * sc, int32_t * mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* An IQ2_XXS (iq2) or IQ3_XXS row's super-block: sub-block j's codebook magnitudes with their
 * signs (rm_iq_ksigns) as signed levels, its scale 2s + 1, and d (the type's power-of-two step is
 * a float step of the tile, as in simd_x86.h's dot_iq_grid). */
RM_AMX_INLINE void unpack_iq_grid(const uint8_t * src, int8_t lev[RM_QK_K], int32_t sc[16], float * d, const int iq2) {
    const uint8_t * qs = src + sizeof(rm_fp16);
    const int kind = iq2 ? IQ_GRID_2XXS : IQ_GRID_3XXS;
    uint32_t signs[8], mul[8];
    iq_grid_words(iq_grid_ss(qs, kind), signs, mul);   /* as the one-token kernels take them */
    for (int j = 0; j < 8; j++) {
        const __m256i mag = iq_grid_mag(qs, j, kind);
        /* bit 8k + l of the sign bytes: level 8k + l is negative */
        _mm256_store_si256((__m256i *) (lev + 32 * j), _mm256_mask_sub_epi8(mag, (__mmask32) signs[j], _mm256_setzero_si256(), mag));
        sc[j] = (int16_t) mul[j];
    }
    rm_fp16 h;
    memcpy(&h, src, sizeof(h));
    d[0] = rm_fp16_to_fp32(h);
}

/* Q2_K (element 128h + 32g + l: bits 2g of qs byte 32h + l; scale and min of sub-block j in the
 * low and high nibbles of scales[j]) or Q3_K (the same two bits, less 4 where bit 4h + g of hmask
 * byte l is clear; sixteen 6-bit scales, stored + 32, in 12 bytes). */
RM_AMX_INLINE void unpack_q23_K(const uint8_t * src, int8_t lev[RM_QK_K], int32_t sc[16], int32_t mn[16], float d[2],
                                const int q3) {
    const rm_block_q2_K * b2 = (const rm_block_q2_K *) src;
    const rm_block_q3_K * b3 = (const rm_block_q3_K *) src;
    const __m256i m2 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *) b3->hmask) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) ((q3 ? b3->qs : b2->qs) + 32 * h));
        for (int g = 0; g < 4; g++) {
            __m256i l = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), m2);
            if (q3) {   /* less 4 where the high bit is clear */
                const __m256i bit = _mm256_set1_epi8((char) (1 << (4 * h + g)));
                const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                l = _mm256_sub_epi8(l, _mm256_and_si256(clear, four));
            }
            _mm256_store_si256((__m256i *) (lev + 128 * h + 32 * g), l);
        }
    }
    for (int j = 0; j < 16; j++) {
        if (q3) {
            sc[j] = (((b3->scales[j % 8] >> (j < 8 ? 0 : 4)) & 0x0f) | (((b3->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        } else {
            sc[j] = b2->scales[j] & 0x0f;
            mn[j] = b2->scales[j] >> 4;
        }
    }
    d[0] = rm_fp16_to_fp32(q3 ? b3->d : b2->d);
    d[1] = q3 ? 0.0f : rm_fp16_to_fp32(b2->dmin);
}

/* A row's super-block in element order: its signed levels, its sub-block scales (of 16 elements
 * for Q6_K, Q2_K and Q3_K, 32 for the others), and for Q4_K/Q5_K/Q2_K its mins and dmin; d[0] d,
 * d[1] dmin. */
RM_AMX_INLINE void unpack_kq(const uint8_t * src, int8_t lev[RM_QK_K], int32_t sc[16], int32_t mn[16], float d[2],
                             const int kind) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (kind == KQ_Q2_K || kind == KQ_Q3_K) {
        unpack_q23_K(src, lev, sc, mn, d, kind == KQ_Q3_K);
        return;
    }
    if (kind == KQ_IQ4_XS) {   /* sub-block j: the table's levels of 16 qs bytes' low, then high nibbles */
        const rm_block_iq4_xs * b = (const rm_block_iq4_xs *) src;
        const __m128i table = _mm_loadu_si128((const __m128i *) rm_iq4nl_values), m4l = _mm_set1_epi8(0x0f);
        for (int j = 0; j < 8; j++) {
            const __m128i q = _mm_loadu_si128((const __m128i *) (b->qs + 16 * j));
            _mm256_store_si256((__m256i *) (lev + 32 * j),
                               _mm256_set_m128i(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4l)),
                                                _mm_shuffle_epi8(table, _mm_and_si128(q, m4l))));
            sc[j] = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
        }
        d[0] = rm_fp16_to_fp32(b->d);
        return;
    }
    if (kind == KQ_IQ2_XXS || kind == KQ_IQ3_XXS) {
        unpack_iq_grid(src, lev, sc, d, kind == KQ_IQ2_XXS);
        return;
    }
    if (kind == KQ_Q6_K) {   /* element 128h + 32g + l */
        const rm_block_q6_K * b = (const rm_block_q6_K *) src;
        const __m256i m2h = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *) (b->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2h));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2h));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2h));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2h));
            for (int g = 0; g < 4; g++) {
                _mm256_storeu_si256((__m256i *) (lev + 128 * h + 32 * g), _mm256_sub_epi8(q[g], k32));
            }
        }
        for (int j = 0; j < 16; j++) {
            sc[j] = b->scales[j];
        }
        d[0] = rm_fp16_to_fp32(b->d);
        return;
    }
    const rm_block_q4_K * b = (const rm_block_q4_K *) src;   /* d, dmin, scales: the same places in Q5_K */
    const uint8_t * qs = kind == KQ_Q5_K ? ((const rm_block_q5_K *) src)->qs : b->qs;
    const __m256i qh = kind == KQ_Q5_K ? _mm256_loadu_si256((const __m256i *) ((const rm_block_q5_K *) src)->qh)
                                       : _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {   /* sub-block 2p in the low nibbles of qs[32p..], 2p + 1 in the high */
        const __m256i q = _mm256_loadu_si256((const __m256i *) (qs + 32 * p));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (kind == KQ_Q5_K) {   /* qh bit 2p of byte l: element 64p + l's fifth bit; 2p + 1: 64p + 32 + l's */
            const __m256i b4 = _mm256_set1_epi8(0x10), h = _mm256_srli_epi16(qh, 2 * p);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
        }
        _mm256_storeu_si256((__m256i *) (lev + 64 * p), lo);
        _mm256_storeu_si256((__m256i *) (lev + 64 * p + 32), hi);
    }
    for (int j = 0; j < 8; j++) {
        scale_min_k4(b->scales, j, &sc[j], &mn[j]);
    }
    d[0] = rm_fp16_to_fp32(b->d);
    d[1] = rm_fp16_to_fp32(b->dmin);
}

/* Row r of super-block b into its places in the room block wb: level * scale as 128 hi + lo.
 * 64 elements at a time in 16-bit lanes, the even elements and the odd ones apart (no byte
 * shuffles): the products' bits 7-14 are the hi bytes, bits 0-6 the lo bytes. */
RM_AMX_INLINE void pack_row_kq(const uint8_t * src, int r, uint8_t * wb, const int kind) {
    int8_t lev[RM_QK_K] __attribute__((aligned(64)));
    int32_t sc[16], mn[16];
    float d[2];
    unpack_kq(src, lev, sc, mn, d, kind);
    const __m512i low_bytes = _mm512_set1_epi16(0x00ff), low7 = _mm512_set1_epi16(0x7f7f);
    __m512i sc6 = _mm512_setzero_si512(), mn2 = _mm512_setzero_si512();
    if (KQ_SIXTEEN(kind)) {
        int16_t s16[16], m16[16];
        for (int j = 0; j < 16; j++) {
            s16[j] = (int16_t) sc[j];
            m16[j] = kind == KQ_Q2_K ? (int16_t) mn[j] : 0;
        }
        sc6 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) s16));
        mn2 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) m16));
    }
    for (int t = 0; t < 4; t++) {
        const __m512i l = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *) (lev + 64 * t))),
                                             _mm256_load_si256((const __m256i *) (lev + 64 * t + 32)), 1);
        /* lane i holds elements 2i and 2i + 1: sub-block (64t + 2i) / 16 of sixteen, (64t + 2i) / 32 of eight */
        const __m512i sub16 = _mm512_add_epi16(_mm512_set1_epi16((int16_t) (4 * t)),
                                               _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                                                  15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3));
        const __m512i s = KQ_SIXTEEN(kind)
            ? _mm512_permutexvar_epi16(sub16, sc6)
            : _mm512_inserti64x4(_mm512_set1_epi16((int16_t) sc[2 * t]), _mm256_set1_epi16((int16_t) sc[2 * t + 1]), 1);
        const __m512i we = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(l, 8), 8), s);
        const __m512i wo = _mm512_mullo_epi16(_mm512_srai_epi16(l, 8), s);
        /* low byte from the even product, high byte from the odd one: (c ? a : b) bitwise, 0xe4 */
        __m512i hi = _mm512_ternarylogic_epi32(_mm512_srai_epi16(we, 7), _mm512_slli_epi16(wo, 1), low_bytes, 0xe4);
        if (kind == KQ_Q2_K) {   /* w in 0..45 is all lo: the his' places take each element's min */
            const __m512i m = _mm512_permutexvar_epi16(sub16, mn2);
            hi = _mm512_or_si512(m, _mm512_slli_epi16(m, 8));
        }
        const __m512i lo = _mm512_and_si512(_mm512_ternarylogic_epi32(we, _mm512_slli_epi16(wo, 8), low_bytes, 0xe4), low7);
        _mm512_storeu_si512(wb + 1024 * t + 64 * r, hi);
        _mm512_storeu_si512(wb + KQ_W_LO + 1024 * t + 64 * r, lo);
    }
    float * dd = (float *) (wb + KQ_W_D);
    dd[r] = d[0];
    if (kind == KQ_Q4_K || kind == KQ_Q5_K) {
        int32_t * mins = (int32_t *) (wb + KQ_W_MINS);
        for (int p = 0; p < 4; p++) {
            mins[16 * p + r] = (int32_t) ((uint32_t) mn[2 * p] | ((uint32_t) mn[2 * p + 1] << 16));
        }
    }
    if (kind == KQ_Q4_K || kind == KQ_Q5_K || kind == KQ_Q2_K) {
        dd[16 + r] = d[1];
    }
}

static void pack_rows_kq(int64_t n, const uint8_t * w, uint64_t row_bytes, int64_t r0, int64_t r1, uint8_t * room,
                         const int kind) {
    const size_t bsize = kind == KQ_Q6_K ? sizeof(rm_block_q6_K) : kind == KQ_Q5_K ? sizeof(rm_block_q5_K)
                       : kind == KQ_IQ4_XS ? sizeof(rm_block_iq4_xs) : kind == KQ_IQ2_XXS ? sizeof(rm_block_iq2_xxs)
                       : kind == KQ_IQ3_XXS ? sizeof(rm_block_iq3_xxs) : kind == KQ_Q2_K ? sizeof(rm_block_q2_K)
                       : kind == KQ_Q3_K ? sizeof(rm_block_q3_K) : sizeof(rm_block_q4_K);
    if (r1 - r0 < RM_TILE_ROWS) {   /* rows past the matrix: all zero */
        memset(room, 0, (size_t) (n / RM_QK_K) * KQ_W_BYTES);
    }
    /* row by row, each read in order, the next one asked for ahead (the weights come from memory:
     * sixteen rows' streams at once are more than the hardware prefetchers follow) */
    const uint64_t used = (uint64_t) (n / RM_QK_K) * bsize;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t * next = w + (uint64_t) (r + 1) * row_bytes;
        for (uint64_t o = 0; o < used; o += 64) {
            __builtin_prefetch(next + o, 0, 3);
        }
        for (int64_t b = 0; b < n / RM_QK_K; b++) {
            uint8_t * wb = room + (uint64_t) b * KQ_W_BYTES;
            switch (kind) {   /* one inlined copy per type */
            case KQ_Q4_K: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_Q4_K); break;
            case KQ_Q5_K: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_Q5_K); break;
            case KQ_IQ4_XS: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_IQ4_XS); break;
            case KQ_IQ2_XXS: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_IQ2_XXS); break;
            case KQ_IQ3_XXS: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_IQ3_XXS); break;
            case KQ_Q2_K: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_Q2_K); break;
            case KQ_Q3_K: pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_Q3_K); break;
            default:      pack_row_kq(w + (uint64_t) r * row_bytes + (uint64_t) b * bsize, (int) (r - r0), wb, KQ_Q6_K); break;
            }
        }
    }
}

/* Tiles 0 and 1: the his' and the los' int32 dots (16 rows x 16 tokens) of a first group of 16
 * tokens, 2 and 3 those of a second; 4 and 5: 64 elements' his and los (16 rows x 64 bytes); 6
 * and 7: the two groups' activations (16 rows of 4 levels x 16 tokens). */
static void tile_configure_kq(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = RM_TILE_ROWS, cfg.colsb[t] = 64;
    }
    tile_load_config(&cfg);
}

/* Elements 64t.. of the super-block: his and los through tiles 4 and 5, once for both groups */
#define KQ_CHUNK(t, two)                                         \
    do {                                                         \
        _tile_loadd(4, wb + 1024 * (t), 64);                     \
        _tile_loadd(5, wb + KQ_W_LO + 1024 * (t), 64);           \
        _tile_loadd(6, xb[0] + 1024 * (t), 64);                  \
        _tile_dpbssd(0, 4, 6);                                   \
        _tile_dpbssd(1, 5, 6);                                   \
        if (two) {                                               \
            _tile_loadd(7, xb[1] + 1024 * (t), 64);              \
            _tile_dpbssd(2, 4, 7);                               \
            _tile_dpbssd(3, 5, 7);                               \
        }                                                        \
    } while (0)

/* kq_sum's float steps (simd_x86.h) for one group's super-block b: lane b mod 8 takes it */
RM_AMX_INLINE void kq_steps(__m512 acc[RM_TILE_ROWS][8], int32_t sums[2][RM_TILE_ROWS][TILE_TOKENS], const uint8_t * wb,
                            const uint8_t * xb, int64_t b, const int kind) {
    const int32_t * mins = (const int32_t *) (wb + KQ_W_MINS);
    const float * d = (const float *) (wb + KQ_W_D);
    const __m512 dx = _mm512_loadu_ps(xb + 4096);
    const int l = (int) (b % 8);
    if (kind == KQ_Q2_K) {   /* S from the los alone, M from the mins in the his' places */
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            const __m512 dxw = _mm512_mul_ps(_mm512_set1_ps(d[r]), dx), dxm = _mm512_mul_ps(_mm512_set1_ps(d[16 + r]), dx);
            acc[r][l] = _mm512_fmadd_ps(dxw, _mm512_cvtepi32_ps(_mm512_load_si512(sums[1][r])), acc[r][l]);
            acc[r][l] = _mm512_fnmadd_ps(dxm, _mm512_cvtepi32_ps(_mm512_load_si512(sums[0][r])), acc[r][l]);
        }
        return;
    }
    for (int r = 0; r < RM_TILE_ROWS; r++) {
        const __m512i sumi = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[0][r]), 7),
                                              _mm512_load_si512(sums[1][r]));
        __m512 f = _mm512_mul_ps(_mm512_set1_ps(d[r]), dx);
        if (kind == KQ_IQ2_XXS || kind == KQ_IQ3_XXS) {   /* d_x d_w step, in that order */
            f = _mm512_mul_ps(f, _mm512_set1_ps(kind == KQ_IQ2_XXS ? 0.125f : 0.25f));
        }
        acc[r][l] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sumi), acc[r][l]);
    }
    if (kind == KQ_Q4_K || kind == KQ_Q5_K) {   /* the mins */
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            __m512i summ = _mm512_setzero_si512();
            for (int p = 0; p < 4; p++) {
                summ = _mm512_add_epi32(summ, _mm512_madd_epi16(_mm512_set1_epi32(mins[16 * p + r]),
                                                                _mm512_loadu_si512(xb + 4160 + 64 * p)));
            }
            acc[r][l] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(d[16 + r]), dx), _mm512_cvtepi32_ps(summ), acc[r][l]);
        }
    }
}

/* One group of 16 tokens (two with `two`: each weight tile then serves both) against the packed
 * rows: out[g][r][c] */
RM_AMX_INLINE void tile_groups_kq(int64_t nsb, const uint8_t * room, const uint8_t * xg0, const uint8_t * xg1,
                                  float out[2][RM_TILE_ROWS][TILE_TOKENS], const int two, const int kind) {
    __m512 acc[2][RM_TILE_ROWS][8];   /* [group][row][super-block mod 8]: 16 tokens */
    int32_t sums[2][2][RM_TILE_ROWS][TILE_TOKENS] __attribute__((aligned(64)));
    for (int g = 0; g < 1 + two; g++) {
        for (int r = 0; r < RM_TILE_ROWS; r++) {
            for (int l = 0; l < 8; l++) {
                acc[g][r][l] = _mm512_setzero_ps();
            }
        }
    }
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t * wb = room + (uint64_t) b * KQ_W_BYTES;
        const uint8_t * xb[2] = {xg0 + (uint64_t) b * KQ_X_BYTES, two ? xg1 + (uint64_t) b * KQ_X_BYTES : NULL};
        _tile_zero(0);
        _tile_zero(1);
        if (two) {
            _tile_zero(2);
            _tile_zero(3);
        }
        KQ_CHUNK(0, two);
        KQ_CHUNK(1, two);
        KQ_CHUNK(2, two);
        KQ_CHUNK(3, two);
        _tile_stored(0, sums[0][0], TILE_TOKENS * 4);
        _tile_stored(1, sums[0][1], TILE_TOKENS * 4);
        if (two) {
            _tile_stored(2, sums[1][0], TILE_TOKENS * 4);
            _tile_stored(3, sums[1][1], TILE_TOKENS * 4);
        }
        for (int g = 0; g < 1 + two; g++) {
            kq_steps(acc[g], sums[g], wb, xb[g], b, kind);
        }
    }
    for (int g = 0; g < 1 + two; g++) {
        for (int r = 0; r < RM_TILE_ROWS; r++) {   /* hsum_ps's order: ((0+4) + (2+6)) + ((1+5) + (3+7)) */
            const __m512 even = _mm512_add_ps(_mm512_add_ps(acc[g][r][0], acc[g][r][4]), _mm512_add_ps(acc[g][r][2], acc[g][r][6]));
            const __m512 odd = _mm512_add_ps(_mm512_add_ps(acc[g][r][1], acc[g][r][5]), _mm512_add_ps(acc[g][r][3], acc[g][r][7]));
            _mm512_storeu_ps(out[g][r], _mm512_add_ps(even, odd));
        }
    }
}

RM_AMX_INLINE void matmul_kq(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                             int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate, const int kind) {
    const int64_t nsb = n / RM_QK_K;
    const uint64_t group_bytes = (uint64_t) nsb * KQ_X_BYTES;
    pack_rows_kq(n, w, row_bytes, r0, r1, room, kind);
    tile_configure_kq();
    for (int32_t i0 = 0; i0 < n_tok; i0 += 2 * TILE_TOKENS) {
        float out[2][RM_TILE_ROWS][TILE_TOKENS];
        const uint8_t * xg = (const uint8_t *) x_t + (uint64_t) (i0 / TILE_TOKENS) * group_bytes;
        if (n_tok - i0 > TILE_TOKENS) {
            tile_groups_kq(nsb, room, xg, xg + group_bytes, out, 1, kind);
            store_tile(out[1], i0 + TILE_TOKENS, n_tok, r0, r1, y, y_stride, accumulate);
        } else {
            tile_groups_kq(nsb, room, xg, NULL, out, 0, kind);
        }
        store_tile(out[0], i0, n_tok, r0, r1, y, y_stride, accumulate);
    }
    _tile_release();
}

#define RM_TILE_MATMUL_KQ(name, kind)                                                                              \
    static void name(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,            \
                     const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {  \
        matmul_kq(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, kind);                      \
    }
RM_TILE_MATMUL_KQ(matmul_q4_K, KQ_Q4_K)
RM_TILE_MATMUL_KQ(matmul_q5_K, KQ_Q5_K)
RM_TILE_MATMUL_KQ(matmul_q6_K, KQ_Q6_K)
RM_TILE_MATMUL_KQ(matmul_iq4_xs, KQ_IQ4_XS)
RM_TILE_MATMUL_KQ(matmul_iq2_xxs, KQ_IQ2_XXS)
RM_TILE_MATMUL_KQ(matmul_iq3_xxs, KQ_IQ3_XXS)
RM_TILE_MATMUL_KQ(matmul_q2_K, KQ_Q2_K)
RM_TILE_MATMUL_KQ(matmul_q3_K, KQ_Q3_K)

/* The fewest tokens that pay. Against the AVX-512 one-row prefill form (tools/bench_kernels.py
 * --compare avx512,amx, rows of 2048): Q8_0/Q4_0 break even at 12 tokens and win from 16; with the
 * scales folded into the levels, Q4_K, IQ4_XS, IQ2_XXS and IQ3_XXS won from 8, Q5_K and Q6_K from
 * 10, Q2_K and Q3_K from 8. Fewer tokens now go to the AVX-512 set's tiles (rm_cpu_tile_below),
 * which beat these up to about 32 tokens (ps per weight and token, AVX-512 tile against AMX, a Xeon
 * VM): Q4_K 18.1 / 32.1 at 8, 10.3 / 12.8 at 24, 9.2 / 7.7 at 32; IQ3_XXS 21.5 / 31.1 at 8, 10.0 /
 * 10.7 at 24; Q5_K 8.6 / 11.0, IQ4_XS 8.4 / 8.8 at 24; IQ2_XXS and Q2_K even to 1.1-1.4x in AMX's
 * favour at 16; Q6_K even from 8 on. A 512-token prefill with these (AMX set): the Q4_K_M file 797,
 * 802 -> 817, 832 tok/s, Q5_K_M 811, 795 -> 818, 817, Q3_K_M 890, 883 -> 891, 903, the IQ2_XXS
 * mix 867, 882 -> 899, 868. */
static const rm_tile_kernels tile_q8_0 = {16, 1, usable_32, act_bytes_32, put_group_32, room_bytes_32, matmul_q8_0, 0};
static const rm_tile_kernels tile_q4_0 = {16, 1, usable_32, act_bytes_32, put_group_32, room_bytes_32, matmul_q4_0, 1};
static const rm_tile_kernels tile_q4_K = {32, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_q4_K, 0};
static const rm_tile_kernels tile_q5_K = {32, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_q5_K, 0};
static const rm_tile_kernels tile_q6_K = {10, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_q6_K, 0};
static const rm_tile_kernels tile_iq4_xs = {32, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_iq4_xs, 0};
static const rm_tile_kernels tile_iq2_xxs = {16, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_iq2_xxs, 0};
static const rm_tile_kernels tile_iq3_xxs = {32, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_iq3_xxs, 0};
static const rm_tile_kernels tile_q2_K = {16, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_q2_K, 0};
static const rm_tile_kernels tile_q3_K = {32, 1, usable_kq, act_bytes_kq, put_group_kq, room_bytes_kq, matmul_q3_K, 0};

const rm_cpu_kernels rm_cpu_kernels_amx = {
    .tile = {
        [RM_TYPE_Q4_0] = &tile_q4_0,
        [RM_TYPE_Q8_0] = &tile_q8_0,
        [RM_TYPE_Q4_K] = &tile_q4_K,
        [RM_TYPE_Q5_K] = &tile_q5_K,
        [RM_TYPE_Q6_K] = &tile_q6_K,
        [RM_TYPE_IQ4_XS] = &tile_iq4_xs,
        [RM_TYPE_IQ2_XXS] = &tile_iq2_xxs,
        [RM_TYPE_IQ3_XXS] = &tile_iq3_xxs,
        [RM_TYPE_Q2_K] = &tile_q2_K,
        [RM_TYPE_Q3_K] = &tile_q3_K,
    },
};

#endif /* RM_AMX */
