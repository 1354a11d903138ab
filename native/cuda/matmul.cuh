/* matmul.cuh - y = W x over quantized weights, dequantized inside the kernel.
 *
 * A row of W is cut into chunks (one quant block or sub-block: 8 to 32 elements with one scale);
 * rm_cu_dequant_chunk<type> turns one chunk into floats. It runs on the host too, so
 * native/tests/test_cuda_dequant.cu checks it against the C reference dequantizers without a
 * GPU. The kernels (matmul.cu) give each row to one warp: its lanes take every 32nd chunk, dot
 * it with up to NT tokens' activations in fp32, and reduce across the warp.
 *
 * The grouped form is the MoE one: several experts' matrices, selected by index from a table
 * of device pointers, in one launch; group g multiplies rows [row0, row0 + n) of x by matrix
 * mats[group.mat] (a NULL entry: that expert is not on the device, the group is skipped). */
#ifndef RM_CUDA_MATMUL_CUH
#define RM_CUDA_MATMUL_CUH

#include "common.cuh"
extern "C" {
#include "split.h"
}
#include "iq_grids.h"

/* ---- one chunk of a row to floats ---------------------------------------------------------- */

template <int T> struct rm_cu_chunk;   /* elements per chunk, per type */
/* the sizes are the type table's (RM_CUDA_CHUNK_*, types.h), which tells planners without CUDA */
template <> struct rm_cu_chunk<RM_TYPE_F32>  { static constexpr int n = RM_CUDA_CHUNK_F32; };
template <> struct rm_cu_chunk<RM_TYPE_F16>  { static constexpr int n = RM_CUDA_CHUNK_F16; };
template <> struct rm_cu_chunk<RM_TYPE_Q4_0> { static constexpr int n = RM_CUDA_CHUNK_Q4_0; };
template <> struct rm_cu_chunk<RM_TYPE_Q8_0> { static constexpr int n = RM_CUDA_CHUNK_Q8_0; };
template <> struct rm_cu_chunk<RM_TYPE_Q2_K> { static constexpr int n = RM_CUDA_CHUNK_Q2_K; };
template <> struct rm_cu_chunk<RM_TYPE_Q3_K> { static constexpr int n = RM_CUDA_CHUNK_Q3_K; };
template <> struct rm_cu_chunk<RM_TYPE_Q4_K> { static constexpr int n = RM_CUDA_CHUNK_Q4_K; };
template <> struct rm_cu_chunk<RM_TYPE_MXFP4> { static constexpr int n = RM_CUDA_CHUNK_MXFP4; };
template <> struct rm_cu_chunk<RM_TYPE_Q6_K> { static constexpr int n = RM_CUDA_CHUNK_Q6_K; };
template <> struct rm_cu_chunk<RM_TYPE_Q5_K> { static constexpr int n = RM_CUDA_CHUNK_Q5_K; };
template <> struct rm_cu_chunk<RM_TYPE_Q5_0> { static constexpr int n = RM_CUDA_CHUNK_Q5_0; };
template <> struct rm_cu_chunk<RM_TYPE_IQ4_XS> { static constexpr int n = RM_CUDA_CHUNK_IQ4_XS; };
template <> struct rm_cu_chunk<RM_TYPE_IQ4_NL> { static constexpr int n = RM_CUDA_CHUNK_IQ4_NL; };
template <> struct rm_cu_chunk<RM_TYPE_Q4_1> { static constexpr int n = RM_CUDA_CHUNK_Q4_1; };
template <> struct rm_cu_chunk<RM_TYPE_Q5_1> { static constexpr int n = RM_CUDA_CHUNK_Q5_1; };
template <> struct rm_cu_chunk<RM_TYPE_IQ2_XXS> { static constexpr int n = RM_CUDA_CHUNK_IQ2_XXS; };
template <> struct rm_cu_chunk<RM_TYPE_IQ3_XXS> { static constexpr int n = RM_CUDA_CHUNK_IQ3_XXS; };

/* Elements [c * n, (c + 1) * n) of a row, n = rm_cu_chunk<T>::n. */
template <int T>
__host__ __device__ void rm_cu_dequant_chunk(const uint8_t * row, int64_t c, float * out);

