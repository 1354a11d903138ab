/* ple.c - PLE (ple.h) composed of backend ops: the n-gram hash and the table's rows on the host (as
 * the token embedding is), the projections, norms, gate and conv on the backend. */
#include "ple.h"

#include <stdlib.h>
#include <string.h>

#include "deltanet.h"
#include "hyper.h"
#include "status.h"
#include "types.h"

#define RM_PLE_MAX_RUNS 64   /* the conv's sequences per call */

int rm_ple_new(rm_session * s) {
    const rm_hparams * hp = &s->m->hp;
    if (hp->n_ple == 0) {
        return 1;
    }
    if (!s->be->ops->ple_gate || !s->be->ops->ple_conv || !s->hy) {
        rm_fail(RM_E_NEEDS_CPU, "rm_session_new: PLE n-gram embeddings (ple.layers) run on the CPU backend only, and "
                "this session's backend is %s", s->be->ops->name);
        return 0;
    }
    rm_ple * p = calloc(1, sizeof(*p));
    if (!p) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory");
        return 0;
    }
    s->ple = p;
    rm_backend * be = s->be;
    const uint64_t B = (uint64_t) s->n_batch, E = (uint64_t) hp->n_embd, W = (uint64_t) hp->hc_count * E;
    const uint64_t PE = (uint64_t) hp->n_ple_head * (uint64_t) hp->n_embd_per_layer, f = sizeof(float);
    p->emb = be->ops->alloc(be, f * B * PE);
    p->key = be->ops->alloc(be, f * B * W);
    p->query = be->ops->alloc(be, f * B * W);
    p->gated = be->ops->alloc(be, f * B * W);
    p->normed = be->ops->alloc(be, f * B * W);
    p->value = be->ops->alloc(be, f * B * E);
    p->emb_host = malloc(f * B * PE);
    p->ctx = malloc(sizeof(int32_t) * B * (uint64_t) hp->ple_ngram);
    if (!p->emb || !p->key || !p->query || !p->gated || !p->normed || !p->value || !p->emb_host || !p->ctx) {
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for PLE's scratch");
        return 0;
    }
    return 1;
}

void rm_ple_free(rm_session * s) {
    rm_ple * p = s->ple;
    if (!p) {
        return;
    }
    void * const dev[] = {p->emb, p->key, p->query, p->gated, p->normed, p->value};
    rm_release_each(s->be, dev, sizeof(dev) / sizeof(dev[0]));
    free(p->emb_host);
    free(p->ctx);
    free(p);
    s->ple = NULL;
}

/* Where session o's PLE state of PLE layer i starts (i = n_ple: its tokens). */
static float * state_of(const rm_session * o, int32_t i) {
    const rm_size_params p = rm_size_params_of(&o->m->hp, 1, 1, 0);
    return o->hy->conv_state + rm_ple_state_at(&p, i);
}

void rm_ple_begin(rm_session * s, const int32_t * tokens) {
    const rm_hparams * hp = &s->m->hp;
    const int32_t G = hp->ple_ngram, P = G - 1, eos = hp->ple_eos;
    for (int32_t r = 0; r < s->n_runs; r++) {
        const rm_seq_run * run = &s->runs[r];
        int32_t past[RM_PLE_MAX_NGRAM];   /* its last P tokens + 1, oldest first; 0: none */
        float * at = state_of(run->s, hp->n_ple);
        s->be->ops->download(s->be, past, at, sizeof(int32_t) * (uint64_t) P);
        const int32_t * tok = tokens + run->row0;
        for (int32_t i = 0; i < run->n; i++) {
            int32_t * c = s->ple->ctx + (int64_t) (run->row0 + i) * G;
            c[0] = tok[i];
            int cut = 0;
            for (int32_t k = 1; k < G; k++) {   /* k back: in the run, or among the session's last tokens */
                const int32_t t = i - k >= 0 ? tok[i - k] : past[P + i - k] - 1;
                cut = cut || t < 0 || t == eos;
                c[k] = cut ? eos : t;
            }
        }
        int32_t next[RM_PLE_MAX_NGRAM];
        for (int32_t j = 0; j < P; j++) {   /* position run->n - P + j of the run */
            const int32_t q = run->n - P + j;
            next[j] = q >= 0 ? tok[q] + 1 : past[j + run->n];
        }
        s->be->ops->upload(s->be, at, next, sizeof(int32_t) * (uint64_t) P);
    }
}

