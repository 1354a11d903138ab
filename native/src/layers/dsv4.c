/* dsv4.c - DeepSeek-V4's attention layer (dsv4.h) composed of backend ops. Per token, with xn the
 * streams' mix normed:
 *   r = q_a_norm(Wq_a xn)    q = rmsnorm_h(Wq_b r)    k = kv_norm(Wkv xn)    (RoPE on the last n_rot
 *                                                      dims of each head; the compressed layers' base)
 *   out = attention(q; the window's k, the entries) turned back by RoPE, then Wo_b (Wo_a per group)
 * and in a compressed layer its compressor's entries from the projections of each closed window,
 * in a CSA layer also its indexer's (its own compressor, queries from r, head weights from xn),
 * whose picks are the entries the token attends to (transformers' DeepseekV4Attention,
 * DeepseekV4CSACompressor, DeepseekV4HCACompressor, DeepseekV4Indexer). */
#include "dsv4.h"

#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "backend.h"
#include "model.h"
#include "profile.h"
#include "status.h"

static void matmul(rm_session * s, const rm_weight * w, int64_t mat, const float * x, int64_t x_stride, int32_t n,
                   float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, mat, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

/* The compressed layers' RoPE: YaRN at their own base where the file scales it, without YaRN's
 * magnitude (transformers' DeepseekV4Config sets its attention_factor to 1, llama.cpp's graph divides
 * it back out); 0: plain RoPE. */
static int compress_yarn(const rm_hparams * hp, rm_rope_yarn * y) {
    if (!(hp->rope_yarn_factor > 1.0f)) {
        return 0;
    }
    rm_hparams at = *hp;
    at.rope_base = hp->compress_rope_base;
    rm_rope_yarn_of(&at, y);
    y->mscale = 1.0f;
    return 1;
}

int rm_dsv4_new(rm_session * s) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    if (!(m->arch->flags & RM_ARCH_MHC)) {
        return 1;
    }
    rm_backend * be = s->be;
    if (!be->ops->dsv4_attention || !be->ops->csa_select || !be->ops->compress || !be->ops->mhc_weights) {
        rm_fail(RM_E_NEEDS_CPU, "rm_session_new: DeepSeek-V4's attention and hyper-connections run on the CPU backend "
                "only, and this session's backend is %s", be->ops->name);
        return 0;
    }
    rm_dsv4 * d = calloc(1, sizeof(*d));
    if (!d) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory");
        return 0;
    }
    s->dsv4 = d;
    d->has_yarn = compress_yarn(hp, &d->yarn);
    d->comp = calloc(2 * (size_t) hp->n_layer, sizeof(rm_dsv4_comp));
    if (!d->comp) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory");
        return 0;
    }
    int32_t lo = 0;   /* the smallest ratio: the most entries a token sees */
    int csa = 0, failed = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const int32_t ratio = rm_hp_ratio(hp, il);
        if (ratio <= 0) {
            continue;
        }
        const int two = (m->layers[il].kind & RM_LAYER_CSA) != 0;   /* CSA: two series, overlapping windows */
        lo = lo == 0 || ratio < lo ? ratio : lo;
        csa |= two;
        d->comp[2 * il] = (rm_dsv4_comp) {NULL, NULL, NULL, rm_dsv4_ring_rows(ratio, two), ratio,
                                          (two ? 2 : 1) * hp->head_dim, hp->head_dim};
        if (two) {
            d->comp[2 * il + 1] = (rm_dsv4_comp) {NULL, NULL, NULL, rm_dsv4_ring_rows(ratio, 1), ratio,
                                                  2 * hp->index_head_dim, hp->index_head_dim};
        }
        for (int j = 0; j < 1 + two; j++) {
            rm_dsv4_comp * c = &d->comp[2 * il + j];
            const uint64_t ring = sizeof(float) * (uint64_t) c->ring * (uint64_t) c->width;
            c->kv = be->ops->alloc(be, ring);
            c->gate = be->ops->alloc(be, ring);
            c->entries = be->ops->alloc(be, sizeof(float) * (uint64_t) rm_dsv4_entry_rows(s->n_ctx, ratio) *
                                            (uint64_t) c->head_dim);
            failed |= !c->kv || !c->gate || !c->entries;
            if (!failed) {   /* a saved state holds the rings whole */
                be->ops->zero(be, c->kv, ring);
                be->ops->zero(be, c->gate, ring);
            }
        }
    }
    const uint64_t f = sizeof(float), B = (uint64_t) s->n_batch;
    const int32_t threads = rm_pool_size(m->pool);
    d->q_res = be->ops->alloc(be, f * B * (uint64_t) hp->q_lora_rank);
    d->o_mid = be->ops->alloc(be, f * B * (uint64_t) hp->o_groups * (uint64_t) hp->o_lora_rank);
    d->attn_host = calloc(rm_dsv4_attn_host_floats(hp->n_swa, lo > 0 ? lo : s->n_ctx, s->n_ctx, threads), sizeof(float));
    failed |= !d->q_res || !d->o_mid || !d->attn_host;
    if (lo > 0) {
        d->ckv = be->ops->alloc(be, f * B * 2 * (uint64_t) hp->head_dim);
        d->cgate = be->ops->alloc(be, f * B * 2 * (uint64_t) hp->head_dim);
        failed |= !d->ckv || !d->cgate;
    }
    if (csa) {
        const uint64_t IQ = (uint64_t) hp->index_n_head * (uint64_t) hp->index_head_dim;
        d->ikv = be->ops->alloc(be, f * B * 2 * (uint64_t) hp->index_head_dim);
        d->igate = be->ops->alloc(be, f * B * 2 * (uint64_t) hp->index_head_dim);
        d->iq = be->ops->alloc(be, f * B * IQ);
        d->iw = be->ops->alloc(be, f * B * (uint64_t) hp->index_n_head);
        d->sel = calloc(B * (uint64_t) hp->index_top_k, sizeof(int32_t));
        d->csa_host = calloc(rm_csa_host_floats(lo, s->n_ctx, threads), sizeof(float));
        failed |= !d->ikv || !d->igate || !d->iq || !d->iw || !d->sel || !d->csa_host;
    }
    if (failed) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for DeepSeek-V4's compressed entries of %d positions",
                s->n_ctx);
        return 0;
    }
    return 1;
}

