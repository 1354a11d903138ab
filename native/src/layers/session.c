/* session.c - sessions and the forward pass.
 *
 * One generic decoder forward for every architecture in arch.c, written top to bottom like the
 * model it computes. A batch of n tokens goes through each layer together (prefill); decode is the
 * same path with n = 1. The layer kinds are in attention.c (plain attention), mla.c and
 * deltanet.c, the MoE block in moe.c; the residual policy in policy.c, the profiler in profile.c,
 * the statistics and calibration in stats.c. */
#include "session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "deltanet.h"
#include "device.h"
#include "hyper.h"
#include "mla.h"
#include "moe.h"
#include "policy.h"
#include "profile.h"
#include "ple.h"
#include "dsv4.h"
#include "mhc.h"
#include "qsa.h"
#include "status.h"
#include "types.h"
#include "xcache.h"

static void * xalloc(size_t n, int * failed) {
    void * p = calloc(n ? n : 1, 1);
    if (!p) {
        *failed = 1;
    }
    return p;
}

static void session_free_buffers(rm_session * s) {
    void * host[] = {s->embd, s->kv_at, s->mla_host, s->dsa_host, s->dsa_sel, s->attn_scratch, s->routes, s->exp_n, s->exp_pairs, s->rows, s->scale, s->cal_host,
                     s->xv, s->exp_n_all, s->pred, s->pred_experts, s->xc_res_us, s->xc_layer_us, s->stat_active, s->stat_residual, s->last_routes, s->cal_delta, s->cal_n, s->route_log,
                     s->imp_in, s->imp_ff, s->imp_n, s->imp_host};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) {
        free(host[i]);
    }
    rm_policy_state_free(&s->policy);
    if (s->be) rm_qsa_free(s);
    if (s->be) rm_ple_free(s);
    if (s->be) rm_dsv4_free(s);
    rm_hybrid_free(s->hy);
    if (s->be) {
        float * dev[] = {s->k_cache, s->v_cache, s->x, s->xn, s->q, s->k, s->v, s->attn, s->moe, s->router,
                         s->ex, s->eg, s->eu, s->ed, s->ecal, s->shgate, s->logits, s->mla};
        for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
            if (dev[i]) {
                s->be->ops->release(s->be, dev[i]);
            }
        }
        s->be->ops->free(s->be);
    }
}

/* Allocates the backend buffers (sizes.h gives their bytes); 0 on failure (the backend's message set). */
static int alloc_backend_buffers(rm_session * s) {
    float ** bufs[RM_SESSION_BUF_COUNT] = {
        [RM_SESSION_BUF_K_CACHE] = &s->k_cache, [RM_SESSION_BUF_V_CACHE] = &s->v_cache,
        [RM_SESSION_BUF_X] = &s->x,             [RM_SESSION_BUF_XN] = &s->xn,
        [RM_SESSION_BUF_Q] = &s->q,             [RM_SESSION_BUF_K] = &s->k,
        [RM_SESSION_BUF_V] = &s->v,             [RM_SESSION_BUF_ATTN] = &s->attn,
        [RM_SESSION_BUF_MOE] = &s->moe,         [RM_SESSION_BUF_ROUTER] = &s->router,
        [RM_SESSION_BUF_EX] = &s->ex,           [RM_SESSION_BUF_EG] = &s->eg,
        [RM_SESSION_BUF_EU] = &s->eu,           [RM_SESSION_BUF_ED] = &s->ed,
        [RM_SESSION_BUF_ECAL] = &s->ecal,       [RM_SESSION_BUF_SHGATE] = &s->shgate,
        [RM_SESSION_BUF_LOGITS] = &s->logits,   [RM_SESSION_BUF_MLA] = &s->mla,
        [RM_SESSION_BUF_HC] = &s->hc,
    };
    rm_size_params sp = rm_size_params_of(&s->m->hp, s->n_ctx, s->n_batch, 0);
    sp.type_k = s->type_k;
    sp.type_v = s->type_v;
    uint64_t bytes[RM_SESSION_BUF_COUNT];
    rm_session_buf_bytes(&sp, bytes);
    for (int i = 0; i < RM_SESSION_BUF_COUNT; i++) {
        if (bytes[i] == 0 && (i == RM_SESSION_BUF_MLA || i == RM_SESSION_BUF_HC)) {
            continue;   /* no MLA, no hyper-connections: nothing to allocate */
        }
        *bufs[i] = s->be->ops->alloc(s->be, bytes[i]);
        if (!*bufs[i]) {
            return 0;
        }
    }
    return 1;
}

