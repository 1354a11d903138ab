/* dispatch.h - internal: which SIMD kernel set the CPU backend runs, chosen once per process.
 *
 * Each instruction set has its own source file (cpu/vec_dot_avx2.c, cpu/vec_dot_avx512.c, which
 * share cpu/simd_x86.h, and cpu/matmul_amx.c), compiled with that set's flags and exporting one
 * table of kernels by ggml type id. At first use the CPU is
 * probed (cpuid, and xgetbv for the register state the OS saves; for AMX, the kernel's grant of
 * the tile state) and the best set this build and this CPU both have is chosen;
 * RAPIDMOE_ISA=scalar|avx2|avx512|amx asks for another. A lookup falls
 * through to the next set down when a set lacks a kernel, ending at the scalar reference, which
 * always exists. */
#ifndef RM_CPU_DISPATCH_H
#define RM_CPU_DISPATCH_H

#include "types.h"
#include "gdn.h"

typedef enum rm_isa {
    RM_ISA_SCALAR = 0,            /* the reference kernels of quants_ref.c */
    RM_ISA_AVX2   = 1,            /* AVX2 + FMA + F16C */
    RM_ISA_AVX512 = 2,            /* AVX-512 F/BW/VL/DQ + VNNI, on top of AVX2 */
    RM_ISA_AMX    = 3,            /* AMX-TILE + AMX-INT8 prefill tiles, on top of AVX-512 */
    RM_ISA_COUNT
} rm_isa;

/* What the kernels for Q8_0 activations would otherwise recompute for every weight row, computed
 * once per matrix product (rm_q8_0_act_info): for each token, the scale of each 32-element block
 * as a float, then the sum of each block's levels (an integer, held exactly as a float). */
void rm_q8_0_act_info(const void * x_q, int64_t n, float * info);   /* 2 * n / 32 floats */

/* The most tokens one multi-token kernel call takes (vec_dot_multi: 1 to RM_MULTI_MAX; the
 * prefill form's dot: 1, 4 or RM_MULTI_MAX). */
#define RM_MULTI_MAX 8

/* Tokens per group of the tile form's activations (rm_tile_kernels.put_group). */
#define RM_TILE_TOKENS 16

/* Weight rows per tile of the tile forms (rm_tile_kernels) and of the stored tiles (repack_tile). */
#define RM_TILE_ROWS 16

/* out[c] = dot(w, token c) for nc tokens (1 to 8) whose activations lie x_stride bytes apart, one
 * weight row unpacked once for all of them. x_info: rm_q8_0_act_info's floats for those tokens,
 * x_info_stride floats apart, or NULL (the kernel works without; types with other activation
 * types ignore it). Each out[c] is bit for bit what vec_dot gives for that token alone. */
typedef void (*rm_vec_dot_multi_fn)(int64_t n, int nc, float * out, const void * w, const void * x_q,
                                    uint64_t x_stride, const float * x_info, int64_t x_info_stride);

/* The backend takes the prefill form below from this many tokens on. */
#define RM_PACK_MIN_TOKENS 8

/* The prefill form of a multi-token kernel, for weights that meet many tokens: each weight row
 * is packed once (pack_row) and each token's activations are transposed once per product
 * (transpose_act), after which a group of eight blocks' integer dots comes out of eight
 * multiply-adds with no horizontal adds. dot: out[c] = dot(row, token c) for nc tokens (1, 4 or
 * 8), from the packed row (and the raw row w, for blocks that do not fill a group), the
 * transposed activations x_t (xt_stride bytes apart; a token's blocks past its last whole group
 * follow the groups as they are) and their x_info (required). Each out[c] is bit for bit vec_dot's
 * for that token. */
