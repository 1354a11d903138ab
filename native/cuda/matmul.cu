/* matmul.cu - the mat-vec / batched / expert-grouped product kernel (see matmul.cuh). */
#include "matmul.cuh"

#define RM_MM_WARPS 4             /* rows (warps) per block */

/* blockIdx: x = a tile of RM_MM_WARPS rows, y = a tile of NT tokens within the group, z = group. */
template <int T, int NT>
__global__ void __launch_bounds__(RM_MM_WARPS * RM_WARP)
k_matmul(int64_t n_in, int64_t n_out, uint64_t row_bytes, const uint8_t * w, const uint8_t * const * mats,
         const rm_cu_group * groups, int32_t n_tok, const float * __restrict__ x, int64_t x_stride,
         float * __restrict__ y, int64_t y_stride, int accumulate) {
    constexpr int C = rm_cu_chunk<T>::n;
    const rm_cu_group g = groups ? groups[blockIdx.z] : rm_cu_group{0, 0, n_tok};
    const uint8_t * mat = mats ? mats[g.mat] : w;
    const int lane = threadIdx.x % RM_WARP;
    const int64_t r = (int64_t) blockIdx.x * RM_MM_WARPS + threadIdx.x / RM_WARP;
    const int t0 = (int) blockIdx.y * NT;
    if (!mat || r >= n_out || t0 >= g.n) {
        return;   /* uniform over a warp: no shuffle below is left waiting */
    }
    const int nt = g.n - t0 < NT ? g.n - t0 : NT;
    const uint8_t * wrow = mat + (uint64_t) r * row_bytes;
    const float * xb = x + (int64_t) (g.row0 + t0) * x_stride;
    const int64_t n_chunks = n_in / C;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += RM_WARP) {
        float wv[C];
        rm_cu_dequant_chunk<T>(wrow, c, wv);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float * xt = xb + (int64_t) t * x_stride + c * C;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < C; j++) s += wv[j] * xt[j];
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = rm_cu_warp_sum(acc[t]);
        if (lane == 0 && t < nt) {
            float * yt = y + (int64_t) (g.row0 + t0 + t) * y_stride + r;
            *yt = accumulate ? *yt + v : v;
        }
    }
}

template <int T>
static cudaError_t launch(cudaStream_t st, int64_t n_in, int64_t n_out, uint64_t row_bytes, const uint8_t * w,
                          const uint8_t * const * mats, const rm_cu_group * groups, int32_t n_groups, int32_t max_n,
                          const float * x, int64_t x_stride, float * y, int64_t y_stride, int accumulate) {
    const int nt = max_n <= 1 ? 1 : max_n <= 2 ? 2 : max_n <= 4 ? 4 : 8;
    dim3 grid(rm_cu_blocks(n_out, RM_MM_WARPS), (unsigned) ((max_n + nt - 1) / nt), (unsigned) n_groups);
    dim3 block(RM_MM_WARPS * RM_WARP);
    switch (nt) {
        case 1: k_matmul<T, 1><<<grid, block, 0, st>>>(n_in, n_out, row_bytes, w, mats, groups, max_n, x, x_stride, y, y_stride, accumulate); break;
        case 2: k_matmul<T, 2><<<grid, block, 0, st>>>(n_in, n_out, row_bytes, w, mats, groups, max_n, x, x_stride, y, y_stride, accumulate); break;
        case 4: k_matmul<T, 4><<<grid, block, 0, st>>>(n_in, n_out, row_bytes, w, mats, groups, max_n, x, x_stride, y, y_stride, accumulate); break;
        default: k_matmul<T, 8><<<grid, block, 0, st>>>(n_in, n_out, row_bytes, w, mats, groups, max_n, x, x_stride, y, y_stride, accumulate); break;
    }
    return cudaGetLastError();
}

int rm_cu_matmul_supports(int32_t type, int64_t n_in) {
    const rm_type_traits * t = rm_type_traits_get(type);
    const int chunk = t != NULL ? t->cuda_chunk : 0;
    return chunk > 0 && n_in > 0 && n_in % chunk == 0;
}

cudaError_t rm_cu_matmul(cudaStream_t st, int32_t type, int64_t n_in, int64_t n_out, uint64_t row_bytes,
                         const uint8_t * w, const uint8_t * const * mats, const rm_cu_group * groups,
                         int32_t n_groups, int32_t max_n, const float * x, int64_t x_stride, float * y,
                         int64_t y_stride, int accumulate) {
    if (!groups) {
        n_groups = 1;
    }
    if (n_groups <= 0 || max_n <= 0 || n_out <= 0) {
        return cudaSuccess;
    }
#define RM_MM_CASE(t) \
    case t: return launch<t>(st, n_in, n_out, row_bytes, w, mats, groups, n_groups, max_n, x, x_stride, y, y_stride, accumulate)
    switch (type) {
        RM_MM_CASE(RM_TYPE_F32);
        RM_MM_CASE(RM_TYPE_F16);
        RM_MM_CASE(RM_TYPE_Q4_0);
        RM_MM_CASE(RM_TYPE_Q8_0);
        RM_MM_CASE(RM_TYPE_Q2_K);
        RM_MM_CASE(RM_TYPE_Q3_K);
        RM_MM_CASE(RM_TYPE_Q4_K);
        RM_MM_CASE(RM_TYPE_MXFP4);
        RM_MM_CASE(RM_TYPE_Q6_K);
        RM_MM_CASE(RM_TYPE_Q5_K);
        RM_MM_CASE(RM_TYPE_Q5_0);
        RM_MM_CASE(RM_TYPE_IQ4_XS);
        RM_MM_CASE(RM_TYPE_IQ4_NL);
        RM_MM_CASE(RM_TYPE_Q4_1);
        RM_MM_CASE(RM_TYPE_Q5_1);
        RM_MM_CASE(RM_TYPE_IQ2_XXS);
        RM_MM_CASE(RM_TYPE_IQ3_XXS);
        default: return cudaErrorInvalidValue;
    }
#undef RM_MM_CASE
}
