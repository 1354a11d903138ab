/* attention.cu - one warp per (token, head) (see attention.cuh).
 *
 * The warp walks the cache one position at a time: its lanes hold the query and the output
 * accumulator spread over the head dimension (dims lane, lane + 32, ...), the score is a warp
 * sum, and the softmax is kept online (running max m and denominator l, the accumulator rescaled
 * when m grows), so no score buffer the size of the context is needed. K and V rows are read
 * once per (token, head), coalesced across lanes. */
#include "attention.cuh"

#define RM_ATTN_WARPS 4

template <int DPL>   /* head dims per lane: ceil(head_dim / 32) */
__global__ void __launch_bounds__(RM_ATTN_WARPS * RM_WARP)
k_attention(const float * __restrict__ q, const float * __restrict__ kc, const float * __restrict__ vc,
            float * __restrict__ out, int32_t n_tok, int32_t pos0, int32_t n_head, int32_t n_head_kv, int32_t D,
            int32_t DV, float scale, int32_t window, const float * __restrict__ sinks, int32_t ring) {
    const int64_t job = (int64_t) blockIdx.x * RM_ATTN_WARPS + threadIdx.x / RM_WARP;
    const int lane = threadIdx.x % RM_WARP;
    if (job >= (int64_t) n_tok * n_head) {
        return;
    }
    const int32_t i = (int32_t) (job / n_head), h = (int32_t) (job % n_head);
    const int32_t n_kv = pos0 + i + 1;
    const int32_t p_first = window > 0 && n_kv > window ? n_kv - window : 0;
    const int64_t q_stride = (int64_t) n_head * D, k_stride = (int64_t) n_head_kv * D;
    const int64_t o_stride = (int64_t) n_head * DV, v_stride = (int64_t) n_head_kv * DV;
    const int64_t kvh = h / (n_head / n_head_kv), k_off = kvh * D, v_off = kvh * DV;
    const float * qh = q + i * q_stride + (int64_t) h * D;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int d = lane + RM_WARP * k;
        qv[k] = d < D ? qh[d] : 0.0f;
        acc[k] = 0.0f;
    }
    /* a sink starts the softmax as a score with no value */
    float m = sinks ? sinks[h] : -INFINITY, l = sinks ? 1.0f : 0.0f;
    for (int32_t p = p_first; p < n_kv; p++) {
        const int64_t row = ring > 0 ? p % ring : p;   /* a sliding layer's ring */
        const float * kr = kc + row * k_stride + k_off;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + RM_WARP * k;
            s += d < D ? qv[k] * kr[d] : 0.0f;
        }
        s = rm_cu_warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
        const float * vr = vc + row * v_stride + v_off;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + RM_WARP * k;
            acc[k] = acc[k] * corr + (d < DV ? e * vr[d] : 0.0f);
        }
        m = m_new;
    }
    float * o = out + i * o_stride + (int64_t) h * DV;
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int d = lane + RM_WARP * k;
        if (d < DV) {
            o[d] = acc[k] * inv;
        }
    }
}

cudaError_t rm_cu_attention(cudaStream_t st, const rm_attn_args * a, const float * sinks_dev) {
    const int64_t jobs = (int64_t) a->n_tok * a->n_head;
    if (jobs <= 0) {
        return cudaSuccess;
    }
    const int32_t dv = a->head_dim_v > 0 ? a->head_dim_v : a->head_dim;
    const int32_t wide = a->head_dim > dv ? a->head_dim : dv;
    if (wide > RM_CU_ATTN_MAX_HEAD_DIM || a->head_dim <= 0 || a->n_head % a->n_head_kv != 0) {
        return cudaErrorInvalidValue;
    }
    const float scale = a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float) a->head_dim);
    const unsigned blocks = rm_cu_blocks(jobs, RM_ATTN_WARPS);
    const int threads = RM_ATTN_WARPS * RM_WARP;
    const int dpl = (wide + RM_WARP - 1) / RM_WARP;   /* the lanes hold the wider of a query and an output */
#define RM_ATTN_CASE(n)                                                                                   \
    case n: k_attention<n><<<blocks, threads, 0, st>>>(a->q, a->k_cache, a->v_cache, a->out, a->n_tok,     \
                                                       a->pos0, a->n_head, a->n_head_kv, a->head_dim, dv, scale, \
                                                       a->window, sinks_dev, a->ring);                        \
        break
    switch (dpl) {
        RM_ATTN_CASE(1);
        RM_ATTN_CASE(2);
        case 3:
        RM_ATTN_CASE(4);
        case 5: case 6: case 7:
        RM_ATTN_CASE(8);
        case 9: case 10: case 11: case 12: case 13: case 14: case 15:
        RM_ATTN_CASE(16);   /* Gemma 4's full layers: heads of 512 */
        default: return cudaErrorInvalidValue;
    }
#undef RM_ATTN_CASE
    return cudaGetLastError();
}