typedef struct rm_packed_kernels {
    /* NULL in a set that has the stored form below alone (pack_row, dot, unpack_stored too) */
    uint64_t (*packed_bytes)(int64_t n);                 /* one packed row of n weights */
    uint64_t (*act_bytes)(int64_t n);                    /* one token's transposed activations */
    void (*pack_row)(int64_t n, const void * w, void * packed);
    void (*transpose_act)(int64_t n, const void * x_q, void * x_t);
    void (*dot)(int64_t n, int nc, float * out, const void * packed, const void * w, const void * x_t,
                uint64_t xt_stride, const float * x_info, int64_t x_info_stride);
    /* Optional: a layout for rows kept packed in memory (repack.h, made once at load), the same
     * bytes per row as the type's own (rows of a whole number of groups, unless stored_tail).
     * repack_row converts a row; dot_stored is dot for such a row (no raw row needed), bit for bit. */
    void (*repack_row)(int64_t n, const void * w, void * stored);
    void (*unpack_stored)(int64_t n, const void * stored, void * packed);   /* stored row -> pack_row's form */
    void (*dot_stored)(int64_t n, int nc, float * out, const void * stored, const void * x_t, uint64_t xt_stride,
                       const float * x_info, int64_t x_info_stride);
    /* 1: rows that end inside a group are stored too, their last blocks as the file has them, at
     * the same offsets (the form's w may then be the stored row); 0: rows of whole groups only */
    int32_t stored_tail;
    /* Optional, instead of repack_row and dot_stored: a layout of RM_TILE_ROWS rows to a tile (the
     * same bytes as those rows; matrices of a whole number of tiles). repack_tile converts the
     * RM_TILE_ROWS rows at w (row_bytes apart); dot_tile gives out[c][r] for row r of the tile and
     * nc tokens (1 to RM_MULTI_MAX; transpose_act's rows, xt_stride bytes apart), bit for bit the
     * one-token kernel's. The tile form reads such matrices too (rm_tile_kernels.reads_stored). */
    void (*repack_tile)(int64_t n, const void * w, uint64_t row_bytes, void * stored);
    void (*dot_tile)(int64_t n, int nc, float out[][RM_TILE_ROWS], const void * stored, const void * x_t,
                     uint64_t xt_stride);
} rm_packed_kernels;

/* Whether pk's forms take a product of n_tok tokens on rows of n weights: rows stored packed
 * (`stored`) with fewer than RM_PACK_MIN_TOKENS tokens are read as they are (dot_stored); from
 * RM_PACK_MIN_TOKENS tokens on each row is packed per product (unpack_stored or pack_row, then
 * dot). Every form needs a whole group of eight blocks. */
static inline int rm_packed_form_runs(const rm_packed_kernels * pk, int64_t n, int64_t n_tok, int stored) {
    if (n < 8 * RM_QK) {
        return 0;
    }
    if (stored && n_tok < RM_PACK_MIN_TOKENS) {
        return pk->dot_stored != NULL || pk->dot_tile != NULL;
    }
    return n_tok >= RM_PACK_MIN_TOKENS && pk->dot != NULL && (stored ? pk->unpack_stored != NULL : pk->pack_row != NULL);
}

/* The tile form of a matrix product (AMX): weights RM_TILE_ROWS rows at a time against every
 * token of the product, the tokens in groups of RM_TILE_TOKENS laid out once per product
 * (put_group, a group at a time as its tokens are quantized). With `exact`, each output is bit for bit
 * what the set below's vec_dot gives for that row and token, so prefill and decode see the same
 * numbers; the CPU backend takes no other tiles. Used for rows of n with usable(n) and from
 * min_tokens tokens on. */
typedef struct rm_tile_kernels {
    int32_t  min_tokens;
    int32_t  exact;
    int      (*usable)(int64_t n);
    uint64_t (*act_bytes)(int64_t n, int32_t n_tok);          /* the product's activations, laid out */
    /* tokens i0 .. i0 + count - 1 (i0 a multiple of 16, count at most 16; token i0 + c's quantized
     * row at x_q + c * x_stride) into their group of the layout at x_t, the group's places past
     * them cleared */
    void     (*put_group)(int64_t n, const void * x_q, uint64_t x_stride, int32_t i0, int32_t count, void * x_t);
    uint64_t (*room_bytes)(int64_t n);                        /* a thread's room for RM_TILE_ROWS packed rows */
    /* y[i * y_stride + r] (+)= dot(row r, token i) for rows r0..r1 (at most RM_TILE_ROWS) of w
     * (row_bytes apart) and the n_tok tokens of x_t. stored: w holds the rows in the set below's
     * stored layout (rm_packed_kernels.repack_row), which the type then has. */
    void     (*matmul)(int64_t n, const void * w, int stored, uint64_t row_bytes, int64_t r0, int64_t r1,
                       const void * x_t, int32_t n_tok, void * room, float * y, int64_t y_stride, int accumulate);
    /* 1: matmul reads rows in the stored layout too; a type whose tiles do not is never stored
     * (rm_cpu_stored_isa) */
    int32_t  reads_stored;
} rm_tile_kernels;

