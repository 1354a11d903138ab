/* deltanet.c - the Gated DeltaNet layer of Qwen3-Next and Qwen3.5 (as transformers'
 * Qwen3NextGatedDeltaNet computes it), its per-session state, and the sigmoid output gate of the
 * hybrid's full-attention layers. This file arranges the layer: projections, then the backend's
 * gdn op (gates, the convolution, the delta rule, the gated norm: cpu/deltanet.c, the math in
 * cpu/gdn.c), and the states between calls, which live on the session's backend. */
#include "deltanet.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

static rm_size_params params_of(const rm_model * m, int32_t n_batch) {
    return rm_size_params_of(&m->hp, 1, n_batch, 0);
}

rm_status rm_hybrid_new(const rm_model * m, rm_backend * be, int32_t n_batch, rm_hybrid ** out) {
    *out = NULL;
    if (m->hp.ssm_n_v <= 0) {
        return RM_OK;
    }
    rm_hybrid * h = calloc(1, sizeof(*h));
    if (!h) {
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory for the recurrent state");
    }
    h->be = be;
    const rm_size_params p = params_of(m, n_batch);
    uint64_t bytes[RM_RECURRENT_BUF_COUNT];
    rm_recurrent_buf_bytes(&p, bytes);
    float ** bufs[RM_RECURRENT_BUF_COUNT] = {
        [RM_RECURRENT_BUF_CONV_STATE] = &h->conv_state, [RM_RECURRENT_BUF_SSM_STATE] = &h->ssm_state,
        [RM_RECURRENT_BUF_MIXED] = &h->mixed,           [RM_RECURRENT_BUF_CONV_OUT] = &h->conv_out,
        [RM_RECURRENT_BUF_Z] = &h->z,                   [RM_RECURRENT_BUF_BA] = &h->ba,
        [RM_RECURRENT_BUF_G] = &h->g,                   [RM_RECURRENT_BUF_BETA] = &h->beta,
        [RM_RECURRENT_BUF_CORE] = &h->core,             [RM_RECURRENT_BUF_CONV_W] = &h->conv_w,
        [RM_RECURRENT_BUF_CHUNK] = &h->chunk,           [RM_RECURRENT_BUF_QG] = &h->qg,
        [RM_RECURRENT_BUF_GATE] = &h->gate,
    };
    int failed = !(h->lin_index = calloc((size_t) m->hp.n_layer, sizeof(int32_t))) ||
                 !(h->kv_index = calloc((size_t) m->hp.n_layer, sizeof(int32_t)));
    for (int i = 0; i < RM_RECURRENT_BUF_COUNT && !failed; i++) {   /* zeroed: the empty states */
        failed = !(*bufs[i] = be->ops->alloc(be, bytes[i] ? bytes[i] : 1));
    }
    if (failed) {
        rm_hybrid_free(h);
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory for the recurrent state of %d linear layers",
                       m->hp.n_layer_linear);
    }
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        h->ckpt_pos[i] = -1;
    }
    for (int32_t il = 0, n = 0, na = 0; il < m->hp.n_layer; il++) {
        const int linear = (m->layers[il].kind & RM_LAYER_ATTN_LINEAR) != 0;
        h->lin_index[il] = linear ? n++ : -1;
        h->kv_index[il] = linear ? -1 : na++;
    }
    *out = h;
    return RM_OK;
}

void rm_hybrid_free(rm_hybrid * h) {
    if (!h) {
        return;
    }
    float * bufs[] = {h->conv_state, h->ssm_state, h->mixed, h->conv_out, h->z, h->ba, h->g, h->beta,
                      h->core, h->conv_w, h->chunk, h->qg, h->gate};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        if (bufs[i]) {
            h->be->ops->release(h->be, bufs[i]);
        }
    }
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        if (h->ckpt[i]) {
            h->be->ops->release(h->be, h->ckpt[i]);
        }
    }
    free(h->lin_index);
    free(h->kv_index);
    free(h);
}

void rm_hybrid_reset(rm_hybrid * h, const rm_model * m) {
    if (!h) {
        return;
    }
    uint64_t conv, ssm;
    rm_hybrid_state_bytes(m, &conv, &ssm);
    h->be->ops->zero(h->be, h->conv_state, conv);
    h->be->ops->zero(h->be, h->ssm_state, ssm);
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        h->ckpt_pos[i] = -1;
    }
}

void rm_hybrid_state_bytes(const rm_model * m, uint64_t * conv, uint64_t * ssm) {
    const rm_size_params p = params_of(m, 1);
    uint64_t bytes[RM_RECURRENT_BUF_COUNT];
    rm_recurrent_buf_bytes(&p, bytes);
    *conv = bytes[RM_RECURRENT_BUF_CONV_STATE];
    *ssm = bytes[RM_RECURRENT_BUF_SSM_STATE];
}

