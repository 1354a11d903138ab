/* cpu/csa.c - DeepSeek-V4's lightning indexer in the CSA layers on the CPU backend (backend.h's
 * csa_select): the threads take tokens in turn, each scoring the entries its token sees and keeping
 * the top_k best; a score sums the heads in order, so a token picks alike in a prefill and in a
 * decode. */
#include <math.h>

#include "cpu_ops.h"

uint64_t rm_csa_host_floats(int32_t ratio, int32_t n_ctx, int32_t n_threads) {
    return (uint64_t) n_threads * 2 * ((uint64_t) (n_ctx / (ratio > 0 ? ratio : 1)) + 1);
}

typedef struct csa_task {
    const rm_csa_args * a;
    int32_t             room;     /* floats of a thread's scores (and as many of its copy) */
} csa_task;

static void pick_task(void * ctx, int ith, int nth) {
    const csa_task * t = ctx;
    const rm_csa_args * a = t->a;
    const int32_t D = a->head_dim, H = a->n_head, K = a->top_k;
    const float q_scale = 1.0f / sqrtf((float) D), w_scale = 1.0f / sqrtf((float) H);
    float * scores = a->scratch_host + (int64_t) ith * 2 * t->room, * copy = scores + t->room;
    for (int32_t i = ith; i < a->n_tok; i += nth) {
        const int32_t nb = (a->pos0 + i + 1) / a->ratio;
        int32_t * sel = a->sel_host + (int64_t) i * K;
        if (nb <= K) {   /* every entry it sees */
            for (int32_t j = 0; j < K; j++) {
                sel[j] = j < nb ? j : -1;
            }
            continue;
        }
        const float * q = a->q + (int64_t) i * H * D, * w = a->w + (int64_t) i * H;
        for (int32_t s = 0; s < nb; s++) {
            const float * k = a->keys + (int64_t) s * D;
            float sum = 0.0f;
            for (int32_t h = 0; h < H; h++) {
                float dot = 0.0f;
                for (int32_t d = 0; d < D; d++) {
                    dot += q[(int64_t) h * D + d] * k[d];
                }
                sum += (dot > 0.0f ? dot * q_scale : 0.0f) * (w[h] * w_scale);
            }
            scores[s] = sum;
        }
        rm_cpu_top_k(scores, copy, nb, K, sel);
    }
}

void rm_cpu_csa_select(rm_pool * pool, const rm_csa_args * a) {
    const int32_t last = a->pos0 + a->n_tok;   /* the entries the last token sees, at most */
    csa_task t = {a, last / (a->ratio > 0 ? a->ratio : 1) + 1};
    rm_pool_run(pool, pick_task, &t);
}
