/* qsa.c - QSA sparse attention (qsa.h): the indexer's projections and key cache, its pick by the
 * backend's qsa_select, and the attention op over each token's kept positions.
 *
 * A token whose complete blocks are all kept (at most top_k / ratio of them) attends as in plain
 * causal attention, so the tokens before the first that drops a block run as one step; each later
 * token gets its kept positions' K and V rows gathered, in the order of their positions (the
 * blocks it keeps, then its tail), and attends to all of them. */
#include "qsa.h"

#include <stdlib.h>

#include "attention.h"
#include "deltanet.h"
#include "status.h"
#include "threads.h"

static int32_t ratio_of(const rm_layer * L) { return (int32_t) L->qsa_ratio; }

int rm_qsa_new(rm_session * s) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    int32_t lo = 0, hi = 0, n_attn = 0;   /* the narrowest and widest blocks */
    for (int il = 0; il < hp->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        n_attn += s->hy && s->hy->kv_index[il] >= 0;
        if (rm_qsa_on(L)) {
            lo = lo == 0 || ratio_of(L) < lo ? ratio_of(L) : lo;
            hi = ratio_of(L) > hi ? ratio_of(L) : hi;
        }
    }
    if (hi == 0) {
        return 1;
    }
    if (!s->be->ops->qsa_select || !s->hy) {
        rm_fail(RM_E_NEEDS_CPU, "rm_session_new: QSA sparse attention (its indexer) runs on the CPU backend only, "
                "and this session's backend is %s", s->be->ops->name);
        return 0;
    }
    rm_qsa * q = calloc(1, sizeof(*q));
    if (!q) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory");
        return 0;
    }
    s->qsa = q;
    rm_backend * be = s->be;
    const uint64_t D = (uint64_t) hp->index_head_dim, B = (uint64_t) s->n_batch;
    const int64_t keep = (int64_t) hp->index_top_k + hi - 1;
    q->rows = keep < s->n_ctx ? (int32_t) keep : s->n_ctx;
    q->top_k_blocks = hp->index_top_k / lo;
    q->keys = be->ops->alloc(be, sizeof(float) * (uint64_t) n_attn * (uint64_t) s->n_ctx * D);
    q->q = be->ops->alloc(be, sizeof(float) * B * (uint64_t) hp->index_n_head * D);
    q->k = be->ops->alloc(be, sizeof(float) * B * D);
    q->kg = be->ops->alloc(be, (uint64_t) q->rows * s->k_row_bytes);
    q->vg = be->ops->alloc(be, (uint64_t) q->rows * s->v_row_bytes);
    q->sel = calloc(B * (uint64_t) (q->top_k_blocks > 0 ? q->top_k_blocks : 1), sizeof(int32_t));
    q->host = calloc(rm_qsa_host_floats(hp->index_head_dim, lo, s->n_ctx, rm_pool_size(m->pool)), sizeof(float));
    if (!q->keys || !q->q || !q->k || !q->kg || !q->vg || !q->sel || !q->host) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for QSA's indexer keys of %d positions", s->n_ctx);
        return 0;
    }
    return 1;
}

void rm_qsa_free(rm_session * s) {
    rm_qsa * q = s->qsa;
    if (!q) {
        return;
    }
    void * const dev[] = {q->keys, q->q, q->k, q->kg, q->vg};
    rm_release_each(s->be, dev, sizeof(dev) / sizeof(dev[0]));
    free(q->sel);
    free(q->host);
    free(q);
    s->qsa = NULL;
}

uint64_t rm_qsa_key_bytes(const rm_session * s, int il) {
    return rm_qsa_on(&s->m->layers[il]) ? sizeof(float) * (uint64_t) s->m->hp.index_head_dim : 0;
}

float * rm_qsa_keys_of(const rm_session * s, int il) {
    return s->qsa->keys + (int64_t) s->hy->kv_index[il] * s->n_ctx * s->m->hp.index_head_dim;
}