rm_status rm_session_new(rm_model * m, const rm_session_params * params, rm_session ** out) {
    rm_clear_error();
    if (!m || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_new: model and out must not be NULL");
    }
    *out = NULL;
    rm_session_params dflt = {sizeof(rm_session_params), 0, 0, RM_TYPE_F32, RM_TYPE_F32};
    if (!params) {
        params = &dflt;
    } else if (params->struct_size != sizeof(rm_session_params)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_new: params.struct_size %u != %zu (mismatched header)",
                       params->struct_size, sizeof(rm_session_params));
    }
    const rm_hparams * hp = &m->hp;
    const int32_t hd_v = hp->head_dim_v > 0 ? hp->head_dim_v : hp->head_dim;
    const int32_t hd_v_swa = rm_head_dim_v_swa(hp->head_dim, hd_v, hp->head_dim_swa);
    for (int shape = 0; shape < 2; shape++) {   /* both layer shapes' head widths (Gemma 4's differ) */
        const int32_t hd = shape ? hp->head_dim_swa : hp->head_dim, hdv = shape ? hd_v_swa : hd_v;
        const int32_t latent = hp->kv_lora_rank > 0 ? hp->kv_lora_rank + hp->n_rot : 0;
        const int32_t row = (int32_t) rm_mla_row(hp);   /* with sparse attention, the indexer's key after it */
        for (int w = 0; w < 2; w++) {
            const int32_t lw = w ? row : latent;
            if (!rm_kv_types_ok(params->type_k, params->type_v, hd, hdv, lw)) {
                return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_session_new: %s",
                               rm_kv_types_why(params->type_k, params->type_v, hd, hdv, lw));
            }
        }
    }
    if ((m->arch->flags & (RM_ARCH_HYPER | RM_ARCH_MHC)) && m->device != &rm_device_cpu) {
        return rm_fail(RM_E_NEEDS_CPU, "rm_session_new: hyper-connections (%s) run on the CPU backend only, and "
                       "this model runs on %s", m->arch->name, m->device->name);
    }
    if ((m->arch->flags & RM_ARCH_MHC) && params->type_k != RM_TYPE_F32) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_session_new: %s keeps its window's keys in F32 only, and the session "
                       "asks for %s", m->arch->name, rm_type_traits_get(params->type_k)->name);
    }
    for (int il = 0; il < hp->n_layer && m->device != &rm_device_cpu; il++) {
        if (m->layers[il].kind & RM_LAYER_QSA_INDEX) {
            return rm_fail(RM_E_NEEDS_CPU, "rm_session_new: QSA sparse attention (layer %d's indexer) runs on the CPU "
                           "backend only, and this model runs on %s", il, m->device->name);
        }
    }
    if (hp->index_head_dim > 0 && hp->kv_lora_rank > 0 && m->device != &rm_device_cpu) {
        return rm_fail(RM_E_NEEDS_CPU, "rm_session_new: sparse attention (its lightning indexer) runs on the CPU "
                       "backend only, and this model runs on %s", m->device->name);
    }
    if ((params->type_k != RM_TYPE_F32 || params->type_v != RM_TYPE_F32) && m->device != &rm_device_cpu) {
        return rm_fail(RM_E_NEEDS_CPU, "rm_session_new: KV cache types other than F32 run on the CPU backend only, "
                       "and this model runs on %s", m->device->name);
    }
    rm_session * s = calloc(1, sizeof(*s));
    if (!s) {
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory");
    }
    s->m = m;
    s->type_k = params->type_k;
    s->type_v = params->type_v;
    /* the widest layer's rows (the layers' own: rm_attention_kv_place) */
    const int64_t kv_w = (int64_t) hp->n_head_kv * hp->head_dim, kv_w_swa = (int64_t) hp->n_head_kv_swa * hp->head_dim_swa;
    const int64_t kv_widest = kv_w > kv_w_swa ? kv_w : kv_w_swa;
    const int64_t v_w = (int64_t) hp->n_head_kv * hd_v, v_w_swa = (int64_t) hp->n_head_kv_swa * hd_v_swa;
    int32_t hd_widest = hp->head_dim > hp->head_dim_swa ? hp->head_dim : hp->head_dim_swa;
    hd_widest = hd_v > hd_widest ? hd_v : hd_v_swa > hd_widest ? hd_v_swa : hd_widest;
    s->k_row_bytes = rm_kv_row_bytes(s->type_k, hp->kv_lora_rank > 0 ? rm_mla_row(hp) : kv_widest);
    s->v_row_bytes = rm_kv_row_bytes(s->type_v, v_w > v_w_swa ? v_w : v_w_swa);
    s->n_ctx = params->n_ctx > 0 ? params->n_ctx : hp->n_ctx_train;
    s->n_batch = rm_session_batch(s->n_ctx, params->n_batch);
    const size_t B = (size_t) s->n_batch, E = (size_t) hp->n_embd;
    const int32_t n_head_widest = hp->n_head > hp->n_head_swa ? hp->n_head : hp->n_head_swa;
    const size_t X = (size_t) hp->n_expert, K = (size_t) hp->n_expert_used, NL = (size_t) hp->n_layer;
    int failed = 0;
    s->embd = xalloc(sizeof(float) * B * E, &failed);
    s->kv_at = xalloc(sizeof(rm_kv_place) * NL, &failed);
    if (hp->kv_lora_rank == 0) {   /* MLA's layers have their own op (and scratch: mla_host) */
        const int32_t n_kv = hp->n_head_kv > hp->n_head_kv_swa ? hp->n_head_kv : hp->n_head_kv_swa;
        s->attn_scratch_floats = rm_cpu_attn_scratch_floats(rm_pool_size(m->pool), n_head_widest, n_kv, hd_widest,
                                                            s->n_ctx);
        s->attn_scratch = xalloc(sizeof(float) * (size_t) s->attn_scratch_floats, &failed);
    }
    if (hp->kv_lora_rank > 0) {
        s->mla_host = xalloc(sizeof(float) * (size_t) rm_pool_size(m->pool) * rm_mla_thread_floats(hp, s->n_ctx), &failed);
    }
    if (hp->kv_lora_rank > 0 && hp->index_head_dim > 0) {   /* sparse attention: the picked positions */
        const int32_t keep = hp->index_top_k < s->n_ctx ? hp->index_top_k : s->n_ctx;
        s->dsa_host = xalloc(sizeof(float) * (size_t) rm_dsa_host_floats(hp, s->n_ctx, rm_pool_size(m->pool)), &failed);
        s->dsa_sel = xalloc(sizeof(int32_t) * B * (size_t) keep, &failed);
    }
    s->routes = xalloc(sizeof(rm_route) * B * K, &failed);
    s->exp_n = xalloc(sizeof(int32_t) * X, &failed);
    s->exp_pairs = xalloc(sizeof(int32_t) * X * B * K, &failed);
    s->rows = xalloc(sizeof(int32_t) * B * K, &failed);
    s->scale = xalloc(sizeof(float) * B * K, &failed);
    s->cal_host = xalloc(sizeof(float) * 2 * E, &failed);
    if (m->xcache) {
        s->xv = xalloc(sizeof(rm_weight) * X * 2 * RM_XC_MATS, &failed);
        s->exp_n_all = xalloc(sizeof(int32_t) * X, &failed);
        s->pred = xalloc(sizeof(float) * B * X, &failed);
        s->pred_experts = xalloc(sizeof(int32_t) * X, &failed);
        s->xc_res_us = xalloc(sizeof(float) * NL, &failed);
        s->xc_layer_us = xalloc(sizeof(float) * NL, &failed);
    }
    s->stat_active = xalloc(sizeof(uint64_t) * NL * X, &failed);
    s->stat_residual = xalloc(sizeof(uint64_t) * NL * X, &failed);
    s->last_routes = xalloc(sizeof(rm_route) * NL * K, &failed);
    s->cal_delta = xalloc(sizeof(double) * NL * X, &failed);
    s->cal_n = xalloc(sizeof(uint64_t) * NL * X, &failed);
    if (!rm_policy_state_init(&s->policy, hp->n_layer, hp->n_expert, s->n_ctx, m->residual != NULL)) {
        failed = 1;
    }
    if (failed) {
        const int32_t nb = s->n_batch;
        session_free_buffers(s);
        free(s);
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory for a batch of %d tokens", nb);
    }
    /* the quantized activations' rows: as wide as the widest matrix row any product reads */
    const int64_t max_in = rm_model_widest_row(m);
    rm_status st = RM_OK;
    s->be = m->device->backend_new(m->device_state, m, s->n_batch, max_in, s->n_ctx, &st);
    if (!s->be || !alloc_backend_buffers(s) || rm_hybrid_new(m, s->be, s->n_batch, &s->hy) != RM_OK ||
        !rm_qsa_new(s) || !rm_ple_new(s) || !rm_dsv4_new(s)) {
        const int32_t n_ctx = s->n_ctx;
        st = s->be ? s->be->ops->status(s->be) : st;
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", rm_last_error());
        session_free_buffers(s);
        free(s);
        return rm_fail(st != RM_OK ? st : RM_E_OOM, "rm_session_new: a context of %d tokens: %s", n_ctx, msg);
    }
    rm_attention_kv_layout(s);
    *out = s;
    return RM_OK;
}

