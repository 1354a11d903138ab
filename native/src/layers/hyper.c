/* hyper.c - hyper-connections (hyper.h) composed of backend ops. Per token, with X the hc streams
 * (rows of n_embd) and xh_c = rmsnorm(X_c) * norm_c:
 *   input  = (1/hc) sum_c sigmoid(up silu(down xh / hc))_c * xh_c
 *   X_c   += 2 sigmoid((inject xh)_c / hc) * block(input)
 * (transformers' Qwen4ExpTextGatedResidual; the output's mixer has no inject). */
#include "hyper.h"

#include "backend.h"
#include "model.h"

typedef struct hc_bufs {
    float * h;                    /* rows of hc * n_embd: the streams */
    float * xh;                   /* rows of hc * n_embd: the streams normed */
    float * gate;                 /* rows of hc * n_embd: the gate's logits */
    float * lo;                   /* rows of hc_low_rank */
    float * inj;                  /* rows of hc: the streams' weights' logits */
} hc_bufs;

static hc_bufs bufs_of(const rm_session * s) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t B = s->n_batch, W = (int64_t) hp->hc_count * hp->n_embd;
    hc_bufs b = {s->hc, s->hc + B * W, s->hc + 2 * B * W, s->hc + 3 * B * W, NULL};
    b.inj = b.lo + B * hp->hc_low_rank;
    return b;
}

float * rm_hc_streams(const rm_session * s) {
    return bufs_of(s).h;
}

void rm_hc_begin(rm_session * s, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t E = hp->n_embd, W = (int64_t) hp->hc_count * E;
    const hc_bufs b = bufs_of(s);
    for (int32_t c = 0; c < hp->hc_count; c++) {
        s->be->ops->copy_rows(s->be, b.h + c * E, W, s->x, E, E, n);
    }
}

void rm_hc_mix_in(rm_session * s, const rm_hc * w, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, HC = hp->hc_count, W = HC * E, R = hp->hc_low_rank;
    const hc_bufs b = bufs_of(s);
    be->ops->rmsnorm_groups(be, b.xh, b.h, &w->norm, (int64_t) n * HC, E, HC, hp->rms_eps);
    rm_matmul_args down = {&w->down, 0, b.xh, W, n, b.lo, R, 0};
    be->ops->matmul(be, &down);
    be->ops->silu(be, b.lo, (int64_t) n * R, 1.0f / (float) HC);
    rm_matmul_args up = {&w->up, 0, b.lo, R, n, b.gate, W, 0};
    be->ops->matmul(be, &up);
    be->ops->hc_mix(be, s->xn, b.xh, b.gate, n, HC, E);
    if (w->inject.data) {
        rm_matmul_args inj = {&w->inject, 0, b.xh, W, n, b.inj, HC, 0};
        be->ops->matmul(be, &inj);
    }
    be->ops->zero(be, s->x, sizeof(float) * (uint64_t) n * (uint64_t) E);
}

void rm_hc_add_out(rm_session * s, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const hc_bufs b = bufs_of(s);
    s->be->ops->hc_add(s->be, b.h, s->x, b.inj, n, hp->hc_count, hp->n_embd);
}