void rm_dsv4_free(rm_session * s) {
    rm_dsv4 * d = s->dsv4;
    if (!d) {
        return;
    }
    rm_backend * be = s->be;
    for (int il = 0; d->comp && il < 2 * s->m->hp.n_layer; il++) {
        void * const dev[] = {d->comp[il].kv, d->comp[il].gate, d->comp[il].entries};
        rm_release_each(be, dev, sizeof(dev) / sizeof(dev[0]));
    }
    void * const dev[] = {d->q_res, d->o_mid, d->ckv, d->cgate, d->ikv, d->igate, d->iq, d->iw};
    rm_release_each(be, dev, sizeof(dev) / sizeof(dev[0]));
    free(d->comp);
    free(d->sel);
    free(d->csa_host);
    free(d->attn_host);
    free(d);
    s->dsv4 = NULL;
}

/* Compressor i's ring bytes (each of kv and gate) and its entries' bytes at n_past; 0: no such. */
static const rm_dsv4_comp * comp_bytes(const rm_session * s, int32_t i, int32_t n_past, uint64_t * ring_bytes,
                                       uint64_t * entry_bytes) {
    const rm_dsv4_comp * c = s->dsv4 ? &s->dsv4->comp[i] : NULL;
    if (!c || c->width == 0) {
        return NULL;
    }
    *ring_bytes = sizeof(float) * (uint64_t) c->ring * (uint64_t) c->width;
    *entry_bytes = sizeof(float) * (uint64_t) (n_past / c->ratio) * (uint64_t) c->head_dim;
    return c;
}

uint64_t rm_dsv4_state_bytes(const rm_session * s, int32_t n_past) {
    uint64_t total = 0, rb, eb;
    for (int32_t i = 0; i < 2 * s->m->hp.n_layer; i++) {
        total += comp_bytes(s, i, n_past, &rb, &eb) ? 2 * rb + eb : 0;
    }
    return total;
}

