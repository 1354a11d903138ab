/* cpu/mhc.c - DeepSeek-V4's manifold-constrained hyper-connections on the CPU backend (backend.h's
 * mhc_weights, mhc_collapse, mhc_expand; layers/mhc.c composes them with rmsnorm and matmul).
 *
 * The threads take tokens in turn (the weights) or columns of the streams (the sums), so every
 * float is computed in one order whatever the step holds. The weights' math is float, as
 * transformers' (it runs the mixing in float32 whatever the model's dtype). */
#include <math.h>

#include "cpu_ops.h"

static float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

typedef struct mhc_task {
    float *       y;
    const float * x;
    const float * mix;
    const float * scale;          /* ne = {3} (a block's) or {1} (the output's) */
    const float * base;           /* ne = {n_mix} */
    int64_t       n_tok, hc, n_mix, n;
    int32_t       iters;
    float         eps;
} mhc_task;

/* One token's logits into its weights, in place (backend.h's mhc_weights). */
static void weights_of(float * l, const mhc_task * t) {
    const int64_t hc = t->hc;
    for (int64_t c = 0; c < hc; c++) {
        l[c] = sigmoid(l[c] * t->scale[0] + t->base[c]) + t->eps;
    }
    if (t->n_mix == hc) {
        return;   /* the output's: pre alone */
    }
    for (int64_t c = 0; c < hc; c++) {
        l[hc + c] = 2.0f * sigmoid(l[hc + c] * t->scale[1] + t->base[hc + c]);
    }
    float * comb = l + 2 * hc;   /* row j (the input stream) of hc, column k (the output stream) */
    for (int64_t j = 0; j < hc; j++) {
        float * row = comb + j * hc;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t k = 0; k < hc; k++) {
            row[k] = row[k] * t->scale[2] + t->base[2 * hc + j * hc + k];
            mx = fmaxf(mx, row[k]);
        }
        for (int64_t k = 0; k < hc; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int64_t k = 0; k < hc; k++) {
            row[k] = row[k] / sum + t->eps;
        }
    }
    /* Sinkhorn-Knopp: columns, then iters - 1 rounds of rows and columns */
    for (int32_t it = 0; it < 2 * t->iters - 1; it++) {
        const int rows = it % 2 == 1;
        for (int64_t a = 0; a < hc; a++) {
            float sum = 0.0f;
            for (int64_t b = 0; b < hc; b++) {
                sum += rows ? comb[a * hc + b] : comb[b * hc + a];
            }
            const float inv = 1.0f / (sum + t->eps);
            for (int64_t b = 0; b < hc; b++) {
                *(rows ? &comb[a * hc + b] : &comb[b * hc + a]) *= inv;
            }
        }
    }
}

static void weights_task(void * ctx, int ith, int nth) {
    const mhc_task * t = ctx;
    for (int64_t i = ith; i < t->n_tok; i += nth) {
        weights_of(t->y + i * t->n_mix, t);
    }
}

void rm_cpu_mhc_weights(rm_pool * pool, float * mix, const float * scale, const float * base, int64_t n_tok,
                        int64_t hc, int64_t n_mix, int32_t iters, float eps) {
    mhc_task t = {.y = mix, .scale = scale, .base = base, .n_tok = n_tok, .hc = hc, .n_mix = n_mix, .iters = iters,
                  .eps = eps};
    rm_pool_run(pool, weights_task, &t);
}

/* y[t][d] = sum_c pre[t][c] x[t][c][d], columns d = ith, ith + nth, ... of every token */
static void collapse_task(void * ctx, int ith, int nth) {
    const mhc_task * t = ctx;
    for (int64_t i = 0; i < t->n_tok; i++) {
        const float * pre = t->mix + i * t->n_mix, * x = t->x + i * t->hc * t->n;
        for (int64_t d = ith; d < t->n; d += nth) {
            float sum = 0.0f;
            for (int64_t c = 0; c < t->hc; c++) {
                sum += pre[c] * x[c * t->n + d];
            }
            t->y[i * t->n + d] = sum;
        }
    }
}

void rm_cpu_mhc_collapse(rm_pool * pool, float * y, const float * h, const float * mix, int64_t n_mix, int64_t n_tok,
                         int64_t hc, int64_t n) {
    mhc_task t = {.y = y, .x = h, .mix = mix, .n_tok = n_tok, .hc = hc, .n_mix = n_mix, .n = n};
    rm_pool_run(pool, collapse_task, &t);
}

/* h[t][k][d] = post[t][k] b[t][d] + sum_j comb[t][j][k] h[t][j][d], in place column by column */
static void expand_task(void * ctx, int ith, int nth) {
    const mhc_task * t = ctx;
    const int64_t hc = t->hc;
    float col[64];   /* hc <= 64 (the loader's range) */
    for (int64_t i = 0; i < t->n_tok; i++) {
        const float * post = t->mix + i * t->n_mix + hc, * comb = post + hc;
        float * h = t->y + i * hc * t->n;
        for (int64_t d = ith; d < t->n; d += nth) {
            for (int64_t j = 0; j < hc; j++) {
                col[j] = h[j * t->n + d];
            }
            for (int64_t k = 0; k < hc; k++) {
                float sum = post[k] * t->x[i * t->n + d];
                for (int64_t j = 0; j < hc; j++) {
                    sum += comb[j * hc + k] * col[j];
                }
                h[k * t->n + d] = sum;
            }
        }
    }
}

void rm_cpu_mhc_expand(rm_pool * pool, float * h, const float * b, const float * mix, int64_t n_tok, int64_t hc,
                       int64_t n) {
    mhc_task t = {.y = h, .x = b, .mix = mix, .n_tok = n_tok, .hc = hc, .n_mix = (2 + hc) * hc, .n = n};
    rm_pool_run(pool, expand_task, &t);
}