/* The slot a checkpoint at pos takes: its own where pos has one, else an empty one, else the one
 * whose loss leaves the smallest gap between its neighbours, of all but the earliest and the
 * latest: the earliest stays, an anchor for prompts that keep only the start of a conversation (a
 * system prompt); the latest stays (a prompt's tail beside its end, Model._prompt_marks); the rest
 * thin out where they are densest (a prompt's chunk boundaries, an older turn's tail and end), so
 * those left spread over the context. */
_Static_assert(RM_HYBRID_CHECKPOINTS >= 3, "an earliest, a latest and one to give up");
static int checkpoint_slot(const rm_hybrid * h, int32_t pos) {
    int empty = -1;
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        if (h->ckpt_pos[i] == pos) {
            return i;
        }
        if (h->ckpt_pos[i] < 0 && empty < 0) {
            empty = i;
        }
    }
    if (empty >= 0) {
        return empty;
    }
    int order[RM_HYBRID_CHECKPOINTS];   /* the slots by position */
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        int j = i;
        for (; j > 0 && h->ckpt_pos[order[j - 1]] > h->ckpt_pos[i]; j--) {
            order[j] = order[j - 1];
        }
        order[j] = i;
    }
    int best = order[1];
    int64_t best_gap = INT64_MAX;
    for (int k = 1; k + 1 < RM_HYBRID_CHECKPOINTS; k++) {
        const int64_t gap = (int64_t) h->ckpt_pos[order[k + 1]] - h->ckpt_pos[order[k - 1]];
        if (gap < best_gap) {
            best_gap = gap;
            best = order[k];
        }
    }
    return best;
}

rm_status rm_hybrid_checkpoint(rm_hybrid * h, const rm_model * m, int32_t pos) {
    if (!h) {
        return RM_OK;
    }
    const int slot = checkpoint_slot(h, pos);
    uint64_t conv, ssm;
    rm_hybrid_state_bytes(m, &conv, &ssm);
    if (!h->ckpt[slot] && !(h->ckpt[slot] = h->be->ops->alloc(h->be, conv + ssm))) {
        return rm_fail(RM_E_OOM, "rm_session_checkpoint: out of memory for a copy of the recurrent states (%llu bytes)",
                       (unsigned long long) (conv + ssm));
    }
    h->be->ops->copy(h->be, h->ckpt[slot], h->conv_state, conv);
    h->be->ops->copy(h->be, (char *) h->ckpt[slot] + conv, h->ssm_state, ssm);
    h->ckpt_pos[slot] = pos;
    return RM_OK;
}

int32_t rm_hybrid_rewind(rm_hybrid * h, const rm_model * m, int32_t n, int restore) {
    int best = -1;
    for (int i = 0; h && i < RM_HYBRID_CHECKPOINTS; i++) {
        if (h->ckpt_pos[i] >= 0 && h->ckpt_pos[i] <= n && (best < 0 || h->ckpt_pos[i] > h->ckpt_pos[best])) {
            best = i;
        }
    }
    if (best < 0 || !restore) {
        return best < 0 ? -1 : h->ckpt_pos[best];
    }
    uint64_t conv, ssm;
    rm_hybrid_state_bytes(m, &conv, &ssm);
    h->be->ops->copy(h->be, h->conv_state, h->ckpt[best], conv);
    h->be->ops->copy(h->be, h->ssm_state, (const char *) h->ckpt[best] + conv, ssm);
    const int32_t pos = h->ckpt_pos[best];
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {   /* later positions will hold other tokens */
        if (h->ckpt_pos[i] > pos) {
            h->ckpt_pos[i] = -1;
        }
    }
    return pos;
}

/* ---- gated attention ------------------------------------------------------------------------ */

void rm_attn_gate_split(rm_session * s, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t D = hp->head_dim, rows = (int64_t) n * hp->n_head;   /* a row: one token's head, [q, gate] */
    s->be->ops->copy_rows(s->be, s->q, D, s->hy->qg, 2 * D, D, rows);
    s->be->ops->copy_rows(s->be, s->hy->gate, D, s->hy->qg + D, 2 * D, D, rows);
}

void rm_attn_gate_apply(rm_session * s, int32_t n) {
    s->be->ops->mul_sigmoid(s->be, s->attn, s->hy->gate, (int64_t) n * s->m->hp.n_head * s->m->hp.head_dim, 1);
}

/* ---- Gated DeltaNet ------------------------------------------------------------------------- */

/* The layer's shapes. */
typedef struct gdn_layer {
    const rm_layer * L;
    int              il;
    int64_t          nk, nv, dk, dv, kd, di, cd;
    int              tiled;       /* value head h reads key head h % nk, else h / (nv / nk) */
} gdn_layer;

