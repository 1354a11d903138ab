/* attention.c - the plain attention layer (attention.h): q, k and v projected for the step's
 * rows, q/k norms and biases, then per sequence RoPE, its rows into its own session's cache (a
 * sliding layer's ring, a hybrid's attention layers only) and the backend's attention op; the
 * hybrids' output gate around it. */
#include "attention.h"

#include "deltanet.h"
#include "profile.h"
#include "qsa.h"
#include "types.h"

static void matmul(rm_session * s, const rm_weight * w, const float * x, int64_t x_stride, int32_t n,
                   float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, 0, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

/* Bytes of a position's K and V rows of layer kind `kind` in s's cache types. */
static void kv_row_bytes(const rm_session * s, uint32_t kind, uint64_t * k_row, uint64_t * v_row) {
    const rm_hparams * hp = &s->m->hp;
    if (hp->kv_lora_rank > 0) {   /* MLA: one latent per position, no V */
        *k_row = s->k_row_bytes;
        *v_row = 0;
        return;
    }
    if (kind & RM_LAYER_MHC) {   /* DeepSeek-V4: one key head that is also the value */
        *k_row = rm_kv_row_bytes(s->type_k, hp->head_dim);
        *v_row = 0;
        return;
    }
    const rm_attn_shape sh = rm_attn_shape_of(hp, kind);
    *k_row = rm_kv_row_bytes(s->type_k, (int64_t) sh.n_head_kv * sh.head_dim);
    *v_row = rm_kv_row_bytes(s->type_v, (int64_t) sh.n_head_kv * sh.head_dim_v);
}

void rm_attention_kv_layout(rm_session * s) {
    const rm_model * m = s->m;
    const int32_t r = rm_kv_ring_rows(s->n_ctx, s->n_batch, m->hp.n_swa);
    uint64_t k_off = 0, v_off = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        rm_kv_place * p = &s->kv_at[il];
        *p = (rm_kv_place) {0};
        kv_row_bytes(s, m->layers[il].kind, &p->k_row, &p->v_row);
        if (s->hy) {   /* a hybrid caches its attention layers only, all of one shape */
            if (s->hy->kv_index[il] >= 0) {
                p->rows = s->n_ctx;
                p->k_off = (uint64_t) s->hy->kv_index[il] * s->n_ctx * p->k_row;
                p->v_off = (uint64_t) s->hy->kv_index[il] * s->n_ctx * p->v_row;
            }
            continue;
        }
        const int slides = m->hp.n_swa > 0 && (m->layers[il].kind & RM_LAYER_ATTN_SLIDING);
        p->ring = slides ? r : 0;
        p->rows = slides ? r : s->n_ctx;
        p->k_off = k_off, p->v_off = v_off;
        k_off += (uint64_t) p->rows * p->k_row;
        v_off += (uint64_t) p->rows * p->v_row;
    }
}

/* q/k normalisation: per head (ne = {head_dim}) or over the whole projection. */
static void qk_norm(rm_session * s, float * y, const rm_weight * w, int32_t n, int32_t n_head, int64_t D) {
    const rm_model * m = s->m;
    if (m->arch->qk_norm == RM_QK_NORM_PER_HEAD) {
        s->be->ops->rmsnorm(s->be, y, y, w, (int64_t) n * n_head, D, m->hp.rms_eps);
    } else {
        s->be->ops->rmsnorm(s->be, y, y, w, n, (int64_t) n_head * D, m->hp.rms_eps);
    }
}

void rm_cache_append(rm_session * s, void * cache, int32_t type, uint64_t row_bytes, const float * x, int32_t n,
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
    const rm_attn_shape sh = rm_attn_shape_of(hp, L->kind);
    const int64_t Q = (int64_t) sh.n_head * sh.head_dim, KV = (int64_t) sh.n_head_kv * sh.head_dim;
    const int64_t QV = (int64_t) sh.n_head * sh.head_dim_v, KVV = (int64_t) sh.n_head_kv * sh.head_dim_v;
    const int32_t n = run->n, pos = run->pos;
    float * q = s->q + (int64_t) run->row0 * Q, * k = s->k + (int64_t) run->row0 * KV;
    const float * v = s->v + (int64_t) run->row0 * KVV;
    const int neox = m->arch->rope == RM_ROPE_NEOX;
    if (hp->rope_yarn_factor > 0.0f) {   /* the rows that read rope.scaling.factor run YaRN */
        rm_rope_yarn y;
        rm_rope_yarn_of(hp, &y);
        be->ops->rope_yarn(be, q, n, sh.n_head, sh.head_dim, sh.n_rot, pos, &y, neox);
        be->ops->rope_yarn(be, k, n, sh.n_head_kv, sh.head_dim, sh.n_rot, pos, &y, neox);
    } else if (m->rope_freqs.data && !(L->kind & RM_LAYER_ATTN_SLIDING)) {   /* Gemma 4's full layers */
        be->ops->rope_div(be, q, n, sh.n_head, sh.head_dim, sh.n_rot, pos, sh.rope_base, neox, &m->rope_freqs);
        be->ops->rope_div(be, k, n, sh.n_head_kv, sh.head_dim, sh.n_rot, pos, sh.rope_base, neox, &m->rope_freqs);
    } else {
        be->ops->rope(be, q, n, sh.n_head, sh.head_dim, sh.n_rot, pos, sh.rope_base, neox);
        be->ops->rope(be, k, n, sh.n_head_kv, sh.head_dim, sh.n_rot, pos, sh.rope_base, neox);
    }
    const rm_kv_place p = rm_attention_kv_place(o, il);
    void * kc = (uint8_t *) o->k_cache + p.k_off;
    void * vc = (uint8_t *) o->v_cache + p.v_off;
    rm_cache_append(s, kc, o->type_k, p.k_row, k, n, KV, p.ring, pos);
    rm_cache_append(s, vc, o->type_v, p.v_row, v, n, KVV, p.ring, pos);
    rm_attn_args aa = {q, kc, vc, s->attn + (int64_t) run->row0 * QV, n, pos, sh.n_head, sh.n_head_kv, sh.head_dim,
                       L->kind & RM_LAYER_ATTN_SLIDING ? hp->n_swa : 0, L->sinks.data ? &L->sinks : NULL, p.ring,
                       o->type_k, o->type_v, o->attn_scratch, m->arch->flags & RM_ARCH_KQ_UNSCALED ? 1.0f : 0.0f,
                       sh.head_dim_v, o->attn_scratch_floats, 0};
    if (rm_qsa_on(L)) {
        rm_qsa_attention(s, il, run, &aa);
    } else {
        be->ops->attention(be, &aa);
    }
}

