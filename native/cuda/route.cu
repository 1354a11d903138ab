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

/* gating.c's steps for one token in one thread: the scores, the groups kept, the top k (ties:
 * the lower index), the weights; a block per token keeps its scores in shared memory. */
__global__ void k_route_gated(const float * logits, const float * bias, rm_gating_params g, int32_t n_expert, int32_t k,
                              rm_route * out) {
    __shared__ float p[RM_CU_ROUTE_MAX_EXPERTS], sel[RM_CU_ROUTE_MAX_EXPERTS], gscore[RM_CU_ROUTE_MAX_EXPERTS];
    __shared__ unsigned char taken[RM_CU_ROUTE_MAX_EXPERTS], kept[RM_CU_ROUTE_MAX_EXPERTS];
    if (threadIdx.x != 0) {
        return;
    }
    const float * z = logits + (int64_t) blockIdx.x * n_expert;
    if (g.gating == RM_GATING_SIGMOID) {
        for (int32_t e = 0; e < n_expert; e++) p[e] = 1.0f / (1.0f + expf(-z[e]));
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int32_t e = 0; e < n_expert; e++) mx = fmaxf(mx, z[e]);
        for (int32_t e = 0; e < n_expert; e++) sum += (p[e] = expf(z[e] - mx));
        for (int32_t e = 0; e < n_expert; e++) p[e] /= sum;
    }
    for (int32_t e = 0; e < n_expert; e++) {
        sel[e] = bias ? p[e] + bias[e] : p[e];
        taken[e] = 0;
    }
    if (g.n_group > 1) {   /* a group's score: its best (softmax) or two best (sigmoid) */
        const int32_t per = n_expert / g.n_group;
        for (int32_t gi = 0; gi < g.n_group; gi++) {
            float a = -INFINITY, b = -INFINITY;
            for (int32_t i = 0; i < per; i++) {
                const float s = sel[gi * per + i];
                if (s > a) { b = a; a = s; } else if (s > b) { b = s; }
            }
            gscore[gi] = g.gating == RM_GATING_SIGMOID ? a + (per > 1 ? b : 0.0f) : a;
            kept[gi] = 0;
        }
        for (int32_t j = 0; j < g.n_group_used; j++) {
            int32_t best = -1;
            for (int32_t gi = 0; gi < g.n_group; gi++) {
                if (!kept[gi] && (best < 0 || gscore[gi] > gscore[best])) best = gi;
            }
            kept[best] = 1;
        }
        for (int32_t e = 0; e < n_expert; e++) taken[e] = !kept[e / per];
    }
    rm_route * r = out + (int64_t) blockIdx.x * k;
    float sum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = e;
        }
        taken[best] = 1;
        r[j].expert = best;
        r[j].prob = r[j].weight = p[best];
        r[j].residual = 0;
        sum += p[best];
    }
    const float norm = g.norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
    for (int32_t j = 0; j < k; j++) r[j].weight *= norm * g.scale;
}

cudaError_t rm_cu_route_gated(cudaStream_t st, const float * logits, const float * bias, const rm_gating_params * g,
                              int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out) {
    if (n_tok <= 0) {
        return cudaSuccess;
    }
    if (n_expert <= 0 || n_expert > RM_CU_ROUTE_MAX_EXPERTS || k <= 0 || k > n_expert ||
        (g->n_group > 1 && (n_expert % g->n_group != 0 || g->n_group_used < 1 || g->n_group_used > g->n_group))) {
        return cudaErrorInvalidValue;
    }
    k_route_gated<<<(unsigned) n_tok, 32, 0, st>>>(logits, bias, *g, n_expert, k, out);
    return cudaGetLastError();
}