template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_F32>(const uint8_t * row, int64_t c, float * out) {
    const float * v = (const float *) row + c * 8;
    for (int j = 0; j < 8; j++) out[j] = v[j];
}

template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_F16>(const uint8_t * row, int64_t c, float * out) {
    const uint16_t * v = (const uint16_t *) row + c * 8;
    for (int j = 0; j < 8; j++) out[j] = rm_cu_half(v[j]);
}

/* x = d * (q - 8); low nibbles hold elements 0..15, high nibbles 16..31 */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q4_0>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q4_0 * b = (const rm_block_q4_0 *) row + c;
    const float d = rm_cu_half(b->d);
    for (int j = 0; j < RM_QK / 2; j++) {
        out[j] = d * (float) ((b->qs[j] & 0xF) - 8);
        out[j + RM_QK / 2] = d * (float) ((b->qs[j] >> 4) - 8);
    }
}

template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q8_0>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q8_0 * b = (const rm_block_q8_0 *) row + c;
    const float d = rm_cu_half(b->d);
    for (int j = 0; j < RM_QK; j++) out[j] = d * (float) b->qs[j];
}

/* Q2_K/Q3_K 2-bit field of element e of a super-block: qs[32*(e/128) + e%32], bits 2*((e%128)/32).
 * Within one sub-block of 16 (e = 16*j + l) only l varies, so the byte base and shift are fixed. */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q2_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q2_K * b = (const rm_block_q2_K *) row + c / 16;
    const int j = (int) (c % 16), e0 = 16 * j;
    const uint8_t * q = b->qs + 32 * (e0 / 128) + e0 % 32;
    const int shift = 2 * ((e0 % 128) / 32);
    const float dl = rm_cu_half(b->d) * (float) (b->scales[j] & 0xF);
    const float ml = rm_cu_half(b->dmin) * (float) (b->scales[j] >> 4);
    for (int l = 0; l < 16; l++) out[l] = dl * (float) ((q[l] >> shift) & 3) - ml;
}