void rm_qsa_project(rm_session * s, int il, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, D = hp->index_head_dim, QI = (int64_t) hp->index_n_head * D;
    rm_matmul_args wq = {&L->qsa_wq, 0, s->xn, E, n, s->qsa->q, QI, 0};
    rm_matmul_args wk = {&L->qsa_wk, 0, s->xn, E, n, s->qsa->k, D, 0};
    be->ops->matmul(be, &wq);
    be->ops->matmul(be, &wk);
    be->ops->rmsnorm(be, s->qsa->q, s->qsa->q, &L->qsa_q_norm, (int64_t) n * hp->index_n_head, D, hp->rms_eps);
}

void rm_qsa_attention(rm_session * s, int il, const rm_seq_run * run, const rm_attn_args * aa) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    rm_session * o = run->s;   /* whose caches */
    rm_qsa * q = s->qsa;
    const int32_t D = hp->index_head_dim, NI = hp->index_n_head, n = run->n, pos = run->pos;
    const int neox = m->arch->rope == RM_ROPE_NEOX;
    float * qi = q->q + (int64_t) run->row0 * NI * D;
    float * keys = rm_qsa_keys_of(o, il);
    be->ops->rope(be, qi, n, NI, D, hp->n_rot, pos, hp->rope_base, neox);
    be->ops->copy(be, keys + (int64_t) pos * D, q->k + (int64_t) run->row0 * D, sizeof(float) * (uint64_t) n * D);

    const int32_t ratio = ratio_of(L), K = hp->index_top_k / ratio;
    const int64_t first = ((int64_t) K + 1) * ratio - 1 - pos;   /* the first token that drops a block */
    const int32_t t0 = first < 0 ? 0 : first > n ? n : (int32_t) first;
    if (t0 > 0) {
        rm_attn_args a = *aa;
        a.n_tok = t0;
        be->ops->attention(be, &a);
    }
    if (t0 == n) {
        return;
    }
    const rm_qsa_args sa = {qi + (int64_t) t0 * NI * D, keys, &L->qsa_k_norm, n - t0, pos + t0, NI, D, hp->n_rot,
                            ratio, K, hp->rms_eps, hp->rope_base, neox, q->sel, q->host};
    be->ops->qsa_select(be, &sa);
    const rm_kv_place p = rm_attention_kv_place(o, il);
    const int64_t Q = (int64_t) aa->n_head * aa->head_dim, QV = (int64_t) aa->n_head * aa->head_dim_v;
    for (int32_t t = t0; t < n; t++) {
        const int32_t at = pos + t, nb = (at + 1) / ratio;
        const int32_t * sel = q->sel + (int64_t) (t - t0) * K;
        int32_t rows = 0;
        for (int32_t i = 0; i <= K; i++) {   /* the kept blocks, then the tail */
            const int32_t from = i < K ? sel[i] * ratio : nb * ratio, c = i < K ? ratio : at + 1 - nb * ratio;
            be->ops->copy(be, (uint8_t *) q->kg + (uint64_t) rows * p.k_row,
                          (const uint8_t *) aa->k_cache + (uint64_t) from * p.k_row, (uint64_t) c * p.k_row);
            be->ops->copy(be, (uint8_t *) q->vg + (uint64_t) rows * p.v_row,
                          (const uint8_t *) aa->v_cache + (uint64_t) from * p.v_row, (uint64_t) c * p.v_row);
            rows += c;
        }
        rm_attn_args a = *aa;
        a.q = aa->q + (int64_t) t * Q;
        a.out = aa->out + (int64_t) t * QV;
        a.n_tok = 1;
        a.pos0 = rows - 1;   /* it sees every gathered row */
        a.k_cache = q->kg;
        a.v_cache = q->vg;
        a.ring = 0;
        be->ops->attention(be, &a);
    }
}