/* The step's n-gram rows of PLE layer i into emb_host: for n-gram n (2 .. G) of a token and its
 * predecessors c_0 .. c_{n-1}, mixed = xor_j c_j * mult_j (64-bit), and its heads' rows
 * mixed % vocab_h + offset_h (transformers' Qwen4ExpTextNGramEmbedding). */
static void gather_rows(rm_session * s, int32_t i, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const int32_t G = hp->ple_ngram, H = hp->n_ple_head, HD = hp->n_embd_per_layer;
    const rm_type_traits * tt = rm_type_traits_get(m->ple_embd.type);
    uint64_t mult[RM_PLE_MAX_NGRAM];
    memcpy(mult, hp->ple_mult + 8 * (size_t) i * G, sizeof(uint64_t) * (size_t) G);
    for (int32_t t = 0; t < n; t++) {
        const int32_t * c = s->ple->ctx + (int64_t) t * G;
        uint64_t mixed = (uint64_t) c[0] * mult[0];
        for (int32_t g = 2; g <= G; g++) {
            mixed ^= (uint64_t) c[g - 1] * mult[g - 1];
            for (int32_t k = 0; k < hp->ple_heads_per_ngram; k++) {
                const int32_t h = (g - 2) * hp->ple_heads_per_ngram + k;
                uint64_t off, vocab;
                memcpy(&off, hp->ple_head_off + 8 * ((size_t) i * H + h), sizeof(off));
                memcpy(&vocab, hp->ple_head_vocab + 8 * ((size_t) i * H + h), sizeof(vocab));
                const uint64_t row = mixed % vocab + off;
                tt->to_float(m->ple_embd.data + row * m->ple_embd.row_bytes,
                             s->ple->emb_host + ((int64_t) t * H + h) * HD, HD);
            }
        }
    }
}

void rm_ple_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    rm_ple * p = s->ple;
    const int64_t E = hp->n_embd, HC = hp->hc_count, W = HC * E, PE = (int64_t) hp->n_ple_head * hp->n_embd_per_layer;
    gather_rows(s, L->ple_index, n);
    be->ops->upload(be, p->emb, p->emb_host, sizeof(float) * (uint64_t) n * (uint64_t) PE);
    rm_matmul_args key = {&L->ple_key, 0, p->emb, PE, n, p->key, W, 0};
    rm_matmul_args value = {&L->ple_value, 0, p->emb, PE, n, p->value, E, 0};
    be->ops->matmul(be, &key);
    be->ops->matmul(be, &value);
    float * h = rm_hc_streams(s);
    be->ops->rmsnorm_groups(be, p->key, p->key, &L->ple_norm_key, (int64_t) n * HC, E, HC, hp->rms_eps);
    be->ops->rmsnorm_groups(be, p->query, h, &L->ple_norm_query, (int64_t) n * HC, E, HC, hp->rms_eps);
    be->ops->ple_gate(be, p->gated, p->key, p->query, p->value, n, HC, E);
    be->ops->rmsnorm_groups(be, p->normed, p->gated, &L->ple_norm_conv, (int64_t) n * HC, E, HC, hp->rms_eps);
    be->ops->add(be, h, p->gated, (int64_t) n * W);
    rm_ple_conv_seq seqs[RM_PLE_MAX_RUNS];
    for (int32_t r0 = 0; r0 < s->n_runs; r0 += RM_PLE_MAX_RUNS) {   /* the runs in groups of a fixed array */
        const int32_t nr = s->n_runs - r0 < RM_PLE_MAX_RUNS ? s->n_runs - r0 : RM_PLE_MAX_RUNS;
        for (int32_t r = 0; r < nr; r++) {
            const rm_seq_run * run = &s->runs[r0 + r];
            seqs[r] = (rm_ple_conv_seq){state_of(run->s, L->ple_index), run->row0, run->n};
        }
        const rm_ple_conv_args a = {&L->ple_conv1d, p->normed, h, seqs, nr, W, hp->ple_conv_kernel, hp->ple_ngram};
        be->ops->ple_conv(be, &a);
    }
}
