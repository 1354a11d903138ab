/* types.h - internal: ggml block layouts, fp16/bf16 conversion and the type-traits table.
 *
 * Every quant type is a run of fixed-size blocks. The structs below are the byte layouts ggml
 * writes into GGUF files (ggml-common.h), field for field; the _Static_asserts pin their sizes.
 * A row of n elements of a type is n / block_elems blocks, back to back.
 */
#ifndef RM_TYPES_H
#define RM_TYPES_H

#include <stdint.h>
#include <string.h>

#include "rapidmoe.h"

#define RM_QK    32   /* elements per block of Q4_0 .. Q8_1 */
#define RM_QK_K 256   /* elements per super-block of the K-quants */

typedef uint16_t rm_fp16;  /* IEEE 754 binary16, as bits */
typedef uint16_t rm_bf16;  /* bfloat16: the top half of a binary32, as bits */

/* x = d * (q - 8); low nibbles hold elements 0..15, high nibbles 16..31 */
typedef struct { rm_fp16 d; uint8_t qs[RM_QK / 2]; } rm_block_q4_0;
/* x = d * q + m */
typedef struct { rm_fp16 d, m; uint8_t qs[RM_QK / 2]; } rm_block_q4_1;
/* x = d * (q - 16); qh holds bit 4 of element j in bit j */
typedef struct { rm_fp16 d; uint8_t qh[4]; uint8_t qs[RM_QK / 2]; } rm_block_q5_0;
/* x = d * q + m */
typedef struct { rm_fp16 d, m; uint8_t qh[4]; uint8_t qs[RM_QK / 2]; } rm_block_q5_1;
/* x = d * q */
typedef struct { rm_fp16 d; int8_t qs[RM_QK]; } rm_block_q8_0;
/* x = d * q; s = d * sum(q), which lets Q4_1/Q5_1 dots apply their offset m in one multiply */
typedef struct { rm_fp16 d, s; int8_t qs[RM_QK]; } rm_block_q8_1;

/* 16 sub-blocks of 16: x = d * sc * q - dmin * m, with (sc, m) the low and high nibble of
 * scales[j]; q is 2 bits, qs[32*h + l] holds element 128*h + 32*g + l in bits 2g..2g+1 */
typedef struct {
    uint8_t scales[RM_QK_K / 16];
    uint8_t qs[RM_QK_K / 4];
    rm_fp16 d, dmin;
} rm_block_q2_K;

/* 16 sub-blocks of 16: x = d * (sc - 32) * (q - 4), sc 6 bits, q = 2 low bits (laid out as in
 * Q2_K) plus a high bit (hmask[l] bit g holds element 32*g + l); a clear high bit means q - 4 < 0 */
typedef struct {
    uint8_t hmask[RM_QK_K / 8];
    uint8_t qs[RM_QK_K / 4];
    uint8_t scales[12];
    rm_fp16 d;
} rm_block_q3_K;

/* 8 sub-blocks of 32: x = d * sc * q - dmin * m, (sc, m) 6 bits each packed in scales[12];
 * qs[32*p + l] holds element 64*p + l in its low nibble and 64*p + 32 + l in its high nibble */
typedef struct {
    rm_fp16 d, dmin;
    uint8_t scales[12];
    uint8_t qs[RM_QK_K / 2];
} rm_block_q4_K;

/* Q4_K plus a fifth bit: qh[l] bit 2p holds element 64*p + l, bit 2p+1 element 64*p + 32 + l */
typedef struct {
    rm_fp16 d, dmin;
    uint8_t scales[12];
    uint8_t qh[RM_QK_K / 8];
    uint8_t qs[RM_QK_K / 2];
} rm_block_q5_K;

/* 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q 6 bits = 4 in ql and 2 in qh */
typedef struct {
    uint8_t ql[RM_QK_K / 2];
    uint8_t qh[RM_QK_K / 4];
    int8_t  scales[RM_QK_K / 16];
    rm_fp16 d;
} rm_block_q6_K;

/* The K-quants' activation type: x = d * q, with the sums of each 16 q's precomputed */
typedef struct {
    float   d;
    int8_t  qs[RM_QK_K];
    int16_t bsums[RM_QK_K / 16];
} rm_block_q8_K;

