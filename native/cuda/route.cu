/* route.cu - one warp per token (see route.cuh). Lane l holds the probabilities of experts
 * l, l + 32, ...; each of the k picks is a warp-wide argmax over the experts not yet taken. */
#include "route.cuh"

#define RM_ROUTE_PER_LANE (RM_CU_ROUTE_MAX_EXPERTS / RM_WARP)
#define RM_ROUTE_WARPS 4

__global__ void k_route(const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm, rm_route * out) {
    const int32_t i = (int32_t) (blockIdx.x * RM_ROUTE_WARPS + threadIdx.x / RM_WARP);
    const int lane = threadIdx.x % RM_WARP;
    if (i >= n_tok) {
        return;
    }
    const float * z = logits + (int64_t) i * n_expert;
    float p[RM_ROUTE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < RM_ROUTE_PER_LANE; j++) {
        const int e = lane + RM_WARP * j;
        p[j] = e < n_expert ? z[e] : -INFINITY;
        mx = fmaxf(mx, p[j]);
    }
    mx = rm_cu_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < RM_ROUTE_PER_LANE; j++) {
        const int e = lane + RM_WARP * j;
        p[j] = e < n_expert ? expf(p[j] - mx) : 0.0f;
        sum += p[j];
    }
    const float inv = 1.0f / rm_cu_warp_sum(sum);
    unsigned taken = 0;   /* bit j: expert lane + 32 j is taken */
    float picked_sum = 0.0f;
    for (int32_t slot = 0; slot < k; slot++) {
        float best = -1.0f;
        int best_e = n_expert;
#pragma unroll
        for (int j = 0; j < RM_ROUTE_PER_LANE; j++) {
            const int e = lane + RM_WARP * j;
            const float v = p[j] * inv;
            if (e < n_expert && !(taken >> j & 1u) && (v > best || (v == best && e < best_e))) {
                best = v;
                best_e = e;
            }
        }
        for (int o = RM_WARP / 2; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (ob > best || (ob == best && oe < best_e)) {
                best = ob;
                best_e = oe;
            }
        }
        if (best_e % RM_WARP == lane) {
            taken |= 1u << (best_e / RM_WARP);
        }
        picked_sum += best;
        if (lane == 0) {
            rm_route r;
            r.expert = best_e;
            r.prob = best;
            r.weight = best;
            r.residual = 0;
            out[(int64_t) i * k + slot] = r;
        }
    }
    if (norm && lane == 0) {
        const float s = 1.0f / (picked_sum > 6.103515625e-5f ? picked_sum : 6.103515625e-5f);
        for (int32_t slot = 0; slot < k; slot++) {
            out[(int64_t) i * k + slot].weight *= s;
        }
    }
}

cudaError_t rm_cu_route(cudaStream_t st, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                        rm_route * out) {
    if (n_tok <= 0) {
        return cudaSuccess;
    }
    if (n_expert > RM_CU_ROUTE_MAX_EXPERTS || k > n_expert || k <= 0) {
        return cudaErrorInvalidValue;
    }
    k_route<<<rm_cu_blocks(n_tok, RM_ROUTE_WARPS), RM_ROUTE_WARPS * RM_WARP, 0, st>>>(logits, n_tok, n_expert, k,
                                                                                        norm, out);
    return cudaGetLastError();
}