static gdn_layer layer_of(const rm_session * s, int il) {
    const rm_hparams * hp = &s->m->hp;
    gdn_layer g = {&s->m->layers[il], il, hp->ssm_n_k, hp->ssm_n_v, hp->ssm_d_state, hp->ssm_d_inner / hp->ssm_n_v,
                   (int64_t) hp->ssm_n_k * hp->ssm_d_state, hp->ssm_d_inner, 0, 0};
    g.cd = 2 * g.kd + g.di;
    g.tiled = (g.L->kind & RM_LAYER_SSM_V_TILED) != 0;
    return g;
}

/* The layer's conv state in session o: d_conv - 1 rows of conv_dim. */
static float * conv_state_of(const rm_session * o, const gdn_layer * g) {
    return o->hy->conv_state + o->hy->lin_index[g->il] * (o->m->hp.ssm_d_conv - 1) * g->cd;
}

/* The layer's delta-rule states in session o: n_v heads of rm_gdn_state_floats. */
static float * ssm_state_of(const rm_session * o, const gdn_layer * g) {
    return o->hy->ssm_state + o->hy->lin_index[g->il] * g->nv * rm_gdn_state_floats((int32_t) g->dk, (int32_t) g->dv);
}

/* q/k/v, z and b/a from the normalised input, in one dispatch where the backend can. */
static void project(rm_session * s, const gdn_layer * g, int32_t n) {
    rm_backend * be = s->be;
    const rm_layer * L = g->L;
    const int64_t E = s->m->hp.n_embd, NV = g->nv;
    rm_hybrid * h = s->hy;
    rm_mm_item items[4] = {
        {{&L->wqkv, 0, s->xn, E, n, h->mixed, g->cd, 0}, NULL, 0},
        {{&L->wz, 0, s->xn, E, n, h->z, g->di, 0}, NULL, 0},
        {{&L->ssm_ba, 0, s->xn, E, n, h->ba, 2 * NV, 0}, NULL, 0},
        {{&L->ssm_alpha, 0, s->xn, E, n, h->ba + NV, 2 * NV, 0}, NULL, 0},
    };
    int32_t n_items = 3;
    if (!(L->kind & RM_LAYER_SSM_BA)) {   /* b and a from their own projections, side by side */
        items[2].a.w = &L->ssm_beta;
        n_items = 4;
    }
    rm_matmul_many(be, items, n_items);
}

void rm_deltanet_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    rm_backend * be = s->be;
    rm_hybrid * h = s->hy;
    const gdn_layer g = layer_of(s, il);
    const int64_t E = hp->n_embd;
    if (!(m->arch->flags & RM_ARCH_HYPER)) {   /* else the hyper-connections gave xn */
        be->ops->rmsnorm(be, s->xn, s->x, &g.L->attn_norm, n, E, hp->rms_eps);
    }
    project(s, &g, n);
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    rm_gdn_seq seqs[64];   /* a step's sequences, 64 at a time (a token's floats do not depend on which go with it) */
    for (int32_t r0 = 0; r0 < s->n_runs; r0 += 64) {
        const int32_t c = s->n_runs - r0 < 64 ? s->n_runs - r0 : 64;
        int32_t lo = s->runs[r0].row0, hi = lo;
        for (int32_t r = 0; r < c; r++) {
            const rm_seq_run * run = &s->runs[r0 + r];
            seqs[r] = (rm_gdn_seq) {conv_state_of(run->s, &g), ssm_state_of(run->s, &g), run->row0 - lo, run->n, run->pos};
            hi = run->row0 + run->n > hi ? run->row0 + run->n : hi;
        }
        const int64_t NV = g.nv;   /* the op sees these sequences' rows, [lo, hi), as its own */
        const rm_gdn_args a = {&g.L->ssm_conv1d, &g.L->ssm_a, &g.L->ssm_dt, &g.L->ssm_norm, h->mixed + lo * g.cd,
                               h->z + lo * g.di, h->ba + lo * 2 * NV, h->conv_out + lo * g.cd, h->g + lo * NV,
                               h->beta + lo * NV, h->core + lo * g.di, h->conv_w, h->chunk, seqs, c, hi - lo,
                               (int32_t) g.nk, (int32_t) g.nv, (int32_t) g.dk, (int32_t) g.dv, hp->ssm_d_conv,
                               (g.L->kind & RM_LAYER_SSM_BA) != 0, g.tiled, hp->rms_eps,
                               hp->ssm_gate == RM_SSM_GATE_SIGMOID};
        be->ops->gdn(be, &a);
    }
    rm_prof_mark(s, RM_PROF_ATTN);
    rm_matmul_args out = {&g.L->ssm_out, 0, h->core, g.di, n, s->x, E, 1};   /* x += W_out o */
    be->ops->matmul(be, &out);
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