void rm_session_free(rm_session * s) {
    if (!s) {
        return;
    }
    session_free_buffers(s);
    free(s);
}

rm_status rm_session_reset(rm_session * s) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_reset: NULL session");
    }
    s->n_past = 0;
    rm_hybrid_reset(s->hy, s->m);
    return RM_OK;
}

int32_t rm_session_n_past(const rm_session * s) { return s ? s->n_past : 0; }
int32_t rm_session_n_ctx(const rm_session * s) { return s ? s->n_ctx : 0; }

static void matmul(rm_session * s, const rm_weight * w, const float * x, int64_t x_stride, int32_t n,
                   float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, 0, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

/* 1 when every sliding-window layer's ring still holds the window of position n_keep. */
static int rings_keep(const rm_session * s, int32_t n_keep, int * layer, int32_t * ring_out) {
    for (int il = 0; il < s->m->hp.n_layer; il++) {
        const int32_t ring = rm_attention_kv_place(s, il).ring;
        if (ring && ring < s->n_ctx && s->n_past - n_keep > ring - s->m->hp.n_swa) {   /* it lost n_keep's window */
            *layer = il;
            *ring_out = ring;
            return 0;
        }
    }
    return 1;
}

int32_t rm_session_reusable(const rm_session * s, int32_t n_keep) {
    if (!s || n_keep <= 0) {
        return 0;
    }
    if (n_keep >= s->n_past) {
        return s->n_past;
    }
    if (s->hy) {
        const int32_t p = rm_hybrid_rewind(s->hy, s->m, n_keep, 0);
        return p > 0 ? p : 0;
    }
    int il;
    int32_t ring;
    return rings_keep(s, n_keep, &il, &ring) && rm_dsv4_keeps(s, n_keep, &il) ? n_keep : 0;
}

rm_status rm_session_checkpoint(rm_session * s) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_checkpoint: NULL session");
    }
    return s->hy && s->n_past > 0 ? rm_hybrid_checkpoint(s->hy, s->m, s->n_past) : RM_OK;
}