/* Decode streams each weight row from memory once. The hardware prefetchers alone keep too few
 * lines in flight for the 4-bit kernels (one thread streamed Q4_K at 4.9 GB/s against Q8_0's 12),
 * so a one-token loop asks for the row RM_PREFETCH_AHEAD bytes ahead of the one it computes, a
 * line at a time: that row is in cache by the time the kernel reaches it. Prefetches past the
 * end of the weights are hints and never fault. */
#define RM_PREFETCH_AHEAD 2048

static inline void rm_prefetch_row_ahead(const void * row, uint64_t row_bytes) {
    const char * p = (const char *) row + RM_PREFETCH_AHEAD;
    for (uint64_t o = 0; o < row_bytes; o += 64) {
        __builtin_prefetch(p + o, 0, 3);
    }
}

/* Better still, a one-token kernel asks for the bytes RM_PREFETCH_AHEAD ahead of each step's
 * weights as it takes the step: the requests then go out at the pace the data is used instead of
 * a row's worth at once, which fills the line-fill buffers and stalls (a Q8_0 matrix of 70 MB,
 * two threads: 28 GB/s with a burst per row, 34 GB/s spread, a plain read 37). Kernels that do
 * so are marked in rm_cpu_kernels.streams; the backend skips its burst for one token to them
 * (rm_cpu_row_burst_isa). */
static inline void rm_stream_ahead(const void * step, int bytes) {
    const char * p = (const char *) step + RM_PREFETCH_AHEAD;
    for (int o = 0; o < bytes; o += 64) {
        __builtin_prefetch(p + o, 0, 3);
    }
}

/* y[i] += a * x[i] for n floats */
typedef void (*rm_axpy_fn)(int64_t n, float a, const float * x, float * y);

/* Attention's two halves for one query row of d floats against n cached positions, rows
 * `stride` floats apart: scores s[p] = scale * dot(q, k_p), and out = sum_p s[p] v_p (the sum
 * runs over p in order, each step a multiply-add; it starts from 0, or with `accumulate` from
 * out's values, so a sum taken in blocks of positions is the same floats as one in one go). */
typedef void (*rm_attn_scores_fn)(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale,
                                  float * s);
typedef void (*rm_attn_values_fn)(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                                  int accumulate);

/* The same for nr query rows at once (1 to RM_ATTN_ROWS_AT_ONCE): the sets read each key and value
 * once for all the rows, from registers. A score's floats depend on its row and key alone, not on
 * n nor on the other rows (the reference's and the sets' alike; the sets' may differ from their
 * one-row kernel's in the last bits); values are the one-row kernel's, always accumulating into
 * out[r]. Scores of row r go to s + r * s_stride. */
#define RM_ATTN_ROWS_AT_ONCE 3
typedef void (*rm_attn_scores_rows_fn)(int64_t d, int64_t n, int nr, const float * const q[], const float * k,
                                       int64_t stride, float scale, float * s, int64_t s_stride);
typedef void (*rm_attn_values_rows_fn)(int64_t d, int64_t n, int nr, const float * s, int64_t s_stride, const float * v,
                                       int64_t stride, float * const out[]);

/* Attention's exponentials of one tile of scores: x[j] = exp(x[j] - m) in place (x[j] <= m), and
 * their sum, as rm_cpu_exp_sum_ref computes them to float rounding (the sets take exp in vectors
 * and add in lanes). */
typedef float (*rm_exp_sum_fn)(float * x, int64_t n, float m);

/* The largest of m and x[0..n) (a NaN in x passed over, as `x[j] > m ? x[j] : m` does): exact, so
 * every set gives the reference's float. */
