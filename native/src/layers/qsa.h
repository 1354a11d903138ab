/* qsa.h - internal: QSA sparse attention (qwen4exp's indexed layers): the hybrid's gated attention
 * restricted, for each token, to the key blocks its indexer picks and its tail (backend.h's
 * rm_qsa_args has the indexer's math).
 *
 * The indexer's raw keys are cached per position beside the KV cache (position p in row p of each
 * indexed layer's rows), so that a token decoded later scores the blocks as a prefill would. */
#ifndef RM_QSA_H
#define RM_QSA_H

#include "session.h"

/* Whether layer L picks its positions: a QSA layer whose blocks have a length. A length of 0 (what
 * llama.cpp's converter writes for transformers' indexed_attention layers) is dense attention, as
 * llama.cpp's graph reads it. */
static inline int rm_qsa_on(const rm_layer * L) { return (L->kind & RM_LAYER_QSA_INDEX) && L->qsa_ratio > 0.0f; }

typedef struct rm_qsa {
    float *   keys;               /* backend: per attention layer (rm_hybrid.kv_index), n_ctx rows of index_head_dim */
    float *   q;                  /* backend: n_batch rows of index_n_head * index_head_dim */
    float *   k;                  /* backend: n_batch rows of index_head_dim */
    void *    kg, * vg;           /* backend: one token's kept positions' K and V rows, `rows` of each */
    int32_t   rows;               /* the most positions a token keeps: top_k + the widest block - 1, at most n_ctx */
    int32_t   top_k_blocks;       /* the most blocks a token keeps (index_top_k / the narrowest block) */
    int32_t * sel;                /* host: n_batch rows of top_k_blocks */
    float *   host;               /* host: rm_qsa_host_floats */
} rm_qsa;

/* s->qsa for a model with QSA layers (else left NULL), after the hybrid state and the cache rows
 * are known; 0 when out of memory or the backend runs no QSA (error set). */
int  rm_qsa_new(rm_session * s);
void rm_qsa_free(rm_session * s);

/* Bytes of a position's cached indexer key in layer il (0: not a QSA layer). */
uint64_t rm_qsa_key_bytes(const rm_session * s, int il);
/* Where layer il's cached indexer keys start in s->qsa->keys (floats). */
float * rm_qsa_keys_of(const rm_session * s, int il);

/* The indexer's queries (normed) and raw keys of the step's n rows, from s->xn. */
void rm_qsa_project(rm_session * s, int il, int32_t n);

/* For one run of the step, whose attention would be aa (q, k and v RoPE'd, K and V cached): the
 * indexer's RoPE and key cache, its pick, and the attention op over each token's kept positions. */
void rm_qsa_attention(rm_session * s, int il, const rm_seq_run * run, const rm_attn_args * aa);

#endif