void rm_attention_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const rm_attn_shape sh = rm_attn_shape_of(hp, L->kind);
    const int64_t E = hp->n_embd, Q = (int64_t) sh.n_head * sh.head_dim, KV = (int64_t) sh.n_head_kv * sh.head_dim;
    const int64_t QV = (int64_t) sh.n_head * sh.head_dim_v, KVV = (int64_t) sh.n_head_kv * sh.head_dim_v;
    const int gated = (L->kind & RM_LAYER_ATTN_GATE) != 0;   /* wq gives q and its output gate */
    const int v_from_k = !L->wv.data;                         /* Gemma 4's full layers: V is K's projection */
    float * qy = gated ? s->hy->qg : s->q;
    const int64_t QY = gated ? 2 * Q : Q;
    if (!(m->arch->flags & RM_ARCH_HYPER)) {   /* else the hyper-connections gave xn */
        be->ops->rmsnorm(be, s->xn, s->x, &L->attn_norm, n, E, hp->rms_eps);
    }
    if (rm_qsa_on(L)) rm_qsa_project(s, il, n);
    const rm_mm_item qkv[3] = {{{&L->wq, 0, s->xn, E, n, qy, QY, 0}, NULL, 0},   /* one dispatch, the input */
                               {{&L->wk, 0, s->xn, E, n, s->k, KV, 0}, NULL, 0},  /* quantized once */
                               {{&L->wv, 0, s->xn, E, n, s->v, KVV, 0}, NULL, 0}};
    rm_matmul_many(be, qkv, v_from_k ? 2 : 3);
    if (v_from_k) be->ops->copy(be, s->v, s->k, sizeof(float) * (uint64_t) n * (uint64_t) KV);
    if (gated) rm_attn_gate_split(s, n);
    if (L->bq.data) be->ops->add_bias(be, s->q, &L->bq, n, Q);
    if (L->bk.data) be->ops->add_bias(be, s->k, &L->bk, n, KV);
    if (L->bv.data) be->ops->add_bias(be, s->v, &L->bv, n, KVV);
    if (m->arch->qk_norm != RM_QK_NORM_NONE && L->q_norm.data) {   /* GLM-4.5's are optional */
        qk_norm(s, s->q, &L->q_norm, n, sh.n_head, sh.head_dim);
        qk_norm(s, s->k, &L->k_norm, n, sh.n_head_kv, sh.head_dim);
    }
    if (L->kind & RM_LAYER_V_NORM) {   /* per head, without a weight */
        be->ops->rmsnorm(be, s->v, s->v, NULL, (int64_t) n * sh.n_head_kv, sh.head_dim_v, hp->rms_eps);
    }
    if (hp->v_scale > 0.0f && hp->v_scale != 1.0f) {   /* MiMo's, on the values before they are cached */
        be->ops->scale(be, s->v, (int64_t) n * KVV, hp->v_scale);
    }
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    for (int32_t r = 0; r < s->n_runs; r++) {
        attention_run(s, il, &s->runs[r]);
    }
    if (gated) rm_attn_gate_apply(s, n);
    if (L->kind & RM_LAYER_HEAD_GATE) {   /* each head's output times sigmoid(its gate of xn); k is free now */
        matmul(s, &L->attn_gate, s->xn, E, n, s->k, sh.n_head, 0);
        be->ops->mul_sigmoid(be, s->attn, s->k, (int64_t) n * sh.n_head, sh.head_dim_v);
    }
    rm_prof_mark(s, RM_PROF_ATTN);
    if (L->kind & RM_LAYER_POST_NORM) {   /* x += norm(Wo attn): xn is free once q, k and v are projected */
        matmul(s, &L->wo, s->attn, QV, n, s->xn, E, 0);
        be->ops->rmsnorm(be, s->xn, s->xn, &L->attn_post_norm, n, E, hp->rms_eps);
        be->ops->add(be, s->x, s->xn, (int64_t) n * E);
    } else {
        matmul(s, &L->wo, s->attn, QV, n, s->x, E, 1);   /* x += Wo attn */
    }
    if (L->bo.data) be->ops->add_bias(be, s->x, &L->bo, n, E);
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