/* Q3_K: q = low 2 bits (as Q2_K) - 4 unless the high bit (hmask[e%32] bit e/32) is set; the
 * 6-bit scale j: low nibble in scales[j%8] (high half for j >= 8), top 2 bits in scales[8+j%4]. */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q3_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q3_K * b = (const rm_block_q3_K *) row + c / 16;
    const int j = (int) (c % 16), e0 = 16 * j;
    const uint8_t * q = b->qs + 32 * (e0 / 128) + e0 % 32;
    const uint8_t * hm = b->hmask + e0 % 32;
    const int shift = 2 * ((e0 % 128) / 32), hbit = e0 / 32;
    const int lo = (b->scales[j % 8] >> (j < 8 ? 0 : 4)) & 0xF;
    const int hi = (b->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float dl = rm_cu_half(b->d) * (float) ((lo | (hi << 4)) - 32);
    for (int l = 0; l < 16; l++) {
        const int v = ((q[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
        out[l] = dl * (float) v;
    }
}

/* (scale, min) j of the 6-bit pairs packed in a Q4_K/Q5_K scales[12] */
__host__ __device__ static inline void rm_cu_scale_min_k4(const uint8_t * s, int j, int * sc, int * mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K: sub-block j of 32 (e = 32*j + l): nibble of qs[32*(j/2) + l], low for even j; 6-bit
 * (scale, min) j packed in scales[12] (unpack_scale_min_k4 in quants_ref.c). */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q4_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q4_K * b = (const rm_block_q4_K *) row + c / 8;
    const int j = (int) (c % 8);
    int sc, mn;
    rm_cu_scale_min_k4(b->scales, j, &sc, &mn);
    const float dl = rm_cu_half(b->d) * (float) sc, ml = rm_cu_half(b->dmin) * (float) mn;
    const uint8_t * q = b->qs + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; l++) out[l] = dl * (float) ((q[l] >> shift) & 0xF) - ml;
}

/* MXFP4: x = d * v(q), d = 2^(e - 128) (half the E8M0 scale) and v the E2M1 value of nibble q
 * doubled (sign bit 3, then 2 exponent bits and 1 mantissa bit: 0, 1, 2, 3, 4, 6, 8, 12), worked
 * out from its bits rather than read from a host table the device cannot see. */
__host__ __device__ static inline float rm_cu_e2m1x2(int q) {
    const int m = q & 7;
    const int v = m < 4 ? m : (2 + (m & 1)) << ((m >> 1) - 1);
    return (float) (q & 8 ? -v : v);
}

template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_MXFP4>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_mxfp4 * b = (const rm_block_mxfp4 *) row + c;
#ifdef __CUDA_ARCH__
    const float d = __uint_as_float(b->e < 2 ? 0x00200000u << b->e : (uint32_t) (b->e - 1) << 23);
#else
    const float d = rm_e8m0_to_fp32_half(b->e);
#endif
    for (int j = 0; j < RM_QK / 2; j++) {
        out[j] = d * rm_cu_e2m1x2(b->qs[j] & 0xF);
        out[j + RM_QK / 2] = d * rm_cu_e2m1x2(b->qs[j] >> 4);
    }
}

/* Q6_K: sub-block j of 16 (e = 16*j + l, h = e/128, g = (e%128)/32): low nibble of
 * ql[64*h + 32*(g%2) + e%32] (high nibble for g >= 2), 2 high bits of qh[32*h + e%32] at bit 2g;
 * x = d * scales[j] * (q - 32). Within a chunk only l varies. */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q6_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q6_K * b = (const rm_block_q6_K *) row + c / 16;
    const int j = (int) (c % 16), e0 = 16 * j;
    const int h = e0 / 128, g = (e0 % 128) / 32;
    const uint8_t * ql = b->ql + 64 * h + 32 * (g % 2) + e0 % 32;
    const uint8_t * qh = b->qh + 32 * h + e0 % 32;
    const int lshift = g < 2 ? 0 : 4, hshift = 2 * g;
    const float dl = rm_cu_half(b->d) * (float) b->scales[j];
    for (int l = 0; l < 16; l++) {
        const int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        out[l] = dl * (float) q;
    }
}

/* Q5_K: Q4_K's nibbles and scales, plus bit 4 of element 32*j + l in qh[l] bit j. */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q5_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q5_K * b = (const rm_block_q5_K *) row + c / 8;
    const int j = (int) (c % 8);
    int sc, mn;
    rm_cu_scale_min_k4(b->scales, j, &sc, &mn);
    const float dl = rm_cu_half(b->d) * (float) sc, ml = rm_cu_half(b->dmin) * (float) mn;
    const uint8_t * q = b->qs + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; l++) {
        const int v = ((q[l] >> shift) & 0xF) | (((b->qh[l] >> j) & 1) << 4);
        out[l] = dl * (float) v - ml;
    }
}

/* A little-endian uint32 read byte by byte (Q5_0/Q5_1's qh, the IQ words: blocks are only 2-byte
 * aligned). Q5_0/Q5_1's 5-bit level j of a block: nibble as Q4_0, bit 4 qh's bit j. */
__host__ __device__ static inline uint32_t rm_cu_u32le(const uint8_t * qh) {
    return (uint32_t) qh[0] | ((uint32_t) qh[1] << 8) | ((uint32_t) qh[2] << 16) | ((uint32_t) qh[3] << 24);
}

/* x = d * (q - 16) */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q5_0>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q5_0 * b = (const rm_block_q5_0 *) row + c;
    const float d = rm_cu_half(b->d);
    const uint32_t qh = rm_cu_u32le(b->qh);
    for (int j = 0; j < RM_QK / 2; j++) {
        const int lo = (b->qs[j] & 0xF) | (int) (((qh >> j) & 1) << 4);
        const int hi = (b->qs[j] >> 4) | (int) (((qh >> (j + RM_QK / 2)) & 1) << 4);
        out[j] = d * (float) (lo - 16);
        out[j + RM_QK / 2] = d * (float) (hi - 16);
    }
}

