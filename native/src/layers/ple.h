/* ple.h - internal: PLE (qwen4exp's per-layer n-gram embeddings, transformers' Qwen4ExpTextPLELayer),
 * added to the hyper-connections' streams before the token mixer of the layers ple.layers lists.
 *
 * Per token, with X its hc streams (rows of n_embd) and e the concatenated rows of the n-gram table
 * its hashed n-grams pick (rm_ple_block has the hash):
 *   key = rmsnorm_c(W_k e) * norm_key_c,  value = W_v e,  query = rmsnorm_c(X_c) * norm_query_c
 *   gated_c = sigmoid(sign(g) sqrt(max(|g|, 1e-6))) value,  g = key_c . query_c / sqrt(n_embd)
 *   X += gated + silu(conv(rmsnorm_c(gated) * norm_conv_c))
 * the conv causal and depthwise over each stream's channels, dilated by ple_ngram. A session's PLE
 * state is its last ple_ngram - 1 tokens (the n-grams reach back across steps, cut at an eos) and
 * each PLE layer's conv state, both kept in its hybrid conv state (sizes.h: rm_ple_state_at), so
 * that they are saved, restored, checkpointed and reset with the DeltaNet's. */
#ifndef RM_PLE_H
#define RM_PLE_H

#include "session.h"

typedef struct rm_ple {
    float *   emb;                /* backend: n_batch rows of ple_embd: the n-gram rows */
    float *   key, * query;       /* backend: n_batch rows of hc_count * n_embd */
    float *   gated, * normed;    /* backend: n_batch rows of hc_count * n_embd */
    float *   value;              /* backend: n_batch rows of n_embd */
    float *   emb_host;           /* host: n_batch rows of ple_embd */
    int32_t * ctx;                /* host: n_batch rows of ple_ngram: each token, then its predecessors (eos
                                     from the first eos or the start on) */
} rm_ple;

/* s->ple for a model with PLE layers (else left NULL), after the hybrid state; 0 when out of memory
 * or the backend runs no PLE (error set). */
int  rm_ple_new(rm_session * s);
void rm_ple_free(rm_session * s);

/* Before the step's layers: each token's n-gram context from its run's tokens and its session's
 * last tokens, which then move on by the run's tokens. */
void rm_ple_begin(rm_session * s, const int32_t * tokens);

/* The streams += PLE of layer il over the step's n rows, each run on its own session's conv state. */
void rm_ple_block(rm_session * s, int il, int32_t n);

#endif