typedef float (*rm_max_fn)(const float * x, int64_t n, float m);

/* The Gated DeltaNet layer's delta rule and causal conv, as rm_gdn_rule and rm_gdn_conv (cpu/gdn.h,
 * their scalar twins) compute them, to float rounding. */
typedef void (*rm_gdn_rule_fn)(const rm_gdn_head * h, int32_t pos, float * state, float * scratch);
typedef void (*rm_gdn_conv_fn)(float * out, const float * x, int32_t n_tok, int64_t n_ch, int64_t stride,
                               float * state, const float * w, int32_t d_conv);

/* One instruction set's kernels, by ggml type id; NULL where the set has none. */
typedef struct rm_cpu_kernels {
    rm_vec_dot_fn       vec_dot[RM_TYPE_COUNT];        /* same contract as rm_type_traits.vec_dot */
    rm_vec_dot_multi_fn vec_dot_multi[RM_TYPE_COUNT];  /* optional: several tokens at once */
    rm_from_float_fn    quantize[RM_TYPE_COUNT];       /* activation quantizers (Q8_0, Q8_K): the
                                                          same bytes as the reference from_float */
    rm_to_float_fn      dequantize[RM_TYPE_COUNT];     /* optional (F16: the KV cache's reads): the
                                                          same floats as the reference to_float */
    rm_axpy_fn          axpy;
    rm_attn_scores_fn   attn_scores;
    rm_attn_values_fn   attn_values;
    rm_attn_scores_rows_fn attn_scores_rows;
    rm_attn_values_rows_fn attn_values_rows;
    rm_exp_sum_fn       exp_sum;
    rm_max_fn           max_of;
    const rm_packed_kernels * packed[RM_TYPE_COUNT];   /* optional: the prefill form */
    const rm_tile_kernels *   tile[RM_TYPE_COUNT];     /* optional: the tile form (AMX) */
    uint8_t             streams[RM_TYPE_COUNT];        /* 1: the type's one-token kernels (vec_dot,
                                                          vec_dot_multi with one token, the stored
                                                          form's dot) prefetch ahead themselves
                                                          (rm_stream_ahead) */
    rm_gdn_rule_fn      gdn_rule;
    rm_gdn_conv_fn      gdn_conv;
} rm_cpu_kernels;

#if defined(RM_X86)
extern const rm_cpu_kernels rm_cpu_kernels_avx2;
extern const rm_cpu_kernels rm_cpu_kernels_avx512;
#endif
#if defined(RM_AMX)
extern const rm_cpu_kernels rm_cpu_kernels_amx;
#endif

const char * rm_isa_name(rm_isa isa);
int          rm_isa_parse(const char * name, rm_isa * out);   /* 1 on success */
rm_isa       rm_isa_best(void);                               /* the best this CPU and build run */
rm_isa       rm_isa_active(void);                             /* the set in use (first call decides) */
/* The set to use on a CPU (cpuid's vendor string, family and model) whose best set by its flags is
 * best: best, or a lower set where ISA_RULES (dispatch.c) measured that one faster, with *why
 * saying so (else NULL). */
rm_isa       rm_isa_preferred(const char * vendor, uint32_t family, uint32_t model, rm_isa best, const char ** why);

/* Whether the AVX2 set's kernels may use AVX-VNNI (vpdpbusd in its VEX form: Intel Core from
 * Alder Lake, AMD Zen 5): cpuid leaf 7.1 EAX bit 4, unless RAPIDMOE_AVX_VNNI=0. Decided once. */
int          rm_cpu_avx_vnni(void);

