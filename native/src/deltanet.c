/* deltanet.c - the Gated DeltaNet layer of Qwen3-Next and Qwen3.5 (as transformers'
 * Qwen3NextGatedDeltaNet computes it), its per-session state, and the sigmoid output gate of the
 * hybrid's full-attention layers. The math of the convolution and the delta rule is in cpu/gdn.c;
 * this file arranges the layer: projections, gates, heads, and the states between calls. */
#include "deltanet.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/dispatch.h"
#include "cpu/gdn.h"
#include "status.h"
#include "types.h"

/* transformers' l2norm: x / sqrt(sum x^2 + 1e-6) */
#define RM_GDN_L2_EPS 1e-6f

static rm_size_params params_of(const rm_model * m, int32_t n_batch) {
    return rm_size_params_of(&m->hp, 1, n_batch, 0);
}

rm_status rm_hybrid_new(const rm_model * m, int32_t n_batch, rm_hybrid ** out) {
    *out = NULL;
    if (m->hp.ssm_n_v <= 0) {
        return RM_OK;
    }
    rm_hybrid * h = calloc(1, sizeof(*h));
    if (!h) {
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory for the recurrent state");
    }
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
    for (int i = 0; i < RM_RECURRENT_BUF_COUNT && !failed; i++) {
        failed = !(*bufs[i] = calloc(bytes[i] ? bytes[i] : 1, 1));
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
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        free(h->ckpt[i]);
    }
    float * bufs[] = {h->conv_state, h->ssm_state, h->mixed, h->conv_out, h->z, h->ba, h->g, h->beta,
                      h->core, h->conv_w, h->chunk, h->qg, h->gate};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        free(bufs[i]);
    }
    free(h->lin_index);
    free(h->kv_index);
    free(h);
}

void rm_hybrid_reset(rm_hybrid * h, const rm_model * m) {
    if (!h) {
        return;
    }
    const rm_size_params p = params_of(m, 1);
    uint64_t bytes[RM_RECURRENT_BUF_COUNT];
    rm_recurrent_buf_bytes(&p, bytes);
    memset(h->conv_state, 0, bytes[RM_RECURRENT_BUF_CONV_STATE]);
    memset(h->ssm_state, 0, bytes[RM_RECURRENT_BUF_SSM_STATE]);
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

rm_status rm_hybrid_checkpoint(rm_hybrid * h, const rm_model * m, int32_t pos) {
    if (!h) {
        return RM_OK;
    }
    int slot = h->ckpt_next;
    for (int i = 0; i < RM_HYBRID_CHECKPOINTS; i++) {
        if (h->ckpt_pos[i] == pos) {
            slot = i;
        }
    }
    uint64_t conv, ssm;
    rm_hybrid_state_bytes(m, &conv, &ssm);
    if (!h->ckpt[slot] && !(h->ckpt[slot] = malloc(conv + ssm))) {
        return rm_fail(RM_E_OOM, "rm_session_checkpoint: out of memory for a copy of the recurrent states (%llu bytes)",
                       (unsigned long long) (conv + ssm));
    }
    memcpy(h->ckpt[slot], h->conv_state, conv);
    memcpy((char *) h->ckpt[slot] + conv, h->ssm_state, ssm);
    h->ckpt_pos[slot] = pos;
    if (slot == h->ckpt_next) {
        h->ckpt_next = (slot + 1) % RM_HYBRID_CHECKPOINTS;
    }
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
    memcpy(h->conv_state, h->ckpt[best], conv);
    memcpy(h->ssm_state, (const char *) h->ckpt[best] + conv, ssm);
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
    const int64_t D = hp->head_dim, Q = (int64_t) hp->n_head * D;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hh = 0; hh < hp->n_head; hh++) {
            const float * src = s->hy->qg + t * 2 * Q + hh * 2 * D;
            memcpy(s->q + t * Q + hh * D, src, sizeof(float) * (size_t) D);
            memcpy(s->hy->gate + t * Q + hh * D, src + D, sizeof(float) * (size_t) D);
        }
    }
}

