/* gating.c - the router of DeepSeek and GLM (gating.h): scores by softmax or sigmoid, a selection
 * bias that counts for the choice only, group-limited top-k, renormalised and scaled weights.
 *
 * Steps, per token (llama.cpp's build_moe_ffn and transformers' DeepseekV3TopkRouter and
 * DeepseekV4TopKRouter/HashRouter):
 *   p = softmax(logits), sigmoid(logits) or sqrt(softplus(logits))   the scores; the weights come from these
 *   s = p + bias                                 what the choice ranks (bias: e_score_correction_bias)
 *   with n_group > 1: a group's score is the sum of its two best s (sigmoid, DeepSeek-V3), or its
 *   best s (softmax, DeepSeek-V2's group_limited_greedy, as transformers and DeepSeek's code have
 *   it; llama.cpp takes the two best for both); the best n_group_used groups stay
 *   the top k of s among the groups kept (or the k the token's row of a hash table names); weight = p of each
 *   weights / their sum when norm; times scale
 * Ties go to the lower index, as in the softmax router (cpu/ops.c). */
#include "gating.h"

#include <math.h>
#include <string.h>

#include "backend.h"

#define MAX_EXPERTS 512

/* The index of the largest of v[0..n) not yet taken (ties: the lower index); -1 when all are. */
static int32_t best_free(const float * v, const uint8_t * taken, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        if (!taken[i] && (best < 0 || v[i] > v[best])) {
            best = i;
        }
    }
    return best;
}

/* Marks in `off` the experts of the groups that are not among the best n_used. */
static void drop_groups(const float * sel, const rm_gating_params * g, int32_t n_expert, uint8_t * off) {
    const int32_t per = n_expert / g->n_group;
    float score[MAX_EXPERTS];
    for (int32_t gi = 0; gi < g->n_group; gi++) {
        const float * s = sel + gi * per;
        float a = -INFINITY, b = -INFINITY;   /* the best and second best of the group */
        for (int32_t i = 0; i < per; i++) {
            if (s[i] > a) {
                b = a, a = s[i];
            } else if (s[i] > b) {
                b = s[i];
            }
        }
        score[gi] = g->gating == RM_GATING_SIGMOID ? a + (per > 1 ? b : 0.0f) : a;
    }
    uint8_t kept[MAX_EXPERTS] = {0};
    for (int32_t j = 0; j < g->n_group_used; j++) {
        kept[best_free(score, kept, g->n_group)] = 1;
    }
    for (int32_t e = 0; e < n_expert; e++) {
        off[e] = !kept[e / per];
    }
}

float rm_sqrt_softplus(float x) {
    return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

void rm_route_token_gated(const float * logits, const float * bias, const rm_gating_params * g, int32_t n_expert,
                          int32_t k, const int32_t * chosen, rm_route * r) {
    float p[MAX_EXPERTS], sel[MAX_EXPERTS];
    memcpy(p, logits, sizeof(float) * (size_t) n_expert);
    if (g->gating == RM_GATING_SIGMOID) {
        for (int32_t e = 0; e < n_expert; e++) {
            p[e] = 1.0f / (1.0f + expf(-p[e]));
        }
    } else if (g->gating == RM_GATING_SQRT_SOFTPLUS) {
        for (int32_t e = 0; e < n_expert; e++) {
            p[e] = rm_sqrt_softplus(p[e]);
        }
    } else {
        rm_softmax_sink(p, n_expert, -INFINITY);   /* rm_softmax, without a call into the CPU backend's unit */
    }
    for (int32_t e = 0; e < n_expert; e++) {
        sel[e] = bias ? p[e] + bias[e] : p[e];
    }
    uint8_t taken[MAX_EXPERTS] = {0};
    if (g->n_group > 1) {
        drop_groups(sel, g, n_expert, taken);
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        const int32_t e = chosen ? chosen[j] : best_free(sel, taken, n_expert);
        taken[e] = 1;
        r[j].expert = e;
        r[j].prob = p[e];
        r[j].weight = p[e];
        r[j].residual = 0;
        sum += p[e];
    }
    const float norm = g->norm ? 1.0f / (sum > 6.103515625e-5f ? sum : 6.103515625e-5f) : 1.0f;
    for (int32_t j = 0; j < k; j++) {
        r[j].weight *= norm * g->scale;
    }
}

int rm_gating_is_plain(const rm_gating_params * g, const float * bias) {
    return g->gating != RM_GATING_SIGMOID && g->gating != RM_GATING_SQRT_SOFTPLUS && !g->hash && !bias &&
           g->n_group <= 1 && g->scale == 1.0f;
}