/* x = d * q + m */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q5_1>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q5_1 * b = (const rm_block_q5_1 *) row + c;
    const float d = rm_cu_half(b->d), m = rm_cu_half(b->m);
    const uint32_t qh = rm_cu_u32le(b->qh);
    for (int j = 0; j < RM_QK / 2; j++) {
        const int lo = (b->qs[j] & 0xF) | (int) (((qh >> j) & 1) << 4);
        const int hi = (b->qs[j] >> 4) | (int) (((qh >> (j + RM_QK / 2)) & 1) << 4);
        out[j] = d * (float) lo + m;
        out[j + RM_QK / 2] = d * (float) hi + m;
    }
}

/* x = d * q + m, nibbles as Q4_0 */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q4_1>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q4_1 * b = (const rm_block_q4_1 *) row + c;
    const float d = rm_cu_half(b->d), m = rm_cu_half(b->m);
    for (int j = 0; j < RM_QK / 2; j++) {
        out[j] = d * (float) (b->qs[j] & 0xF) + m;
        out[j + RM_QK / 2] = d * (float) (b->qs[j] >> 4) + m;
    }
}

/* The IQ types' tables (iq_grids.h, generated from gguf-py): the host reads them, the device a
 * copy in global memory (cached; lanes index it divergently, which constant memory would
 * serialise) made by the compiler from the same arrays, so no value is typed twice. */
#define RM_CU_DEVICE_TABLE(name, src, T, n)                                                       \
    struct name##_t { T v[n]; };                                                                  \
    constexpr name##_t name##_make() {                                                            \
        name##_t t{};                                                                             \
        for (int i = 0; i < (n); i++) t.v[i] = src[i];                                            \
        return t;                                                                                 \
    }                                                                                             \
    static __device__ const name##_t name = name##_make();
#define RM_CU_DEVICE_GRID(name, src, T, n, m)                                                     \
    struct name##_t { T v[n][m]; };                                                               \
    constexpr name##_t name##_make() {                                                            \
        name##_t t{};                                                                             \
        for (int i = 0; i < (n); i++)                                                             \
            for (int j = 0; j < (m); j++) t.v[i][j] = src[i][j];                                  \
        return t;                                                                                 \
    }                                                                                             \
    static __device__ const name##_t name = name##_make();

RM_CU_DEVICE_TABLE(rm_cu_iq4nl_dev, rm_iq4nl_values, int8_t, 16)
RM_CU_DEVICE_TABLE(rm_cu_ksigns_dev, rm_iq_ksigns, uint8_t, 128)
RM_CU_DEVICE_GRID(rm_cu_iq2xxs_dev, rm_iq2xxs_grid, uint8_t, 256, 8)
RM_CU_DEVICE_GRID(rm_cu_iq3xxs_dev, rm_iq3xxs_grid, uint8_t, 256, 4)

#ifdef __CUDA_ARCH__
#define RM_CU_IQ(dev, host) (dev.v)
#else
#define RM_CU_IQ(dev, host) (host)
#endif

__host__ __device__ static inline float rm_cu_iq4nl(int q) {
    return (float) RM_CU_IQ(rm_cu_iq4nl_dev, rm_iq4nl_values)[q];
}

/* IQ4_NL: Q4_0's layout, x = d * values[q] */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_IQ4_NL>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_iq4_nl * b = (const rm_block_iq4_nl *) row + c;
    const float d = rm_cu_half(b->d);
    for (int j = 0; j < RM_QK / 2; j++) {
        out[j] = d * rm_cu_iq4nl(b->qs[j] & 0xF);
        out[j + RM_QK / 2] = d * rm_cu_iq4nl(b->qs[j] >> 4);
    }
}

/* IQ4_XS: sub-block j of 32, x = d * (sc - 32) * values[q]; sc = nibble j%2 of scales_l[j/2] plus
 * bits 2j..2j+1 of scales_h on top; qs[16*j + l] holds element 32*j + l (low) and + 16 (high). */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_IQ4_XS>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_iq4_xs * b = (const rm_block_iq4_xs *) row + c / 8;
    const int j = (int) (c % 8);
    const int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF, hi = (b->scales_h >> (2 * j)) & 3;
    const float dl = rm_cu_half(b->d) * (float) ((lo | (hi << 4)) - 32);
    const uint8_t * q = b->qs + 16 * j;
    for (int l = 0; l < 16; l++) {
        out[l] = dl * rm_cu_iq4nl(q[l] & 0xF);
        out[l + 16] = dl * rm_cu_iq4nl(q[l] >> 4);
    }
}