void rm_attn_gate_apply(rm_session * s, int32_t n) {
    const int64_t len = (int64_t) n * s->m->hp.n_head * s->m->hp.head_dim;
    for (int64_t i = 0; i < len; i++) {
        s->attn[i] /= 1.0f + expf(-s->hy->gate[i]);
    }
}

/* ---- Gated DeltaNet ------------------------------------------------------------------------- */

/* softplus as torch computes it (linear above 20) */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

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

/* Value head v's delta-rule state in session o (rm_gdn_state_floats each). */
static float * ssm_state_of(const rm_session * o, const gdn_layer * g, int64_t v) {
    const int64_t per_head = rm_gdn_state_floats((int32_t) g->dk, (int32_t) g->dv);
    return o->hy->ssm_state + (o->hy->lin_index[g->il] * g->nv + v) * per_head;
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
    if (be->ops->matmul_many) {
        be->ops->matmul_many(be, items, n_items);
    } else {
        for (int32_t i = 0; i < n_items; i++) {
            be->ops->matmul(be, &items[i].a);
        }
    }
}

/* beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per token and value head. */
static void gates(rm_session * s, const gdn_layer * g, int32_t n) {
    rm_hybrid * h = s->hy;
    const float * A = (const float *) g->L->ssm_a.data, * dt = (const float *) g->L->ssm_dt.data;
    const int64_t NV = g->nv, r = g->nv / g->nk;
    const int fused = (g->L->kind & RM_LAYER_SSM_BA) != 0;
    for (int64_t t = 0; t < n; t++) {
        const float * ba = h->ba + t * 2 * NV;
        for (int64_t v = 0; v < NV; v++) {
            /* fused: per key head, its r b's then its r a's */
            const int64_t ib = fused ? (v / r) * 2 * r + v % r : v, ia = fused ? ib + r : NV + v;
            h->beta[t * NV + v] = 1.0f / (1.0f + expf(-ba[ib]));
            h->g[t * NV + v] = A[v] * softplus(ba[ia] + dt[v]);
        }
    }
}

/* The step's sequences (s->runs) take their rows of the scratch in h and their own session's
 * states: the convolution and the delta rule run per sequence, in one pool dispatch for all. */
typedef struct conv_task {
    const gdn_layer *  g;
    rm_hybrid *        h;
    const rm_seq_run * runs;
    int32_t            n_runs;
    const float *      w;      /* the filters as floats */
    int32_t            d_conv;
} conv_task;

/* The causal conv of each sequence over this thread's slice of the channels (whole groups of eight). */
static void conv_run(void * ctx, int ith, int nth) {
    const conv_task * task = ctx;
    const int64_t cd = task->g->cd;
    int64_t lo, hi;
    rm_split((cd + 7) / 8, ith, nth, &lo, &hi);
    lo *= 8;
    hi = hi * 8 < cd ? hi * 8 : cd;
    for (int32_t r = 0; r < task->n_runs && lo < hi; r++) {
        const rm_seq_run * run = &task->runs[r];
        const int64_t at = (int64_t) run->row0 * cd + lo;
        rm_cpu_gdn_conv()(task->h->conv_out + at, task->h->mixed + at, run->n, hi - lo, cd,
                          conv_state_of(run->s, task->g) + lo, task->w + lo * task->d_conv, task->d_conv);
    }
}

typedef struct heads_task {
    const gdn_layer *  g;
    rm_hybrid *        h;
    const rm_hparams * hp;
    const rm_seq_run * runs;
    int32_t            n_runs, n;
} heads_task;

/* The delta rule of the value heads [lo, hi) of this thread's share, for each sequence in turn at
 * its own positions (a head's scratch is this thread's alone): its chunks are aligned to
 * positions, so each token's output is what the sequence alone gives it, however the step cut it. */
