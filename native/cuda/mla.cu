/* mla.cu - one warp per (token, head) (see mla.cuh), as attention.cu: the lanes hold the latent
 * query and the accumulator spread over the latent's dims (lane, lane + 32, ...), a score is a warp
 * sum, and the softmax is kept online, so no score buffer the size of the context is needed. A
 * cached latent row is read once per (token, head), coalesced across lanes; its first C floats are
 * the value. */
#include "mla.cuh"

#define RM_MLA_WARPS 4
#define RM_MLA_PER_LANE (RM_CU_MLA_MAX_LATENT / RM_WARP)

__global__ void k_mla_rope_part(const float * __restrict__ q, float * __restrict__ qlat, int32_t n_tok, int32_t n_head,
                                int32_t D, int32_t R, int32_t C) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) n_tok * n_head * R) {
        return;
    }
    const int64_t row = i / R, d = i % R;   /* row: token * n_head + head */
    qlat[row * (C + R) + C + d] = q[row * D + (D - R) + d];
}

cudaError_t rm_cu_mla_rope_part(cudaStream_t st, const float * q, float * qlat, int32_t n_tok, int32_t n_head,
                                int32_t D, int32_t R, int32_t C) {
    const int64_t n = (int64_t) n_tok * n_head * R;
    if (n <= 0) {
        return cudaSuccess;
    }
    k_mla_rope_part<<<rm_cu_blocks(n, 256), 256, 0, st>>>(q, qlat, n_tok, n_head, D, R, C);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(RM_MLA_WARPS * RM_WARP)
k_mla_latent(const float * __restrict__ qlat, const float * __restrict__ cache, float * __restrict__ olat,
             int32_t n_tok, int32_t pos, int32_t n_head, int32_t C, int32_t R, float scale) {
    const int64_t job = (int64_t) blockIdx.x * RM_MLA_WARPS + threadIdx.x / RM_WARP;
    const int lane = threadIdx.x % RM_WARP;
    if (job >= (int64_t) n_tok * n_head) {
        return;
    }
    const int32_t t = (int32_t) (job / n_head), LA = C + R;
    const float * qh = qlat + job * LA;
    float qv[RM_MLA_PER_LANE], acc[RM_MLA_PER_LANE];
#pragma unroll
    for (int k = 0; k < RM_MLA_PER_LANE; k++) {
        const int d = lane + RM_WARP * k;
        qv[k] = d < LA ? qh[d] : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int32_t p = 0; p <= pos + t; p++) {   /* causal: positions [0, pos + t] */
        const float * row = cache + (int64_t) p * LA;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < RM_MLA_PER_LANE; k++) {
            const int d = lane + RM_WARP * k;
            s += d < LA ? qv[k] * row[d] : 0.0f;
        }
        s = rm_cu_warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int k = 0; k < RM_MLA_PER_LANE; k++) {
            const int d = lane + RM_WARP * k;
            acc[k] = acc[k] * corr + (d < C ? e * row[d] : 0.0f);
        }
        m = m_new;
    }
    float * o = olat + job * C;
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < RM_MLA_PER_LANE; k++) {
        const int d = lane + RM_WARP * k;
        if (d < C) {
            o[d] = acc[k] * inv;
        }
    }
}

cudaError_t rm_cu_mla_latent_attention(cudaStream_t st, const float * qlat, const float * cache, float * olat,
                                       int32_t n_tok, int32_t pos, int32_t n_head, int32_t C, int32_t R, float scale) {
    const int64_t jobs = (int64_t) n_tok * n_head;
    if (jobs <= 0) {
        return cudaSuccess;
    }
    if (C <= 0 || R < 0 || C + R > RM_CU_MLA_MAX_LATENT) {
        return cudaErrorInvalidValue;
    }
    k_mla_latent<<<rm_cu_blocks(jobs, RM_MLA_WARPS), RM_MLA_WARPS * RM_WARP, 0, st>>>(qlat, cache, olat, n_tok, pos,
                                                                                      n_head, C, R, scale);
    return cudaGetLastError();
}
