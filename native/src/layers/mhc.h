/* mhc.h - internal: DeepSeek-V4's manifold-constrained hyper-connections (RM_LAYER_MHC), the
 * residual kept as hc_count streams of n_embd per token.
 *
 * Before a block, rm_mhc_mix_in weighs the streams into one row, which the block's norm turns into
 * its input (s->xn), and clears s->x, so that the block, which adds its output to s->x, leaves its
 * output alone there; rm_mhc_add_out then puts that output into every stream with the stream's own
 * weight and mixes the streams by the block's matrix. The output head mixes them once more, with
 * weights alone, before output_norm. */
#ifndef RM_MHC_H
#define RM_MHC_H

#include "session.h"

/* The streams lie first in s->hc, as hyper.h's: rm_hc_begin starts them as copies of the embeddings. */
/* s->xn = norm(the streams weighed by w), s->x = 0; n_mix: a block's (2 + hc) * hc or the head's hc. */
void rm_mhc_mix_in(rm_session * s, const rm_mhc * w, const rm_weight * norm, int64_t n_mix, int32_t n);
/* The block's output in s->x into the streams, by the weights of the last rm_mhc_mix_in (a block's). */
void rm_mhc_add_out(rm_session * s, int32_t n);

#endif