static void heads_run(void * ctx, int ith, int nth) {
    const heads_task * task = ctx;
    const gdn_layer * g = task->g;
    const rm_hparams * hp = task->hp;
    rm_hybrid * h = task->h;
    const int64_t chunk_floats = rm_gdn_chunk_scratch((int32_t) g->dk, (int32_t) g->dv);
    int64_t lo, hi;
    rm_split(g->nv, ith, nth, &lo, &hi);
    for (int64_t v = lo; v < hi; v++) {
        const int64_t kh = g->tiled ? v % g->nk : v / (g->nv / g->nk);
        for (int32_t r = 0; r < task->n_runs; r++) {
            const rm_seq_run * run = &task->runs[r];
            const float * row = h->conv_out + (int64_t) run->row0 * g->cd;
            const int64_t t0 = run->row0;
            const rm_gdn_head head = {row + kh * g->dk, row + g->kd + kh * g->dk, g->cd,
                                      row + 2 * g->kd + v * g->dv, g->cd, h->g + t0 * g->nv + v, h->beta + t0 * g->nv + v,
                                      g->nv, h->core + t0 * g->di + v * g->dv, g->di, run->n, (int32_t) g->dk,
                                      (int32_t) g->dv};
            rm_cpu_gdn_rule()(&head, run->pos, ssm_state_of(run->s, g, v), h->chunk + v * chunk_floats);
        }
    }
    for (int32_t t = 0; t < task->n && lo < hi; t++) {   /* the gated norm of these heads' outputs */
        const int64_t at = t * g->di + lo * g->dv;
        rm_gdn_gated_norm(h->core + at, h->z + at, (const float *) g->L->ssm_norm.data, hi - lo, g->dv, hp->rms_eps);
    }
}

void rm_deltanet_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    rm_backend * be = s->be;
    rm_hybrid * h = s->hy;
    const gdn_layer g = layer_of(s, il);
    const int64_t E = hp->n_embd;
    be->ops->rmsnorm(be, s->xn, s->x, &g.L->attn_norm, n, E, hp->rms_eps);
    project(s, &g, n);
    gates(s, &g, n);
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    /* the filters as floats (F32 in the file: as they are; F16: converted), then the convolution
     * over the state, the channels shared among the threads */
    const rm_weight * cw = &g.L->ssm_conv1d;
    const float * filters = (const float *) cw->data;
    if (cw->type != RM_TYPE_F32 || cw->row_bytes != sizeof(float) * (uint64_t) hp->ssm_d_conv) {
        const rm_type_traits * tt = rm_type_traits_get(cw->type);
        for (int64_t c = 0; c < g.cd; c++) {
            tt->to_float(cw->data + (uint64_t) c * cw->row_bytes, h->conv_w + c * hp->ssm_d_conv, hp->ssm_d_conv);
        }
        filters = h->conv_w;
    }
    conv_task ct = {&g, h, s->runs, s->n_runs, filters, hp->ssm_d_conv};
    rm_pool_run(m->pool, conv_run, &ct);
    for (int64_t t = 0; t < n; t++) {   /* unit q and k per key head, q scaled by 1/sqrt(d_k) */
        float * row = h->conv_out + t * g.cd;
        rm_gdn_l2norm(row, g.nk, g.dk, g.dk, RM_GDN_L2_EPS, 1.0f / sqrtf((float) g.dk));
        rm_gdn_l2norm(row + g.kd, g.nk, g.dk, g.dk, RM_GDN_L2_EPS, 1.0f);
    }
    heads_task task = {&g, h, hp, s->runs, s->n_runs, n};
    rm_pool_run(m->pool, heads_run, &task);
    rm_prof_mark(s, RM_PROF_ATTN);
    rm_matmul_args out = {&g.L->ssm_out, 0, h->core, g.di, n, s->x, E, 1};   /* x += W_out o */
    be->ops->matmul(be, &out);
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