/* IQ2_XXS and IQ3_XXS: sub-block j of 32 has a little-endian uint32 of 4 x 7 sign bits (expanded
 * to 8 by rm_iq_ksigns) and a scale s in its top 4 bits: x = d * (2s + 1) * step * grid * sign,
 * step 1/8 (IQ2_XXS) or 1/4 (IQ3_XXS), the C reference's float order (quants_ref.c). */
__host__ __device__ static inline void rm_cu_iq_signed8(const uint8_t * grid, int signs, float dl, float * out) {
    for (int l = 0; l < 8; l++) out[l] = dl * (float) ((signs >> l) & 1 ? -grid[l] : grid[l]);
}

/* IQ2_XXS: qs bytes [8j, 8j + 4) index rm_iq2xxs_grid (8 levels each), [8j + 4, 8j + 8) the word */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_IQ2_XXS>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_iq2_xxs * b = (const rm_block_iq2_xxs *) row + c / 8;
    const uint8_t * q = (const uint8_t *) b->qs + 8 * (c % 8);
    const uint32_t ss = rm_cu_u32le(q + 4);
    const float dl = rm_cu_half(b->d) * (float) (2 * (ss >> 28) + 1) * 0.125f;
    for (int g = 0; g < 4; g++) {
        const int signs = RM_CU_IQ(rm_cu_ksigns_dev, rm_iq_ksigns)[(ss >> (7 * g)) & 127];
        rm_cu_iq_signed8(RM_CU_IQ(rm_cu_iq2xxs_dev, rm_iq2xxs_grid)[q[g]], signs, dl, out + 8 * g);
    }
}

/* IQ3_XXS: qs[8j .. 8j + 7] index rm_iq3xxs_grid (4 levels each, two per group of 8); the words
 * follow the 64 index bytes */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_IQ3_XXS>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_iq3_xxs * b = (const rm_block_iq3_xxs *) row + c / 8;
    const int j = (int) (c % 8);
    const uint8_t * q = b->qs + 8 * j;
    const uint32_t ss = rm_cu_u32le(b->qs + RM_QK_K / 4 + 4 * j);
    const float dl = rm_cu_half(b->d) * (float) (2 * (ss >> 28) + 1) * 0.25f;
    for (int g = 0; g < 4; g++) {
        uint8_t grid[8];
        for (int l = 0; l < 4; l++) {
            grid[l] = RM_CU_IQ(rm_cu_iq3xxs_dev, rm_iq3xxs_grid)[q[2 * g]][l];
            grid[l + 4] = RM_CU_IQ(rm_cu_iq3xxs_dev, rm_iq3xxs_grid)[q[2 * g + 1]][l];
        }
        const int signs = RM_CU_IQ(rm_cu_ksigns_dev, rm_iq_ksigns)[(ss >> (7 * g)) & 127];
        rm_cu_iq_signed8(grid, signs, dl, out + 8 * g);
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

typedef rm_split_group rm_cu_group;   /* {matrix index, first row of x and y, rows} (split.h) */

/* 1 when the kernels handle rows of n_in weights of this ggml type (n_in a whole number of chunks). */
int rm_cu_matmul_supports(int32_t type, int64_t n_in);

/* y[row0 + t] (=|+=) W x[row0 + t] for every group. W is n_out rows of row_bytes, in_features
 * n_in. Either w (one matrix; groups NULL, one group {0, 0, n_tok} implied) or mats (n_groups
 * groups in device memory, max_n the largest group's n). */
cudaError_t rm_cu_matmul(cudaStream_t st, int32_t type, int64_t n_in, int64_t n_out, uint64_t row_bytes,
                         const uint8_t * w, const uint8_t * const * mats, const rm_cu_group * groups,
                         int32_t n_groups, int32_t max_n, const float * x, int64_t x_stride, float * y,
                         int64_t y_stride, int accumulate);

#endif
