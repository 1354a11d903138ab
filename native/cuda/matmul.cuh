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

/* Q4_K: sub-block j of 32 (e = 32*j + l): nibble of qs[32*(j/2) + l], low for even j; 6-bit
 * (scale, min) j packed in scales[12] (unpack_scale_min_k4 in quants_ref.c). */
template <>
__host__ __device__ inline void rm_cu_dequant_chunk<RM_TYPE_Q4_K>(const uint8_t * row, int64_t c, float * out) {
    const rm_block_q4_K * b = (const rm_block_q4_K *) row + c / 8;
    const int j = (int) (c % 8);
    const uint8_t * s = b->scales;
    int sc, mn;
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
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