/* The IQ types. Their levels come from codebooks (iq_grids.h, generated from gguf-py) rather
 * than from a linear formula: an index picks one non-linear level (IQ4) or a whole group of 4 or
 * 8 levels (IQ2/IQ3), and 7 stored sign bits per 8 weights give the signs (rm_iq_ksigns). */

/* x = d * values[q], values the 16 levels rm_iq4nl_values; nibbles as in Q4_0 */
typedef struct { rm_fp16 d; uint8_t qs[RM_QK / 2]; } rm_block_iq4_nl;

/* 8 sub-blocks of 32: x = d * (sc - 32) * values[q], sc 6 bits = the sub-block's nibble of
 * scales_l plus 2 bits of scales_h (bits 2j..2j+1); qs[16*j + l] holds element 32*j + l in its
 * low nibble and 32*j + 16 + l in its high one */
typedef struct {
    rm_fp16  d;
    uint16_t scales_h;
    uint8_t  scales_l[RM_QK_K / 64];
    uint8_t  qs[RM_QK_K / 2];
} rm_block_iq4_xs;

/* 8 sub-blocks of 32, each two uint32 words: the first holds 4 byte indices into
 * rm_iq2xxs_grid (8 levels each), the second 4 x 7 sign bits (rm_iq_ksigns) and in its top 4 bits
 * a scale s: x = d * (0.5 + s) * 0.25 * grid * sign */
typedef struct { rm_fp16 d; uint16_t qs[RM_QK_K / 8]; } rm_block_iq2_xxs;

/* 8 sub-blocks of 32: qs[8*j .. 8*j + 7] index rm_iq3xxs_grid (4 levels each); the uint32
 * scales_signs[j] (stored unaligned after qs) holds 4 x 7 sign bits and a 4-bit scale s on top:
 * x = d * (0.5 + s) * 0.5 * grid * sign */
typedef struct { rm_fp16 d; uint8_t qs[3 * RM_QK_K / 8]; } rm_block_iq3_xxs;

/* 16 sub-blocks of 16, a 4-bit scale s each (x = d * (0.5 + s) * 0.25 * grid * sign); qs[g]
 * holds group g of 8: an index into rm_iq2xs_grid (9 bits) and 7 sign bits (rm_iq_ksigns) */
typedef struct { rm_fp16 d; uint16_t qs[RM_QK_K / 8]; uint8_t scales[RM_QK_K / 32]; } rm_block_iq2_xs;

/* IQ2_XS with a 1024-entry grid, rm_iq2s_grid: group g's index is qs[g] plus 2 bits of qh, and
 * signs[g] holds its 8 sign bits as they are */
typedef struct {
    rm_fp16 d;
    uint8_t qs[RM_QK_K / 8];
    uint8_t signs[RM_QK_K / 8];
    uint8_t qh[RM_QK_K / 32];
    uint8_t scales[RM_QK_K / 32];
} rm_block_iq2_s;

/* 8 sub-blocks of 32, a 4-bit scale s each: x = d * (1 + 2s) * grid * sign; qs[q] and bit q of
 * qh make a 9-bit index into rm_iq3s_grid (4 levels); signs hold one bit per element */
typedef struct {
    rm_fp16 d;
    uint8_t qs[RM_QK_K / 4];
    uint8_t qh[RM_QK_K / 32];
    uint8_t signs[RM_QK_K / 8];
    uint8_t scales[RM_QK_K / 64];
} rm_block_iq3_s;

/* 8 sub-blocks of 32: x = d * (2s + 1) * (grid + delta), grid levels -1, 0, 1 (rm_iq1s_grid),
 * delta = -1/8 if bit 15 of the sub-block's qh is set, else 1/8; qh also holds s (bits 12..14)
 * and the top 3 bits of each of its 4 group indices (bits 3g..3g+2) */
typedef struct { rm_fp16 d; uint8_t qs[RM_QK_K / 8]; uint16_t qh[RM_QK_K / 32]; } rm_block_iq1_s;

/* IQ1_S with a 3-bit scale per 16 and a delta per group of 8: qh's nibble per group holds its top
 * 3 index bits and the delta sign (bit 3); the scale words' top nibbles hold the fp16 d */
typedef struct { uint8_t qs[RM_QK_K / 8]; uint8_t qh[RM_QK_K / 16]; uint8_t scales[RM_QK_K / 32]; } rm_block_iq1_m;