/* The kernels of `isa` (falling back to lower sets, then the reference) for a type. */
rm_vec_dot_fn       rm_cpu_vec_dot_isa(rm_isa isa, int32_t type);
rm_vec_dot_multi_fn rm_cpu_vec_dot_multi_isa(rm_isa isa, int32_t type);   /* NULL: none, use vec_dot */
rm_from_float_fn    rm_cpu_quantize_isa(rm_isa isa, int32_t type);
rm_to_float_fn      rm_cpu_dequantize_isa(rm_isa isa, int32_t type);
rm_axpy_fn          rm_cpu_axpy_isa(rm_isa isa);
rm_attn_scores_fn   rm_cpu_attn_scores_isa(rm_isa isa);
rm_attn_values_fn   rm_cpu_attn_values_isa(rm_isa isa);
rm_exp_sum_fn       rm_cpu_exp_sum_isa(rm_isa isa);
rm_max_fn           rm_cpu_max_isa(rm_isa isa);
rm_attn_scores_rows_fn rm_cpu_attn_scores_rows_isa(rm_isa isa);
rm_attn_values_rows_fn rm_cpu_attn_values_rows_isa(rm_isa isa);
rm_gdn_rule_fn      rm_cpu_gdn_rule_isa(rm_isa isa);   /* the twins where a set has none */
rm_gdn_conv_fn      rm_cpu_gdn_conv_isa(rm_isa isa);
/* The plain twins (float_ref.c), what the sets above fall back to. */
void rm_cpu_axpy_ref(int64_t n, float a, const float * x, float * y);
void rm_cpu_attn_scores_ref(int64_t d, int64_t n, const float * q, const float * k, int64_t stride, float scale, float * s);
void rm_cpu_attn_values_ref(int64_t d, int64_t n, const float * s, const float * v, int64_t stride, float * out,
                            int accumulate);
float rm_cpu_exp_sum_ref(float * x, int64_t n, float m);
float rm_cpu_max_ref(const float * x, int64_t n, float m);
void rm_cpu_attn_scores_rows_ref(int64_t d, int64_t n, int nr, const float * const q[], const float * k, int64_t stride,
                                 float scale, float * s, int64_t s_stride);
void rm_cpu_attn_values_rows_ref(int64_t d, int64_t n, int nr, const float * s, int64_t s_stride, const float * v,
                                 int64_t stride, float * const out[]);
/* The prefill form of `isa`'s own kernel for a type (no fall-through: it must pair with that
 * set's vec_dot); NULL: none. */
const rm_packed_kernels * rm_cpu_packed_isa(rm_isa isa, int32_t type);
/* The packed kernels of set isa when they keep matrices of n_rows rows of n weights of type in
 * their stored layout (repack_row: rows of at least one group of eight blocks, of whole groups
 * unless stored_tail; repack_tile: whole super-blocks, whole tiles of rows; never where the set's
 * tiles read the file's layout only), else NULL: such matrices are read as the file has them. */
const rm_packed_kernels * rm_cpu_stored_isa(rm_isa isa, int32_t type, int64_t n, int64_t n_rows);
/* The tile form of `isa`'s own set for a type (no fall-through); NULL: none. */
const rm_tile_kernels *   rm_cpu_tile_isa(rm_isa isa, int32_t type);
/* The tile form of the nearest set below `isa` that has one for a type, where `isa` runs that
 * set's one-token kernel for it (so its tiles give `isa`'s floats: the AMX set's are the AVX-512
 * set's); NULL: none. */
const rm_tile_kernels *   rm_cpu_tile_below_isa(rm_isa isa, int32_t type);
/* The tile form for a product of n_tok tokens: `isa`'s own from its min_tokens on, else the one
 * below from its min_tokens (the AMX set's IQ2_XXS tiles from 16 tokens, the AVX-512 set's from
 * 2); NULL: the one-token kernels. */
const rm_tile_kernels *   rm_cpu_tile_for_isa(rm_isa isa, int32_t type, int64_t n_tok);
/* The most room one thread needs for any tile kernel `isa` runs (its own and those below) on
 * rows of up to n (0: none). */
uint64_t                  rm_cpu_tile_room_isa(rm_isa isa, int64_t n);
/* Whether the one-token kernels `isa` runs for a type prefetch ahead themselves. */
int                       rm_cpu_streams_isa(rm_isa isa, int32_t type);
/* Whether a product of n_tok tokens streaming weights of a type asks for each row ahead in a burst
 * (rm_prefetch_row_ahead): one to three tokens, unless it is one token to a kernel that streams. */