uint8_t * rm_dsv4_state_save(const rm_session * s, uint8_t * at) {
    uint64_t rb, eb;
    for (int32_t i = 0; i < 2 * s->m->hp.n_layer; i++) {
        const rm_dsv4_comp * c = comp_bytes(s, i, s->n_past, &rb, &eb);
        if (c) {
            s->be->ops->download(s->be, at, c->kv, rb);
            s->be->ops->download(s->be, at + rb, c->gate, rb);
            s->be->ops->download(s->be, at + 2 * rb, c->entries, eb);
            at += 2 * rb + eb;
        }
    }
    return at;
}

const uint8_t * rm_dsv4_state_load(rm_session * s, const uint8_t * at, int32_t n_past) {
    uint64_t rb, eb;
    for (int32_t i = 0; i < 2 * s->m->hp.n_layer; i++) {
        const rm_dsv4_comp * c = comp_bytes(s, i, n_past, &rb, &eb);
        if (c) {
            s->be->ops->upload(s->be, c->kv, at, rb);
            s->be->ops->upload(s->be, c->gate, at + rb, rb);
            s->be->ops->upload(s->be, c->entries, at + 2 * rb, eb);
            at += 2 * rb + eb;
        }
    }
    return at;
}

int rm_dsv4_keeps(const rm_session * s, int32_t n_keep, int * il) {
    for (int32_t i = 0; s->dsv4 && i < 2 * s->m->hp.n_layer; i++) {
        const rm_dsv4_comp * c = &s->dsv4->comp[i];
        if (c->width == 0) {
            continue;
        }
        const int32_t start = n_keep / c->ratio * c->ratio;
        const int32_t from = c->width == 2 * c->head_dim && start >= c->ratio ? start - c->ratio : start;
        if (s->n_past - from > c->ring) {   /* the ring holds positions n_past - ring .. n_past - 1 */
            *il = i / 2;
            return 0;
        }
    }
    return 1;
}

/* RoPE on the last n_rot dims of n rows of n_head heads of head_dim at positions pos.., the yarn's
 * where given. */
static void rope_tail(rm_backend * be, float * x, int32_t n, int32_t n_head, int32_t head_dim, int32_t n_rot,
                      int32_t pos, float base, const rm_rope_yarn * yarn) {
    if (yarn) {
        be->ops->rope_yarn(be, x + (head_dim - n_rot), n, n_head, head_dim, n_rot, pos, yarn, 0);
    } else {
        be->ops->rope(be, x + (head_dim - n_rot), n, n_head, head_dim, n_rot, pos, base, 0);
    }
}

/* One compressor over a run's n rows at positions pos..: the entries of the windows that close in
 * them, then its ring keeps the last positions. A window begun before the run is compressed from
 * the ring (its rows put there first); the windows inside the run from the step's rows, the one
 * before the first of them (CSA's overlap) from the ring. */