/* MXFP4 (OCP microscaling): 32 E2M1 values sharing one E8M0 scale. x = d * values[q], with d =
 * 2^(e - 128) (rm_e8m0_to_fp32_half: half the E8M0 scale 2^(e - 127)) and values the E2M1 levels
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled to integers (rm_mxfp4_values); nibbles as
 * in Q4_0: low nibbles hold elements 0..15, high nibbles 16..31 */
typedef struct { uint8_t e; uint8_t qs[RM_QK / 2]; } rm_block_mxfp4;

_Static_assert(sizeof(rm_block_q4_0) == 2 + 16, "Q4_0 block size");
_Static_assert(sizeof(rm_block_q4_1) == 2 + 2 + 16, "Q4_1 block size");
_Static_assert(sizeof(rm_block_q5_0) == 2 + 4 + 16, "Q5_0 block size");
_Static_assert(sizeof(rm_block_q5_1) == 2 + 2 + 4 + 16, "Q5_1 block size");
_Static_assert(sizeof(rm_block_q8_0) == 2 + 32, "Q8_0 block size");
_Static_assert(sizeof(rm_block_q8_1) == 2 + 2 + 32, "Q8_1 block size");
_Static_assert(sizeof(rm_block_q2_K) == 16 + 64 + 2 + 2, "Q2_K block size");
_Static_assert(sizeof(rm_block_q3_K) == 32 + 64 + 12 + 2, "Q3_K block size");
_Static_assert(sizeof(rm_block_q4_K) == 2 + 2 + 12 + 128, "Q4_K block size");
_Static_assert(sizeof(rm_block_q5_K) == 2 + 2 + 12 + 32 + 128, "Q5_K block size");
_Static_assert(sizeof(rm_block_q6_K) == 128 + 64 + 16 + 2, "Q6_K block size");
_Static_assert(sizeof(rm_block_q8_K) == 4 + 256 + 2 * 16, "Q8_K block size");
_Static_assert(sizeof(rm_block_iq4_nl) == 2 + 16, "IQ4_NL block size");
_Static_assert(sizeof(rm_block_iq4_xs) == 2 + 2 + 4 + 128, "IQ4_XS block size");
_Static_assert(sizeof(rm_block_iq2_xxs) == 2 + 64, "IQ2_XXS block size");
_Static_assert(sizeof(rm_block_iq3_xxs) == 2 + 64 + 32, "IQ3_XXS block size");
_Static_assert(sizeof(rm_block_iq2_xs) == 2 + 64 + 8, "IQ2_XS block size");
_Static_assert(sizeof(rm_block_iq2_s) == 2 + 32 + 32 + 8 + 8, "IQ2_S block size");
_Static_assert(sizeof(rm_block_iq3_s) == 2 + 64 + 8 + 32 + 4, "IQ3_S block size");
_Static_assert(sizeof(rm_block_iq1_s) == 2 + 32 + 16, "IQ1_S block size");
_Static_assert(sizeof(rm_block_iq1_m) == 32 + 16 + 8, "IQ1_M block size");
_Static_assert(sizeof(rm_block_mxfp4) == 1 + 16, "MXFP4 block size");

/* ---------------------------------------------------------------------------------------------
 * 16-bit floats. Portable bit manipulation, so that files come out the same on every machine
 * and compiler; rounding is to nearest, ties to even, as ggml's reference and numpy do.
 * ------------------------------------------------------------------------------------------- */

static inline uint32_t rm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, sizeof(u)); return u; }
static inline float rm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, sizeof(f)); return f; }

static inline float rm_fp16_to_fp32(rm_fp16 h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp  = (h >> 10) & 0x1f;
    const uint32_t man  = h & 0x3ff;
    if (exp == 0x1f) return rm_bits_f32(sign | 0x7f800000 | (man << 13));   /* inf, nan (payload kept) */
    if (exp != 0)    return rm_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    const float v = (float)man * 0x1p-24f;                                   /* zero or subnormal: exact */
    return sign ? -v : v;
}