/* ---- the state as bytes ------------------------------------------------------------------------
 * A header, each layer's cached rows and ring (two int32), then per layer the K rows and the V rows
 * of positions 0 .. n_past - 1 as the cache holds them (a ring's rows where it wrapped; MLA has no
 * V rows) and a QSA layer's indexer keys, then a hybrid's conv and delta-rule states, then the
 * residual policy's controllers at positions 0 .. n_past (a model with a sidecar: the residual
 * choices that follow depend on them). */
#define STATE_MAGIC 0x54534d52u   /* "RMST" */
#define STATE_VERSION 1

typedef struct state_head {
    uint32_t magic, version;
    int32_t  n_layer, n_past, type_k, type_v, pad;
    uint64_t k_row_bytes, v_row_bytes, conv_bytes, ssm_bytes;
    uint64_t thr_bytes;           /* the residual policy's controllers at positions 0 .. n_past (with a sidecar) */
} state_head;

static const char * state_type_name(int32_t type) {
    const rm_type_traits * tt = type >= 0 && type < RM_TYPE_COUNT ? rm_type_traits_get(type) : NULL;
    return tt && tt->name ? tt->name : "an unknown type";
}

static uint64_t state_v_row(const rm_session * s) { return s->m->hp.kv_lora_rank > 0 ? 0 : s->v_row_bytes; }


static state_head state_head_of(const rm_session * s) {
    state_head h = {STATE_MAGIC, STATE_VERSION, s->m->hp.n_layer, s->n_past, s->type_k, s->type_v, 0,
                    s->k_row_bytes, state_v_row(s), 0, 0, 0};
    if (s->policy.threshold) {
        h.thr_bytes = sizeof(float) * (uint64_t) (s->n_past + 1) * (uint64_t) s->m->hp.n_layer;
    }
    if (s->hy) {
        rm_hybrid_state_bytes(s->m, &h.conv_bytes, &h.ssm_bytes);
    }
    return h;
}

/* The bytes of a state of n_past positions of s's model whose layers hold rows[il] each. */
static uint64_t state_bytes_of(const rm_session * s, const state_head * h, const int32_t * rows) {
    uint64_t total = sizeof(state_head) + (uint64_t) h->n_layer * 2 * sizeof(int32_t) + h->conv_bytes + h->ssm_bytes +
                     h->thr_bytes + rm_dsv4_state_bytes(s, h->n_past);
    for (int il = 0; il < h->n_layer; il++) {
        const rm_kv_place p = rm_attention_kv_place(s, il);
        const uint64_t n = (uint64_t) (h->n_past < rows[il] ? h->n_past : rows[il]);
        total += n * (p.k_row + (h->v_row_bytes ? p.v_row : 0) + rm_qsa_key_bytes(s, il));
    }
    return total;
}

rm_status rm_session_state_size(const rm_session * s, uint64_t * bytes) {
    rm_clear_error();
    if (!s || !bytes) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_state_size: NULL argument");
    }
    const state_head h = state_head_of(s);
    int32_t * rows = calloc((size_t) h.n_layer + 1, sizeof(int32_t));
    if (!rows) {
        return rm_fail(RM_E_OOM, "rm_session_state_size: out of memory");
    }
    for (int il = 0; il < h.n_layer; il++) {
        rows[il] = rm_attention_kv_place(s, il).rows;
    }
    *bytes = state_bytes_of(s, &h, rows);
    free(rows);
    return RM_OK;
}