static void compress_run(rm_session * s, const rm_dsv4_comp * c, const float * kv, const float * gate, int32_t n,
                         int32_t pos, const rm_weight * ape, const rm_weight * norm, float base,
                         const rm_rope_yarn * yarn) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int32_t R = c->ratio, ring = c->ring, D = c->head_dim;
    const int64_t W = c->width;
    const int overlap = W == 2 * (int64_t) D;
    rm_compress_args a = {0};
    a.ape = ape, a.norm = norm, a.ratio = R, a.head_dim = D, a.overlap = overlap, a.n_rot = hp->n_rot;
    a.rope_base = base, a.eps = hp->rms_eps, a.yarn = yarn;
    const int32_t end = pos + n, start = pos / R * R;
    int32_t i = 0;   /* the run's rows consumed */
    if (start < pos && start + R <= end) {   /* the window under way closes in this run */
        i = start + R - pos;
        rm_cache_append(s, c->kv, RM_TYPE_F32, sizeof(float) * (uint64_t) W, kv, i, W, ring, pos);
        rm_cache_append(s, c->gate, RM_TYPE_F32, sizeof(float) * (uint64_t) W, gate, i, W, ring, pos);
        const int32_t w = start / R;
        a.out = c->entries + (int64_t) w * D;
        a.kv = c->kv + (int64_t) (start % ring) * W, a.gate = c->gate + (int64_t) (start % ring) * W;
        a.prev_kv = overlap && w > 0 ? c->kv + (int64_t) ((start - R) % ring) * W : NULL;
        a.prev_gate = overlap && w > 0 ? c->gate + (int64_t) ((start - R) % ring) * W : NULL;
        a.n_win = 1, a.pos0 = start;
        be->ops->compress(be, &a);
    }
    const int32_t k = start < pos && i == 0 ? 0 : (n - i) / R;   /* windows inside the run */
    if (k > 0) {
        const int32_t w0 = (pos + i) / R;
        a.out = c->entries + (int64_t) w0 * D;
        a.kv = kv + (int64_t) i * W, a.gate = gate + (int64_t) i * W;
        a.prev_kv = overlap && w0 > 0 ? c->kv + (int64_t) (((w0 - 1) * R) % ring) * W : NULL;
        a.prev_gate = overlap && w0 > 0 ? c->gate + (int64_t) (((w0 - 1) * R) % ring) * W : NULL;
        a.n_win = k, a.pos0 = w0 * R;
        be->ops->compress(be, &a);
    }
    const int32_t keep = n < ring ? n : ring;
    rm_cache_append(s, c->kv, RM_TYPE_F32, sizeof(float) * (uint64_t) W, kv + (int64_t) (n - keep) * W, keep, W, ring,
                    end - keep);
    rm_cache_append(s, c->gate, RM_TYPE_F32, sizeof(float) * (uint64_t) W, gate + (int64_t) (n - keep) * W, keep, W,
                    ring, end - keep);
}

/* RoPE, the window's ring, the compressors, the indexer's pick and the attention for one run of
 * the step, over its own session's state. */
static void attention_run(rm_session * s, int il, const rm_seq_run * run) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const rm_session * o = run->s;   /* whose state */
    const rm_dsv4 * d = s->dsv4, * od = o->dsv4;
    const int32_t H = hp->n_head, HD = hp->head_dim, ROT = hp->n_rot, n = run->n, pos = run->pos, r0 = run->row0;
    const int32_t ratio = rm_hp_ratio(hp, il);
    const int csa = ratio > 0 && (L->kind & RM_LAYER_CSA);
    const float base = ratio > 0 ? hp->compress_rope_base : hp->rope_base;
    const rm_rope_yarn * yarn = ratio > 0 && d->has_yarn ? &d->yarn : NULL;
    const int64_t Q = (int64_t) H * HD;
    float * q = s->q + (int64_t) r0 * Q, * k = s->k + (int64_t) r0 * HD;
    rope_tail(be, q, n, H, HD, ROT, pos, base, yarn);
    rope_tail(be, k, n, 1, HD, ROT, pos, base, yarn);
    const rm_kv_place p = rm_attention_kv_place(o, il);
    const int32_t ring = p.ring ? p.ring : p.rows;
    float * kc = (float *) (void *) ((uint8_t *) o->k_cache + p.k_off);
    rm_cache_append(s, kc, RM_TYPE_F32, p.k_row, k, n, HD, ring, pos);
    const int32_t * sel = NULL;
    if (ratio > 0) {
        const rm_dsv4_comp * c = &od->comp[2 * il];
        compress_run(s, c, d->ckv + (int64_t) r0 * c->width, d->cgate + (int64_t) r0 * c->width, n, pos, &L->comp_ape,
                     &L->comp_norm, base, yarn);
    }
    if (csa) {
        const rm_dsv4_comp * c = &od->comp[2 * il + 1];
        compress_run(s, c, d->ikv + (int64_t) r0 * c->width, d->igate + (int64_t) r0 * c->width, n, pos,
                     &L->idx_comp_ape, &L->idx_comp_norm, base, yarn);
        const int32_t NI = hp->index_n_head, ID = hp->index_head_dim;
        float * iq = d->iq + (int64_t) r0 * NI * ID;
        rope_tail(be, iq, n, NI, ID, ROT, pos, base, yarn);
        const rm_csa_args ca = {iq, d->iw + (int64_t) r0 * NI, c->entries, n, pos, NI, ID, ratio, hp->index_top_k,
                                d->sel, d->csa_host};
        be->ops->csa_select(be, &ca);
        sel = d->sel;
    }
    rm_dsv4_attn_args aa = {s->attn + (int64_t) r0 * Q, q, kc, ring, ratio > 0 ? od->comp[2 * il].entries : NULL,
                            ratio, sel, hp->index_top_k, (const float *) L->sinks.data, n, pos, H, HD, hp->n_swa,
                            1.0f / sqrtf((float) HD), d->attn_host, ROT, base, yarn};
    be->ops->dsv4_attention(be, &aa);
}