static inline int rm_cpu_row_burst_isa(rm_isa isa, int32_t type, int64_t n_tok) {
    return n_tok < 4 && !(n_tok == 1 && rm_cpu_streams_isa(isa, type));
}

/* The same for the set in use: what the CPU backend calls. */
static inline rm_vec_dot_fn       rm_cpu_vec_dot(int32_t t)       { return rm_cpu_vec_dot_isa(rm_isa_active(), t); }
static inline rm_vec_dot_multi_fn rm_cpu_vec_dot_multi(int32_t t) { return rm_cpu_vec_dot_multi_isa(rm_isa_active(), t); }
static inline rm_from_float_fn    rm_cpu_quantize(int32_t t)      { return rm_cpu_quantize_isa(rm_isa_active(), t); }
static inline rm_to_float_fn      rm_cpu_dequantize(int32_t t)    { return rm_cpu_dequantize_isa(rm_isa_active(), t); }
static inline rm_axpy_fn          rm_cpu_axpy(void)               { return rm_cpu_axpy_isa(rm_isa_active()); }
static inline rm_attn_scores_fn   rm_cpu_attn_scores(void)        { return rm_cpu_attn_scores_isa(rm_isa_active()); }
static inline rm_attn_values_fn   rm_cpu_attn_values(void)        { return rm_cpu_attn_values_isa(rm_isa_active()); }
static inline rm_exp_sum_fn       rm_cpu_exp_sum(void)            { return rm_cpu_exp_sum_isa(rm_isa_active()); }
static inline rm_max_fn           rm_cpu_max(void)                { return rm_cpu_max_isa(rm_isa_active()); }
static inline rm_attn_scores_rows_fn rm_cpu_attn_scores_rows(void) { return rm_cpu_attn_scores_rows_isa(rm_isa_active()); }
static inline rm_attn_values_rows_fn rm_cpu_attn_values_rows(void) { return rm_cpu_attn_values_rows_isa(rm_isa_active()); }
static inline rm_gdn_rule_fn      rm_cpu_gdn_rule(void)           { return rm_cpu_gdn_rule_isa(rm_isa_active()); }
static inline rm_gdn_conv_fn      rm_cpu_gdn_conv(void)           { return rm_cpu_gdn_conv_isa(rm_isa_active()); }
static inline const rm_packed_kernels * rm_cpu_packed(int32_t t)  { return rm_cpu_packed_isa(rm_isa_active(), t); }
static inline const rm_tile_kernels *   rm_cpu_tile(int32_t t)    { return rm_cpu_tile_isa(rm_isa_active(), t); }
static inline const rm_tile_kernels *   rm_cpu_tile_below(int32_t t) { return rm_cpu_tile_below_isa(rm_isa_active(), t); }
static inline const rm_tile_kernels *   rm_cpu_tile_for(int32_t t, int64_t n_tok) {
    return rm_cpu_tile_for_isa(rm_isa_active(), t, n_tok);
}
/* Rows r0..r1 of w (row_bytes apart) into pk's stored layout at the same offsets of `stored` (r0
 * and r1 whole tiles where pk keeps tiles). */
void rm_cpu_repack_rows(const rm_packed_kernels * pk, int64_t n, const void * w, uint64_t row_bytes, int64_t r0,
                        int64_t r1, void * stored);
/* y[c * y_stride + r] (+)= dot(stored row r, token c) for rows r0..r1 of a stored matrix and nc
 * tokens (1 to RM_MULTI_MAX) of x_t (xt_stride bytes apart, with their x_info), row by row
 * (dot_stored) or tile by tile (dot_tile: each tile the rows touch, whole). */
void rm_cpu_dot_stored(const rm_packed_kernels * pk, int64_t n, int nc, const uint8_t * stored, uint64_t row_bytes,
                       int64_t r0, int64_t r1, const uint8_t * x_t, uint64_t xt_stride, const float * x_info,
                       int64_t x_info_stride, float * y, int64_t y_stride, int accumulate);

static inline const rm_packed_kernels * rm_cpu_stored(int32_t t, int64_t n, int64_t n_rows) {
    return rm_cpu_stored_isa(rm_isa_active(), t, n, n_rows);
}

#endif
