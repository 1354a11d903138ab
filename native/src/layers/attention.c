/* attention.c - the plain attention layer (attention.h): q, k and v projected for the step's
 * rows, q/k norms and biases, then per sequence RoPE, its rows into its own session's cache (a
 * sliding layer's ring, a hybrid's attention layers only) and the backend's attention op; the
 * hybrids' output gate around it. */
#include "attention.h"

#include "deltanet.h"
#include "profile.h"
#include "types.h"

static void matmul(rm_session * s, const rm_weight * w, const float * x, int64_t x_stride, int32_t n,
                   float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, 0, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

int64_t rm_attention_kv_place(const rm_session * s, int il, int32_t * ring) {
    const rm_model * m = s->m;
    const int32_t r = rm_kv_ring_rows(s->n_ctx, s->n_batch, m->hp.n_swa);
    int64_t row0 = 0;
    *ring = 0;
    for (int l = 0; l <= il; l++) {
        const int slides = m->hp.n_swa > 0 && (m->layers[l].kind & RM_LAYER_ATTN_SLIDING);
        if (l == il) {
            *ring = slides ? r : 0;
        } else {
            row0 += slides ? r : s->n_ctx;
        }
    }
    return row0;
}

/* q/k normalisation: per head (ne = {head_dim}) or over the whole projection. */
static void qk_norm(rm_session * s, float * y, const rm_weight * w, int32_t n, int32_t n_head) {
    const rm_model * m = s->m;
    const int64_t D = m->hp.head_dim;
    if (m->arch->qk_norm == RM_QK_NORM_PER_HEAD) {
        s->be->ops->rmsnorm(s->be, y, y, w, (int64_t) n * n_head, D, m->hp.rms_eps);
    } else {
        s->be->ops->rmsnorm(s->be, y, y, w, n, (int64_t) n_head * D, m->hp.rms_eps);
    }
}

/* The n new rows of x (width floats each) into a layer's cache at positions pos.. (wrapping
 * round a ring; n <= n_batch < ring, so at most once), as rows of row_bytes of type: F32 copied,
 * others converted row by row (the CPU backend alone has them: host memory). */
static void cache_append(rm_session * s, void * cache, int32_t type, uint64_t row_bytes, const float * x, int32_t n,
                         int64_t width, int32_t ring, int32_t pos) {
    const int64_t at = ring ? pos % ring : pos;
    const int64_t first = ring && at + n > ring ? ring - at : n;
    if (type != RM_TYPE_F32) {
        const rm_type_traits * t = rm_type_traits_get(type);
        for (int32_t i = 0; i < n; i++) {
            const int64_t row = i < first ? at + i : i - first;
            t->from_float(x + (int64_t) i * width, (uint8_t *) cache + (uint64_t) row * row_bytes, width);
        }
        return;
    }
    s->be->ops->copy(s->be, (uint8_t *) cache + (uint64_t) at * row_bytes, x, row_bytes * (uint64_t) first);
    if (first < n) {
        s->be->ops->copy(s->be, cache, x + first * width, row_bytes * (uint64_t) (n - first));
    }
}

/* RoPE, cache append and attention for one sequence's rows of the batch (q, k, v already
 * projected), over its own session's cache. */
static void attention_run(rm_session * s, int il, const rm_seq_run * run) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    rm_session * o = run->s;   /* whose cache */
    const int64_t Q = (int64_t) hp->n_head * hp->head_dim, KV = (int64_t) hp->n_head_kv * hp->head_dim;
    const int32_t n = run->n, pos = run->pos;
    float * q = s->q + (int64_t) run->row0 * Q, * k = s->k + (int64_t) run->row0 * KV;
    const float * v = s->v + (int64_t) run->row0 * KV;
    const int neox = m->arch->rope == RM_ROPE_NEOX;
    if (hp->rope_yarn_factor > 0.0f) {   /* the rows that read rope.scaling.factor run YaRN */
        rm_rope_yarn y;
        rm_rope_yarn_of(hp, &y);
        be->ops->rope_yarn(be, q, n, hp->n_head, hp->head_dim, hp->n_rot, pos, &y, neox);
        be->ops->rope_yarn(be, k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, pos, &y, neox);
    } else {
        be->ops->rope(be, q, n, hp->n_head, hp->head_dim, hp->n_rot, pos, hp->rope_base, neox);
        be->ops->rope(be, k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, pos, hp->rope_base, neox);
    }
    int32_t ring = 0;
    /* a hybrid caches its attention layers only; a sliding-window layer keeps a ring */
    const int64_t row0 = o->hy ? (int64_t) o->hy->kv_index[il] * o->n_ctx : rm_attention_kv_place(o, il, &ring);
    void * kc = (uint8_t *) o->k_cache + (uint64_t) row0 * o->k_row_bytes;
    void * vc = (uint8_t *) o->v_cache + (uint64_t) row0 * o->v_row_bytes;
    cache_append(s, kc, o->type_k, o->k_row_bytes, k, n, KV, ring, pos);
    cache_append(s, vc, o->type_v, o->v_row_bytes, v, n, KV, ring, pos);
    rm_attn_args aa = {q, kc, vc, s->attn + (int64_t) run->row0 * Q, n, pos, hp->n_head, hp->n_head_kv, hp->head_dim,
                       L->kind & RM_LAYER_ATTN_SLIDING ? hp->n_swa : 0, L->sinks.data ? &L->sinks : NULL, ring,
                       o->type_k, o->type_v, o->kv_tiles};
    be->ops->attention(be, &aa);
}