rm_status rm_session_state_save(const rm_session * s, void * buf, uint64_t cap) {
    uint64_t need;
    const rm_status st = rm_session_state_size(s, &need);
    if (st != RM_OK) {
        return st;
    }
    if (!buf || cap < need) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_state_save: %llu bytes of room for a state of %llu",
                       (unsigned long long) cap, (unsigned long long) need);
    }
    const state_head h = state_head_of(s);
    uint8_t * at = buf;
    memcpy(at, &h, sizeof(h));
    at += sizeof(h);
    for (int il = 0; il < h.n_layer; il++) {
        const rm_kv_place p = rm_attention_kv_place(s, il);
        const int32_t rr[2] = {p.rows, p.ring};
        memcpy(at, rr, sizeof(rr));
        at += sizeof(rr);
    }
    for (int il = 0; il < h.n_layer; il++) {
        const rm_kv_place p = rm_attention_kv_place(s, il);
        const uint64_t n = (uint64_t) (h.n_past < p.rows ? h.n_past : p.rows);
        if (n == 0) {
            continue;
        }
        s->be->ops->download(s->be, at, (const uint8_t *) s->k_cache + p.k_off, n * p.k_row);
        at += n * p.k_row;
        if (h.v_row_bytes) {
            s->be->ops->download(s->be, at, (const uint8_t *) s->v_cache + p.v_off, n * p.v_row);
            at += n * p.v_row;
        }
        if (rm_qsa_key_bytes(s, il)) {   /* QSA's indexer keys */
            s->be->ops->download(s->be, at, rm_qsa_keys_of(s, il), n * rm_qsa_key_bytes(s, il));
            at += n * rm_qsa_key_bytes(s, il);
        }
    }
    if (s->hy) {
        s->be->ops->download(s->be, at, s->hy->conv_state, h.conv_bytes);
        s->be->ops->download(s->be, at + h.conv_bytes, s->hy->ssm_state, h.ssm_bytes);
        at += h.conv_bytes + h.ssm_bytes;
    }
    at = rm_dsv4_state_save(s, at);   /* DeepSeek-V4's compressors */
    if (h.thr_bytes) {
        memcpy(at, s->policy.threshold, h.thr_bytes);
    }
    const rm_status bs = s->be->ops->status(s->be);
    return bs != RM_OK ? rm_fail(bs, "rm_session_state_save: reading the cache from the device failed") : RM_OK;
}