void rm_dsv4_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const rm_dsv4 * d = s->dsv4;
    const int64_t E = hp->n_embd, HD = hp->head_dim, Q = (int64_t) hp->n_head * HD, QL = hp->q_lora_rank;
    const int32_t ratio = rm_hp_ratio(hp, il);
    const int csa = ratio > 0 && (L->kind & RM_LAYER_CSA);
    const int64_t CW = L->comp_wkv.ne[1], IW = L->idx_comp_wkv.ne[1], NI = hp->index_n_head;
    /* the products of xn in one dispatch, then those of the q low rank */
    const rm_mm_item from_x[7] = {
        {{&L->wq_a, 0, s->xn, E, n, d->q_res, QL, 0}, NULL, 0},
        {{&L->wkv, 0, s->xn, E, n, s->k, HD, 0}, NULL, 0},
        {{&L->comp_wkv, 0, s->xn, E, n, d->ckv, CW, 0}, NULL, 0},
        {{&L->comp_wgate, 0, s->xn, E, n, d->cgate, CW, 0}, NULL, 0},
        {{&L->idx_comp_wkv, 0, s->xn, E, n, d->ikv, IW, 0}, NULL, 0},
        {{&L->idx_comp_wgate, 0, s->xn, E, n, d->igate, IW, 0}, NULL, 0},
        {{&L->idx_proj, 0, s->xn, E, n, d->iw, NI, 0}, NULL, 0},
    };
    rm_matmul_many(be, from_x, csa ? 7 : ratio > 0 ? 4 : 2);
    be->ops->rmsnorm(be, d->q_res, d->q_res, &L->q_a_norm, n, QL, hp->rms_eps);
    const rm_mm_item from_r[2] = {
        {{&L->wq_b, 0, d->q_res, QL, n, s->q, Q, 0}, NULL, 0},
        {{&L->idx_wq_b, 0, d->q_res, QL, n, d->iq, NI * hp->index_head_dim, 0}, NULL, 0},
    };
    rm_matmul_many(be, from_r, csa ? 2 : 1);
    be->ops->rmsnorm(be, s->q, s->q, NULL, (int64_t) n * hp->n_head, HD, hp->rms_eps);
    be->ops->rmsnorm(be, s->k, s->k, &L->kv_norm, n, HD, hp->rms_eps);
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    for (int32_t r = 0; r < s->n_runs; r++) {
        attention_run(s, il, &s->runs[r]);
    }
    rm_prof_mark(s, RM_PROF_ATTN);
    /* the grouped output: each group's heads through its own block of Wo_a (a matrix of the 3-D
     * tensor the loader makes of it), then Wo_b over all groups; x += it */
    const int64_t G = hp->o_groups, OR = hp->o_lora_rank, GI = Q / G;
    rm_mm_item groups[64];
    for (int64_t g0 = 0; g0 < G; g0 += 64) {   /* the groups' products, up to 64 in a dispatch */
        const int32_t k = (int32_t) (G - g0 < 64 ? G - g0 : 64);
        for (int32_t j = 0; j < k; j++) {
            const int64_t g = g0 + j;
            groups[j] = (rm_mm_item) {{&L->wo_a, g, s->attn + g * GI, Q, n, d->o_mid + g * OR, G * OR, 0}, NULL, 0};
        }
        rm_matmul_many(be, groups, k);
    }
    matmul(s, &L->wo_b, 0, d->o_mid, G * OR, n, s->x, E, 1);
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