static inline rm_fp16 rm_fp32_to_fp16(float f) {
    const uint32_t u    = rm_f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000;
    const uint32_t a    = u & 0x7fffffff;
    if (a > 0x7f800000) return (rm_fp16)(sign | 0x7e00);  /* any nan becomes the quiet nan */
    if (a >= 0x477ff000) return (rm_fp16)(sign | 0x7c00); /* >= 65520 (65504 + half an ulp) rounds to inf */
    if (a >= 0x38800000) {                                 /* normal half: rebias, drop 13 bits */
        uint32_t h = (a - 0x38000000) >> 13;
        const uint32_t rest = a & 0x1fff;
        h += rest > 0x1000 || (rest == 0x1000 && (h & 1)); /* a carry into the exponent is right */
        return (rm_fp16)(sign | h);
    }
    /* subnormal half: the result is round(|f| / 2^-24); |f| = man * 2^(exp - 150) */
    const uint32_t exp = a >> 23;
    if (exp < 102) return (rm_fp16)sign;                  /* below 2^-25: rounds to zero */
    const uint32_t man   = (a & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;                     /* 14 ..= 24 */
    uint32_t h = man >> shift;
    const uint32_t rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    h += rest > half || (rest == half && (h & 1));
    return (rm_fp16)(sign | h);
}

static inline float rm_bf16_to_fp32(rm_bf16 h) { return rm_bits_f32((uint32_t)h << 16); }

static inline rm_bf16 rm_fp32_to_bf16(float f) {
    const uint32_t u = rm_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (rm_bf16)((u >> 16) | 0x40);  /* nan: keep it, make it quiet */
    return (rm_bf16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);                 /* no overflow: nans are out */
}

/* MXFP4's levels: the E2M1 values times two (index 8 is -0), so that a dot stays in integers. */
static const int8_t rm_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Half of the E8M0 scale 2^(e - 127), exactly: the levels above are doubled. e = 0 and 1 give the
 * subnormals 2^-128 and 2^-127; e = 255, which E8M0 reserves for nan, gives 2^127 as in ggml. */
static inline float rm_e8m0_to_fp32_half(uint8_t e) {
    return rm_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* ---------------------------------------------------------------------------------------------
 * The traits table, keyed by ggml type id.
 *
 * Activation types (vec_dot_type): Q4_0/Q5_0/Q8_0/IQ4_NL dot against Q8_0, Q4_1/Q5_1 against
 * Q8_1 and the K-quants and the other IQ types against Q8_K, as in ggml. F32, F16 and BF16 weights dot against F32 activations:
 * ggml rounds activations to F16/BF16 first, which buys SIMD speed with extra error; here the
 * reference converts the weight instead, which is exact.
 * ------------------------------------------------------------------------------------------- */

typedef void (*rm_to_float_fn)(const void * src, float * dst, int64_t n);
typedef void (*rm_from_float_fn)(const float * src, void * dst, int64_t n);
/* A quantizer that weighs each element's error by imp[e] (n entries, >= 0), or by 1 when imp is
 * NULL: src is n elements of one row, imp the importance of their input columns. */
typedef void (*rm_quantize_imp_fn)(const float * src, void * dst, int64_t n, const float * imp);
/* *out = dot(w, x) over n elements; w is n weights of the type, x_q n activations already in the
 * type's vec_dot_type. n is a whole number of blocks of both. */
typedef void (*rm_vec_dot_fn)(int64_t n, float * out, const void * w, const void * x_q);

typedef struct rm_type_traits {
    const char *     name;          /* as gguf spells it */
    int32_t          block_elems;   /* 0: an id ggml has removed */
    int32_t          block_bytes;
    int32_t          is_quantized;
    int32_t          vec_dot_type;
    int32_t          cuda_chunk;    /* elements per step of the CUDA matmul kernels; 0: none */
    rm_to_float_fn   to_float;      /* dequantize n elements; NULL: not implemented here */
    rm_from_float_fn from_float;    /* the quantizer (for all but the IQ types byte-identical to
                                     * ggml's reference), or NULL */
    rm_vec_dot_fn    vec_dot;       /* the scalar reference dot */
    rm_quantize_imp_fn quantize_imp; /* the quantizer that takes an importance, or NULL */
} rm_type_traits;

/* The implemented types' rows; NULL for ids this build does not implement. */
const rm_type_traits * rm_type_traits_get(int32_t type);
/* Any row ggml has an id for, implemented or not (the GGUF reader sizes every tensor with it;
 * block_elems 0 marks an id ggml removed); NULL outside [0, RM_TYPE_COUNT). */
const rm_type_traits * rm_type_traits_any(int32_t type);

/* Elements the CUDA matmul kernels turn into floats per step (rm_cu_chunk, native/cuda/matmul.cuh);
 * a row must be a whole number of them. Here, in the type table, rather than in the kernels'
 * header, so that a build without CUDA can still tell a planner which types a GPU takes. */
#define RM_CUDA_CHUNK_F32   8
#define RM_CUDA_CHUNK_F16   8
#define RM_CUDA_CHUNK_Q4_0  RM_QK
#define RM_CUDA_CHUNK_Q8_0  RM_QK
#define RM_CUDA_CHUNK_Q2_K  16
#define RM_CUDA_CHUNK_Q3_K  16
#define RM_CUDA_CHUNK_Q4_K  32
#define RM_CUDA_CHUNK_MXFP4 RM_QK
#define RM_CUDA_CHUNK_Q4_1  RM_QK
#define RM_CUDA_CHUNK_Q5_0  RM_QK
#define RM_CUDA_CHUNK_Q5_1  RM_QK
#define RM_CUDA_CHUNK_Q5_K  32
#define RM_CUDA_CHUNK_Q6_K  16
#define RM_CUDA_CHUNK_IQ4_NL RM_QK
#define RM_CUDA_CHUNK_IQ4_XS 32
#define RM_CUDA_CHUNK_IQ2_XXS 32
#define RM_CUDA_CHUNK_IQ3_XXS 32

/* quants_ref.c: the scalar reference kernels, three per type. */
#define RM_DECLARE_REF_KERNELS(t)                                                   \
    void rm_##t##_to_float(const void * src, float * dst, int64_t n);              \
    void rm_##t##_from_float(const float * src, void * dst, int64_t n);            \
    void rm_##t##_vec_dot(int64_t n, float * out, const void * w, const void * x_q)

RM_DECLARE_REF_KERNELS(f32);
RM_DECLARE_REF_KERNELS(f16);
RM_DECLARE_REF_KERNELS(bf16);
RM_DECLARE_REF_KERNELS(q4_0);
RM_DECLARE_REF_KERNELS(q4_1);
RM_DECLARE_REF_KERNELS(q5_0);
RM_DECLARE_REF_KERNELS(q5_1);
RM_DECLARE_REF_KERNELS(q8_0);
RM_DECLARE_REF_KERNELS(q8_1);
RM_DECLARE_REF_KERNELS(q2_K);
RM_DECLARE_REF_KERNELS(q3_K);
RM_DECLARE_REF_KERNELS(q4_K);
RM_DECLARE_REF_KERNELS(q5_K);
RM_DECLARE_REF_KERNELS(q6_K);
RM_DECLARE_REF_KERNELS(q8_K);
RM_DECLARE_REF_KERNELS(mxfp4);

/* The IQ types: dequantize and dot; IQ4_NL (quants_ref.c), IQ2_XXS and IQ3_XXS (quants_iq.c: a
 * codebook search) also quantize, by searches of our own, not ggml's, so not byte-identical to
 * it, with an optional importance. */
#define RM_DECLARE_REF_DECODERS(t)                                                  \
    void rm_##t##_to_float(const void * src, float * dst, int64_t n);              \
    void rm_##t##_vec_dot(int64_t n, float * out, const void * w, const void * x_q)

RM_DECLARE_REF_DECODERS(iq4_nl);
RM_DECLARE_REF_DECODERS(iq4_xs);
RM_DECLARE_REF_DECODERS(iq2_xxs);
RM_DECLARE_REF_DECODERS(iq3_xxs);
RM_DECLARE_REF_DECODERS(iq2_xs);
RM_DECLARE_REF_DECODERS(iq2_s);
RM_DECLARE_REF_DECODERS(iq3_s);
RM_DECLARE_REF_DECODERS(iq1_s);
RM_DECLARE_REF_DECODERS(iq1_m);

void rm_iq4_nl_from_float(const float * src, void * dst, int64_t n);
void rm_iq4_nl_quantize(const float * src, void * dst, int64_t n, const float * imp);
void rm_iq2_xxs_from_float(const float * src, void * dst, int64_t n);
void rm_iq3_xxs_from_float(const float * src, void * dst, int64_t n);
void rm_iq2_xxs_quantize(const float * src, void * dst, int64_t n, const float * imp);
void rm_iq3_xxs_quantize(const float * src, void * dst, int64_t n, const float * imp);

#endif
