/* attention.h - internal: the plain attention layer (full, sliding-window, with sinks, gated), the
 * layer kind of most families; multi-head latent attention is mla.h's, Gated DeltaNet deltanet.h's. */
#ifndef RM_ATTENTION_H
#define RM_ATTENTION_H

#include "session.h"

/* x += Wo attn(x) for layer il over the n rows of the step's sequences (s->runs), each over its
 * own session's KV cache. */
void rm_attention_block(rm_session * s, int il, int32_t n);

/* Layer il's first row in session s's KV cache, and its ring: a sliding-window layer keeps only
 * the last rm_kv_ring_rows positions, position p in row p % ring; other layers keep n_ctx (ring
 * 0). The same layout as sizes.c's byte count. */
int64_t rm_attention_kv_place(const rm_session * s, int il, int32_t * ring);

#endif