rm_status rm_session_state_load(rm_session * s, const void * buf, uint64_t size) {
    rm_clear_error();
    if (!s || !buf) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_state_load: NULL argument");
    }
    state_head h;
    if (size < sizeof(h)) {
        return rm_fail(RM_E_FORMAT, "rm_session_state_load: %llu bytes, fewer than a state's header",
                       (unsigned long long) size);
    }
    memcpy(&h, buf, sizeof(h));
    if (h.magic != STATE_MAGIC || h.version != STATE_VERSION) {
        return rm_fail(RM_E_FORMAT, "rm_session_state_load: not a session state of this version (magic %08x, version %u)",
                       h.magic, h.version);
    }
    const state_head mine = state_head_of(s);
    if (h.n_layer != mine.n_layer || h.k_row_bytes != mine.k_row_bytes || h.v_row_bytes != mine.v_row_bytes ||
        h.conv_bytes != mine.conv_bytes || h.ssm_bytes != mine.ssm_bytes) {
        return rm_fail(RM_E_STATE, "rm_session_state_load: the state's layout (%d layers, K/V rows of %llu/%llu bytes, "
                       "recurrent states of %llu + %llu bytes) is not this session's (%d, %llu/%llu, %llu + %llu): "
                       "another model", h.n_layer, (unsigned long long) h.k_row_bytes,
                       (unsigned long long) h.v_row_bytes, (unsigned long long) h.conv_bytes,
                       (unsigned long long) h.ssm_bytes, mine.n_layer, (unsigned long long) mine.k_row_bytes,
                       (unsigned long long) mine.v_row_bytes, (unsigned long long) mine.conv_bytes,
                       (unsigned long long) mine.ssm_bytes);
    }
    if (h.type_k != s->type_k || h.type_v != s->type_v) {
        return rm_fail(RM_E_STATE, "rm_session_state_load: the state's cache types (%s, %s) are not this session's "
                       "(%s, %s)", state_type_name(h.type_k), state_type_name(h.type_v), state_type_name(s->type_k),
                       state_type_name(s->type_v));
    }
    if ((h.thr_bytes != 0) != (s->policy.threshold != NULL) ||
        (h.thr_bytes && h.thr_bytes != sizeof(float) * (uint64_t) (h.n_past + 1) * (uint64_t) h.n_layer)) {
        return rm_fail(RM_E_STATE, "rm_session_state_load: the state was saved %s a residual sidecar, and this "
                       "session runs %s one", h.thr_bytes ? "with" : "without", s->policy.threshold ? "with" : "without");
    }
    if (h.n_past < 0 || h.n_past > s->n_ctx) {
        return rm_fail(RM_E_STATE, "rm_session_state_load: the state holds %d positions, the session's context %d",
                       h.n_past, s->n_ctx);
    }
    const size_t table = (size_t) h.n_layer * 2 * sizeof(int32_t);
    if (size < sizeof(h) + table) {
        return rm_fail(RM_E_FORMAT, "rm_session_state_load: %llu bytes, fewer than a state's layer table",
                       (unsigned long long) size);
    }
    int32_t * saved = malloc(table);
    int32_t * rows = calloc(1, table);
    if (!saved || !rows) {
        free(saved);
        free(rows);
        return rm_fail(RM_E_OOM, "rm_session_state_load: out of memory");
    }
    memcpy(saved, (const uint8_t *) buf + sizeof(h), table);
    rm_status st = RM_OK;
    for (int il = 0; il < h.n_layer && st == RM_OK; il++) {
        const rm_kv_place p = rm_attention_kv_place(s, il);
        const int32_t ring = p.ring;
        rows[il] = p.rows;
        rows[h.n_layer + il] = saved[2 * il];   /* the saved layer's rows, for the byte count */
        const int32_t s_rows = saved[2 * il], s_ring = saved[2 * il + 1];
        const int wraps = h.n_past > s_rows || h.n_past > rows[il];
        if ((s_rows == 0) != (rows[il] == 0) || (wraps && (s_ring != ring || s_rows != rows[il]))) {
            st = rm_fail(RM_E_STATE, "rm_session_state_load: layer %d keeps %d rows (ring %d) in the state and %d (ring "
                         "%d) here, and %d positions do not lie alike in both: load it into a session of the same "
                         "n_ctx and n_batch", il, s_rows, s_ring, rows[il], ring, h.n_past);
        }
    }
    if (st == RM_OK && state_bytes_of(s, &h, rows + h.n_layer) != size) {
        st = rm_fail(RM_E_FORMAT, "rm_session_state_load: %llu bytes, and its header says %llu",
                     (unsigned long long) size, (unsigned long long) state_bytes_of(s, &h, rows + h.n_layer));
    }
    if (st == RM_OK) {
        const uint8_t * at = (const uint8_t *) buf + sizeof(h) + table;
        for (int il = 0; il < h.n_layer; il++) {
            const rm_kv_place p = rm_attention_kv_place(s, il);
            const uint64_t n = (uint64_t) (h.n_past < saved[2 * il] ? h.n_past : saved[2 * il]);
            if (n == 0) {
                continue;
            }
            s->be->ops->upload(s->be, (uint8_t *) s->k_cache + p.k_off, at, n * p.k_row);
            at += n * p.k_row;
            if (h.v_row_bytes) {
                s->be->ops->upload(s->be, (uint8_t *) s->v_cache + p.v_off, at, n * p.v_row);
                at += n * p.v_row;
            }
            if (rm_qsa_key_bytes(s, il)) {
                s->be->ops->upload(s->be, rm_qsa_keys_of(s, il), at, n * rm_qsa_key_bytes(s, il));
                at += n * rm_qsa_key_bytes(s, il);
            }
        }
        if (s->hy) {
            rm_hybrid_reset(s->hy, s->m);   /* the checkpoints belong to the tokens before */
            s->be->ops->upload(s->be, s->hy->conv_state, at, h.conv_bytes);
            s->be->ops->upload(s->be, s->hy->ssm_state, at + h.conv_bytes, h.ssm_bytes);
            at += h.conv_bytes + h.ssm_bytes;
        }
        at = rm_dsv4_state_load(s, at, h.n_past);
        if (h.thr_bytes) {
            memcpy(s->policy.threshold, at, h.thr_bytes);
        }
        s->n_past = h.n_past;
        const rm_status bs = s->be->ops->status(s->be);
        if (bs != RM_OK) {
            s->n_past = 0;
            st = rm_fail(bs, "rm_session_state_load: writing the cache to the device failed");
        }
    }
    free(saved);
    free(rows);
    return st;
}

