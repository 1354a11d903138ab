/* hyper.h - internal: hyper-connections (qwen4exp, RM_ARCH_HYPER), the residual kept as hc_count
 * streams of n_embd per token in place of one stream and the blocks' norms.
 *
 * Before a block, rm_hc_mix_in mixes the streams into the block's input (s->xn) and clears s->x,
 * so that the block, which adds its output to s->x, leaves its output alone there; rm_hc_add_out
 * then adds that output to every stream with the stream's own weight. */
#ifndef RM_HYPER_H
#define RM_HYPER_H

#include "session.h"

/* The streams of the step's n rows start as copies of the embeddings in s->x. */
void rm_hc_begin(rm_session * s, int32_t n);
/* s->xn = the streams mixed by w; with w->inject, the streams' weights for rm_hc_add_out; s->x = 0. */
void rm_hc_mix_in(rm_session * s, const rm_hc * w, int32_t n);
/* The step's streams: rows of hc_count * n_embd (PLE adds to them: ple.h). */
float * rm_hc_streams(const rm_session * s);
/* The block's output in s->x into the streams, by the weights of the last rm_hc_mix_in. */
void rm_hc_add_out(rm_session * s, int32_t n);

#endif
