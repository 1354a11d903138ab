/* cpu/qsa.c - QSA's indexer on the CPU backend (backend.h's qsa_select; the layer is in
 * layers/attention.c).
 *
 * The keys of the blocks the step's last token sees are made once (each block's the same for every
 * token that sees it), the threads taking blocks in turn; then the threads take tokens in turn, each
 * scoring its blocks and keeping the top_k best. Every float of a token's pick is computed in one
 * order whatever the step holds, so a token picks alike in a prefill and in a decode. */
#include <math.h>

#include "cpu_ops.h"

uint64_t rm_qsa_host_floats(int32_t head_dim, int32_t ratio, int32_t n_ctx, int32_t n_threads) {
    const uint64_t nb = (uint64_t) (n_ctx / (ratio > 0 ? ratio : 1)) + 1;
    return nb * (uint64_t) head_dim + (uint64_t) n_threads * 2 * nb;
}

typedef struct qsa_task {
    const rm_qsa_args * a;
    float *             bk;       /* nb rows of head_dim: the blocks' keys */
    float *             thread;   /* per thread: 2 * (nb + 1) floats */
    int32_t             nb;
} qsa_task;

/* K_b = rope(rmsnorm(mean_j k_j) * k_norm, b * ratio), blocks ith, ith + nth, ... */
static void block_keys_task(void * ctx, int ith, int nth) {
    const qsa_task * t = ctx;
    const rm_qsa_args * a = t->a;
    const int32_t D = a->head_dim;
    for (int32_t b = ith; b < t->nb; b += nth) {
        float * k = t->bk + (int64_t) b * D;
        const float * rows = a->keys + (int64_t) b * a->ratio * D;
        for (int32_t d = 0; d < D; d++) {
            float sum = 0.0f;
            for (int32_t j = 0; j < a->ratio; j++) {
                sum += rows[(int64_t) j * D + d];
            }
            k[d] = sum / (float) a->ratio;
        }
        rm_rmsnorm(k, k, (const float *) a->k_norm->data, D, a->eps);
        rm_rope(k, 1, D, a->n_rot, b * a->ratio, a->rope_base, a->neox);
    }
}

/* Tokens ith, ith + nth, ...: score their blocks, keep the top_k best, ascending. */
static void pick_task(void * ctx, int ith, int nth) {
    const qsa_task * t = ctx;
    const rm_qsa_args * a = t->a;
    const int32_t D = a->head_dim, K = a->top_k;
    const float inv = 1.0f / sqrtf((float) D);
    float * scores = t->thread + (int64_t) ith * 2 * (t->nb + 1), * copy = scores + t->nb + 1;
    for (int32_t i = ith; i < a->n_tok; i += nth) {
        const int32_t nb = (a->pos0 + i + 1) / a->ratio;
        if (nb <= K) {
            continue;   /* every block kept */
        }
        const float * q = a->q + (int64_t) i * a->n_head * D;
        for (int32_t b = 0; b < nb; b++) {
            const float * k = t->bk + (int64_t) b * D;
            float sum = 0.0f;
            for (int32_t h = 0; h < a->n_head; h++) {
                float dot = 0.0f;
                for (int32_t d = 0; d < D; d++) {
                    dot += q[(int64_t) h * D + d] * k[d];
                }
                sum += dot > 0.0f ? dot : 0.0f;
            }
            scores[b] = sum * inv;
        }
        if (K > 0) {
            rm_cpu_top_k(scores, copy, nb, K, a->sel_host + (int64_t) i * K);
        }
    }
}

void rm_cpu_qsa_select(rm_pool * pool, const rm_qsa_args * a) {
    const int32_t nb = (a->pos0 + a->n_tok) / a->ratio;   /* the blocks the last token sees */
    if (nb <= a->top_k) {
        return;   /* no token drops a block */
    }
    qsa_task t = {a, a->scratch_host, a->scratch_host + (int64_t) nb * a->head_dim, nb};
    rm_pool_run(pool, block_keys_task, &t);
    rm_pool_run(pool, pick_task, &t);
}
