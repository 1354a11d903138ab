/* matmul_amx.c - the AMX set: prefill matrix products on the tile registers (AMX-TILE, AMX-INT8).
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
 * (vec_dot, decode, the other types) is the AVX-512 set's: dispatch.c falls through.
 *
 * Layouts. A thread's room holds RM_TILE_ROWS rows unpacked: per block, the 16 rows' 32 signed
 * levels (512 bytes, Q4_0's nibbles less 8) and their 16 scales as floats (64 bytes), rows past
 * the matrix zero. The activations of a product: per group of 16 tokens and per block, the
 * levels in the tile's pairing (dword j of token c at 64 j + 4 c: 512 bytes), then the 16 token
 * scales as floats (64 bytes); places past the last token are zero. Both are 576 bytes per block,
 * 18 bytes per weight or activation: made per product, nothing is kept at load.
 *
 * Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags (CMakeLists.txt), only where the
 * compiler has them (RM_AMX); chosen only where cpuid, XCR0 and the kernel's grant of the tile
 * state all say yes (dispatch.c).
 */
#if defined(RM_AMX)

#include <immintrin.h>
#include <string.h>

#include "dispatch.h"

#define TILE_BLOCK_BYTES 576   /* one block of RM_TILE_ROWS rows or 16 tokens: 512 levels + 64 scale bytes */
#define TILE_TOKENS 16

/* The tile configuration (palette 1): tile 0 the int32 sums (16 rows x 16 tokens), tile 1 the
 * weights (16 rows x 32 levels), tile 2 the activations (8 rows of 4 levels x 16 tokens). */
typedef struct tile_config {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} tile_config;

static void tile_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    cfg.rows[0] = RM_TILE_ROWS, cfg.colsb[0] = TILE_TOKENS * 4;
    cfg.rows[1] = RM_TILE_ROWS, cfg.colsb[1] = RM_QK;
    cfg.rows[2] = RM_QK / 4, cfg.colsb[2] = TILE_TOKENS * 4;
    _tile_loadconfig(&cfg);
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

/* Rows r0..r1 (at most RM_TILE_ROWS) unpacked into the room, block by block. */
static void pack_rows_32(int64_t n, const uint8_t * w, uint64_t row_bytes, int64_t r0, int64_t r1, uint8_t * room,
                         const int kind) {
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

static void matmul_32(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                      int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate, const int kind) {
    const int64_t nb = n / RM_QK;
    pack_rows_32(n, w, row_bytes, r0, r1, room, kind);
    tile_configure();
    for (int32_t i0 = 0; i0 < n_tok; i0 += TILE_TOKENS) {
        float out[RM_TILE_ROWS][TILE_TOKENS];
        tile_group_32(nb, room, (const uint8_t *) x_t + (uint64_t) (i0 / TILE_TOKENS) * (uint64_t) nb * TILE_BLOCK_BYTES,
                      out);
        const int nc = n_tok - i0 < TILE_TOKENS ? n_tok - i0 : TILE_TOKENS;
        for (int c = 0; c < nc; c++) {
            float * yc = y + (int64_t) (i0 + c) * y_stride;
            for (int64_t r = r0; r < r1; r++) {
                yc[r] = accumulate ? yc[r] + out[r - r0][c] : out[r - r0][c];
            }
        }
    }
    _tile_release();
}

static void matmul_q8_0(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                        int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {
    matmul_32(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, Q8_0_LEVELS);
}

static void matmul_q4_0(int64_t n, const void * w, uint64_t row_bytes, int64_t r0, int64_t r1, const void * x_t,
                        int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate) {
    matmul_32(n, w, row_bytes, r0, r1, x_t, n_tok, room, y, y_stride, accumulate, Q4_0_LEVELS);
}

/* From 16 tokens on: one group fills the tile's 16 columns. */
static const rm_tile_kernels tile_q8_0 = {16, usable_32, act_bytes_32, put_act_32, room_bytes_32, matmul_q8_0};
static const rm_tile_kernels tile_q4_0 = {16, usable_32, act_bytes_32, put_act_32, room_bytes_32, matmul_q4_0};

const rm_cpu_kernels rm_cpu_kernels_amx = {
    .tile = {
        [RM_TYPE_Q4_0] = &tile_q4_0,
        [RM_TYPE_Q8_0] = &tile_q8_0,
    },
};

#endif /* RM_AMX */