rm_status rm_session_truncate(rm_session * s, int32_t n_keep) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_truncate: NULL session");
    }
    if (n_keep < 0 || n_keep > s->n_past) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_truncate: n_keep %d outside [0, %d] (the positions in the cache)",
                       n_keep, s->n_past);
    }
    if (n_keep == s->n_past) {
        return RM_OK;
    }
    if (n_keep == 0) {
        return rm_session_reset(s);
    }
    if (s->hy) {
        if (rm_hybrid_rewind(s->hy, s->m, n_keep, 0) != n_keep) {
            return rm_fail(RM_E_STATE, "rm_session_truncate: %s: the recurrent state of the linear layers describes all "
                           "%d positions, and no checkpoint was taken at %d (rm_session_reusable: %d)", s->m->arch->name,
                           s->n_past, n_keep, rm_session_reusable(s, n_keep));
        }
        rm_hybrid_rewind(s->hy, s->m, n_keep, 1);
        s->n_past = n_keep;
        return RM_OK;
    }
    int il;
    int32_t ring;
    if (!rings_keep(s, n_keep, &il, &ring)) {
        return rm_fail(RM_E_STATE, "rm_session_truncate: layer %d's sliding window ring of %d positions cannot go back "
                       "from %d to %d", il, ring, s->n_past, n_keep);
    }
    if (!rm_dsv4_keeps(s, n_keep, &il)) {
        return rm_fail(RM_E_STATE, "rm_session_truncate: layer %d's compressor keeps the rows of its last windows only, "
                       "and cannot go back from %d to %d", il, s->n_past, n_keep);
    }
    s->n_past = n_keep;
    return RM_OK;
}

static void embed(rm_session * s, const int32_t * tokens, int32_t n) {
    const rm_weight * w = &s->m->tok_embd;
    const rm_type_traits * tt = rm_type_traits_get(w->type);
    for (int32_t i = 0; i < n; i++) {
        tt->to_float(w->data + (uint64_t) tokens[i] * w->row_bytes, s->embd + (int64_t) i * w->ne[0], w->ne[0]);
    }
    if (s->m->arch->flags & RM_ARCH_EMBD_SCALE) {   /* Gemma: times sqrt(n_embd), in float as transformers */
        const float f = sqrtf((float) w->ne[0]);
        for (int64_t j = 0; j < (int64_t) n * w->ne[0]; j++) s->embd[j] *= f;
    }
    s->be->ops->upload(s->be, s->x, s->embd, sizeof(float) * (uint64_t) n * (uint64_t) w->ne[0]);
}

/* The logits of n_rows rows of the normalised output into out: rows[0 .. n_rows) (ascending;
 * gathered first), or with rows NULL the range from row first, read in place. */
static void logits_out(rm_session * s, int32_t first, const int32_t * rows, int32_t n_rows, float * out) {
    const rm_model * m = s->m;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    const float * src = s->xn + (int64_t) first * E;
    if (rows) {
        s->be->ops->gather_rows(s->be, s->ex, s->xn, rows, n_rows, E);
        src = s->ex;
    }
    const int32_t chunk = s->n_batch < RM_LOGIT_ROWS ? s->n_batch : RM_LOGIT_ROWS;
    for (int32_t i = 0; i < n_rows; i += chunk) {
        const int32_t c = n_rows - i < chunk ? n_rows - i : chunk;
        matmul(s, &m->output, src + (int64_t) i * E, E, c, s->logits, V, 0);
        s->be->ops->download(s->be, out + (int64_t) i * V, s->logits, sizeof(float) * (uint64_t) c * (uint64_t) V);
    }
    const float cap = m->hp.final_softcap;
    if (cap > 0.0f) {   /* Gemma's soft cap, on the host copy */
        for (int64_t j = 0; j < (int64_t) n_rows * V; j++) out[j] = cap * tanhf(out[j] / cap);
    }
}