void rm_attention_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, Q = (int64_t) hp->n_head * hp->head_dim, KV = (int64_t) hp->n_head_kv * hp->head_dim;
    const int gated = (L->kind & RM_LAYER_ATTN_GATE) != 0;   /* wq gives q and its output gate */
    float * qy = gated ? s->hy->qg : s->q;
    const int64_t QY = gated ? 2 * Q : Q;
    be->ops->rmsnorm(be, s->xn, s->x, &L->attn_norm, n, E, hp->rms_eps);
    if (be->ops->matmul_many) {   /* Q, K and V in one dispatch, the input quantized once */
        const rm_mm_item qkv[3] = {{{&L->wq, 0, s->xn, E, n, qy, QY, 0}, NULL, 0},
                                   {{&L->wk, 0, s->xn, E, n, s->k, KV, 0}, NULL, 0},
                                   {{&L->wv, 0, s->xn, E, n, s->v, KV, 0}, NULL, 0}};
        be->ops->matmul_many(be, qkv, 3);
    } else {
        matmul(s, &L->wq, s->xn, E, n, qy, QY, 0);
        matmul(s, &L->wk, s->xn, E, n, s->k, KV, 0);
        matmul(s, &L->wv, s->xn, E, n, s->v, KV, 0);
    }
    if (gated) rm_attn_gate_split(s, n);
    if (L->bq.data) be->ops->add_bias(be, s->q, &L->bq, n, Q);
    if (L->bk.data) be->ops->add_bias(be, s->k, &L->bk, n, KV);
    if (L->bv.data) be->ops->add_bias(be, s->v, &L->bv, n, KV);
    if (m->arch->qk_norm != RM_QK_NORM_NONE && L->q_norm.data) {   /* GLM-4.5's are optional */
        qk_norm(s, s->q, &L->q_norm, n, hp->n_head);
        qk_norm(s, s->k, &L->k_norm, n, hp->n_head_kv);
    }
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    for (int32_t r = 0; r < s->n_runs; r++) {
        attention_run(s, il, &s->runs[r]);
    }
    if (gated) rm_attn_gate_apply(s, n);
    rm_prof_mark(s, RM_PROF_ATTN);
    matmul(s, &L->wo, s->attn, Q, n, s->x, E, 1);   /* x += Wo attn */
    if (L->bo.data) be->ops->add_bias(be, s->x, &L->bo, n, E);
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}

/* Token embeddings are dequantized on the host (the table stays in host memory) and uploaded. */
