/* mhc.c - manifold-constrained hyper-connections (mhc.h) composed of backend ops. Per token, with
 * X the hc streams (rows of n_embd) and l = fn . rmsnorm(X as one row):
 *   input = norm(sum_c pre_c X_c)                         pre from l (mhc_weights)
 *   X_k   = post_k block(input) + sum_j comb_jk X_j       post, comb from l
 * (transformers' DeepseekV4HyperConnection and DeepseekV4DecoderLayer; the head's
 * DeepseekV4HyperHead has pre alone). */
#include "mhc.h"

#include "backend.h"
#include "model.h"

typedef struct mhc_bufs {
    float * h;                    /* rows of hc * n_embd: the streams (hyper.c's place: rm_hc_begin fills them) */
    float * hn;                   /* rows of hc * n_embd: the streams RMS-normed as one row */
    float * mix;                  /* rows of (2 + hc) * hc: the weights */
} mhc_bufs;

static mhc_bufs bufs_of(const rm_session * s) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t B = s->n_batch, W = (int64_t) hp->hc_count * hp->n_embd;
    return (mhc_bufs) {s->hc, s->hc + B * W, s->hc + 2 * B * W};
}

void rm_mhc_mix_in(rm_session * s, const rm_mhc * w, const rm_weight * norm, int64_t n_mix, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, HC = hp->hc_count, W = HC * E;
    const mhc_bufs b = bufs_of(s);
    be->ops->rmsnorm(be, b.hn, b.h, NULL, n, W, hp->rms_eps);
    rm_matmul_args a = {&w->fn, 0, b.hn, W, n, b.mix, n_mix, 0};
    be->ops->matmul(be, &a);
    be->ops->mhc_weights(be, b.mix, &w->scale, &w->base, n, HC, n_mix, hp->hc_sinkhorn_iters, hp->hc_eps);
    be->ops->mhc_collapse(be, s->xn, b.h, b.mix, n_mix, n, HC, E);
    be->ops->rmsnorm(be, s->xn, s->xn, norm, n, E, hp->rms_eps);
    be->ops->zero(be, s->x, sizeof(float) * (uint64_t) n * (uint64_t) E);
}

void rm_mhc_add_out(rm_session * s, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const mhc_bufs b = bufs_of(s);
    s->be->ops->mhc_expand(s->be, b.h, s->x, b.mix, n, hp->hc_count, hp->n_embd);
}