void rm_session_forward(rm_session * s, const rm_seq_run * runs, int32_t n_runs, const int32_t * tokens, int32_t n,
                        const int32_t * out_rows, int32_t n_out, float * out) {
    const rm_model * m = s->m;
    const int64_t E = m->hp.n_embd;
    s->runs = runs, s->n_runs = n_runs;
    s->xc_status = RM_OK;
    rm_prof_begin(s, n);
    const int hyper = (m->arch->flags & RM_ARCH_HYPER) != 0, mhc = (m->arch->flags & RM_ARCH_MHC) != 0;
    const int64_t n_mix = (int64_t) (2 + m->hp.hc_count) * m->hp.hc_count;   /* a block's mHC weights */
    s->tokens = tokens;
    embed(s, tokens, n);
    if (hyper || mhc) rm_hc_begin(s, n);   /* the streams start as copies of the embeddings */
    if (s->ple) rm_ple_begin(s, tokens);
    rm_prof_mark(s, RM_PROF_EMBED);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const double t0 = s->xv ? rm_now_us() : 0.0;
        if (s->xv) s->xc_res_us[il] = 0.0f;
        const rm_layer * L = &m->layers[il];
        if (L->kind & RM_LAYER_PLE) rm_ple_block(s, il, n);   /* into the streams, before their mix */
        /* each block between its streams' mix in and its output's way back into them */
        if (hyper) rm_hc_mix_in(s, &L->hc_attn, n);
        if (mhc) rm_mhc_mix_in(s, &L->mhc_attn, &L->attn_norm, n_mix, n);
        if (mhc) {
            rm_dsv4_block(s, il, n);
        } else if (L->kind & RM_LAYER_ATTN_MLA) {
            rm_mla_block(s, il, n);
        } else if (L->kind & RM_LAYER_ATTN_LINEAR) {
            rm_deltanet_block(s, il, n);
        } else {
            rm_attention_block(s, il, n);
        }
        if (hyper) {
            rm_hc_add_out(s, n);
            rm_hc_mix_in(s, &L->hc_ffn, n);
        }
        if (mhc) {
            rm_mhc_add_out(s, n);
            rm_mhc_mix_in(s, &L->mhc_ffn, &L->ffn_norm, n_mix, n);
        }
        rm_moe_block(s, il, n);
        if (hyper) rm_hc_add_out(s, n);
        if (mhc) rm_mhc_add_out(s, n);
        if (s->xv) s->xc_layer_us[il] = (float) (rm_now_us() - t0) - s->xc_res_us[il];
    }
    if (out && n_out > 0) {
        if (hyper) {
            rm_hc_mix_in(s, &m->hc_head, n);   /* the output's mixer is its norm */
        } else if (mhc) {
            rm_mhc_mix_in(s, &m->mhc_head, &m->output_norm, m->hp.hc_count, n);
        } else {
            s->be->ops->rmsnorm(s->be, s->xn, s->x, &m->output_norm, n, E, m->hp.rms_eps);
        }
        logits_out(s, n - n_out, out_rows, n_out, out);
        rm_prof_mark(s, RM_PROF_OUTPUT);
    }
    for (int32_t r = 0; r < n_runs; r++) {
        runs[r].s->n_past += runs[r].n;
    }
    s->runs = NULL, s->n_runs = 0;
    s->tokens = NULL;
}

/* Runs n <= n_batch tokens of s alone; the logits of rows [first_out, n) go to out. */
static void forward(rm_session * s, const int32_t * tokens, int32_t n, int32_t first_out, float * out) {
    const rm_seq_run run = {s, 0, n, s->n_past};
    rm_session_forward(s, &run, 1, tokens, n, NULL, out && first_out < n ? n - first_out : 0, out);
}

rm_status rm_session_eval(rm_session * s, const int32_t * tokens, int32_t n, int32_t all_logits,
                          float * logits, uint64_t logits_cap) {
    rm_clear_error();
    if (!s || (!tokens && n > 0)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: NULL argument");
    }
    const rm_hparams * hp = &s->m->hp;
    if (n <= 0) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: no tokens to evaluate (n = %d)", n);
    }
    if ((int64_t) s->n_past + n > s->n_ctx) {
        return rm_fail(RM_E_CONTEXT_FULL, "rm_session_eval: %d tokens after %d in the cache exceed the context of %d",
                       n, s->n_past, s->n_ctx);
    }
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: token %d at index %d is outside the vocabulary [0, %d)",
                           tokens[i], i, hp->n_vocab);
        }
    }
    const uint64_t need = (uint64_t) hp->n_vocab * (all_logits ? (uint64_t) n : 1);
    if (logits && logits_cap < need) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: logits buffer holds %llu floats, %llu needed",
                       (unsigned long long) logits_cap, (unsigned long long) need);
    }
    rm_status st = s->be->ops->status(s->be);
    if (st != RM_OK) {
        return rm_fail(st, "rm_session_eval: the %s backend failed earlier and cannot continue: %s", s->be->ops->name,
                       rm_last_error());
    }
    pthread_mutex_lock(&s->m->lock);
    for (int32_t done = 0; done < n;) {
        const int32_t nb = n - done < s->n_batch ? n - done : s->n_batch;
        const int last = done + nb == n;
        float * dst = NULL;             /* where the logits of row first_out go */
        int32_t first_out = nb;
        if (logits && all_logits) {
            dst = logits + (uint64_t) done * hp->n_vocab;
            first_out = 0;
        } else if (logits && last) {
            dst = logits;
            first_out = nb - 1;
        }
        const int32_t n_past0 = s->n_past;
        forward(s, tokens + done, nb, first_out, dst);
        if ((st = s->be->ops->status(s->be)) != RM_OK || (st = s->xc_status) != RM_OK) {   /* xc_status: a failed read */
            s->n_past = n_past0;
            if (st == s->xc_status && s->hy) {   /* the recurrent states ran on: they hold no prefix any more */
                rm_hybrid_reset(s->hy, s->m);
                s->n_past = 0;
            }
            break;
        }
        s->be->stats.n_tokens += (uint64_t) nb;
        if (nb == 1) {
            rm_policy_after_token(s);
        }
        done += nb;
    }
    pthread_mutex_unlock(&s->m->lock);
    if (st != RM_OK) {
        return rm_fail(st, "rm_session_eval: %s", rm_last_error());
    }
    return RM_OK;
}
