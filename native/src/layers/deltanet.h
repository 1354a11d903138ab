/* deltanet.h - internal: the Qwen3.5/Qwen3-Next hybrid layers: Gated DeltaNet (linear attention
 * with a recurrent state) and the sigmoid output gate of their full-attention layers.
 *
 * A session of a hybrid model holds, beside its KV cache, each linear layer's conv state (the
 * last d_conv - 1 inputs of its convolution) and delta-rule state (per value head, the d_state x
 * head_v state at its chunk's start and the chunk's rows so far). Together with the KV cache they are the whole context: a cache entry alone no longer
 * describes it, so anything that reuses or rewinds a context must snapshot these states too.
 * The states live on the session's backend, where the layer runs. */
#ifndef RM_DELTANET_H
#define RM_DELTANET_H

#include "session.h"

typedef struct rm_hybrid {
    rm_backend * be;              /* the session's: every buffer below is its memory */
    int32_t * lin_index;          /* n_layer: the layer's index among the linear layers, or -1 */
    int32_t * kv_index;           /* n_layer: the layer's index among the attention layers (its KV cache), or -1 */
    float *   conv_state;         /* per linear layer: d_conv - 1 rows of conv_dim */
    float *   ssm_state;          /* per linear layer and value head: rm_gdn_state_floats (the state at
                                   * the chunk's start and the unfinished chunk's rows) */
    float *   mixed;              /* n_batch rows of conv_dim: the q/k/v projection */
    float *   conv_out;           /* n_batch rows of conv_dim: after the convolution */
    float *   z;                  /* n_batch rows of d_inner: the output gate */
    float *   ba;                 /* n_batch rows of 2*n_v: b and a as projected */
    float *   g, * beta;          /* n_batch rows of n_v: log-decay and write strength */
    float *   core;               /* n_batch rows of d_inner: the delta rule's output */
    float *   conv_w;             /* conv_dim rows of d_conv: the layer's filters as floats */
    float *   chunk;              /* n_v chunk scratches (rm_gdn_chunk_scratch) */
    float *   qg;                 /* n_batch rows of 2*n_head*head_dim: q and gate, per head */
    float *   gate;               /* n_batch rows of n_head*head_dim */

    /* the conv and delta-rule states as they were at positions ckpt_pos (-1: an empty slot), each
     * a copy of both (allocated at the first checkpoint); the delta rule's chunks are aligned to
     * positions, so a state restored at p continues exactly as the sequence evaluated at once */
    float *   ckpt[RM_HYBRID_CHECKPOINTS];
    int32_t   ckpt_pos[RM_HYBRID_CHECKPOINTS];
} rm_hybrid;

/* The session's hybrid state, zeroed, in be's memory; *out = NULL for a model without hybrid layers. */
rm_status rm_hybrid_new(const rm_model * m, rm_backend * be, int32_t n_batch, rm_hybrid ** out);
void      rm_hybrid_free(rm_hybrid * h);
void      rm_hybrid_reset(rm_hybrid * h, const rm_model * m);   /* states zeroed, checkpoints dropped */

/* The bytes of the conv and the delta-rule states (a checkpoint holds both, in that order). */
void      rm_hybrid_state_bytes(const rm_model * m, uint64_t * conv, uint64_t * ssm);

/* Keeps a copy of the states as they are now, at cache position pos (replacing one at pos, else
 * taking an empty slot, else the one in the densest place but the earliest: checkpoint_slot).
 * RM_E_OOM when its memory cannot be had (the states are unchanged). */
rm_status rm_hybrid_checkpoint(rm_hybrid * h, const rm_model * m, int32_t pos);

/* The latest checkpointed position <= n (-1: none); with restore, the states are set back to it
 * and the checkpoints after it dropped. */
int32_t   rm_hybrid_rewind(rm_hybrid * h, const rm_model * m, int32_t n, int restore);

/* x += the Gated DeltaNet of layer il over the n tokens of s->x, the step's sequences (s->runs)
 * each on its own session's conv and delta-rule states. The projections, gates, norms and the
 * output projection run over all n rows at once; the convolution and the delta rule per run, at
 * the run's positions. */
void rm_deltanet_block(rm_session * s, int il, int32_t n);

/* Gated attention: the q projection's rows (n rows of n_head heads of [q, gate]) into s->q and
 * h->gate; after attention, attn *= sigmoid(gate). */
void rm_attn_gate_split(rm_session * s, int32_t n);
void rm_attn_gate_apply(rm_session * s, int32_t n);

#endif
